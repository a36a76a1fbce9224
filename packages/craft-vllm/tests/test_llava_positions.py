"""LLaVA-OneVision's CRAFT positions, against craft-adapters' rule, without an engine.

craft-adapters gives each kept row its position in the UNCOMPRESSED sequence
(`attention_mask.cumsum(-1) - 1` before anything is dropped) and continues decoding from the
uncompressed length. Here the variant's own `get_mrope_input_positions` +
`recompute_mrope_positions` (the runner's two calls) must write exactly those positions into
row 0 (the only row its `mrope_section = [rotary / 2, 0, 0]` reads), in one prefill and in
chunks that start inside the video. The greedy-token tests (test_backbones.py) did not fail
when the kept rows were left at consecutive positions on the tiny model: this test does.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from craft_vllm.flat import index_columns, update_model_config
from craft_vllm.llava_onevision import (
    CraftLlavaOnevisionForConditionalGeneration as Model,
)

VIDEO, IMAGE, TEXT = 7, 8, 1
FRAMES, SIDE = 4, 4  # 112 / 14 = 8 patches, pooled to 4
BEFORE, AFTER = 5, 4


def _fake() -> SimpleNamespace:
    vision = SimpleNamespace(image_size=112, patch_size=14)
    config = SimpleNamespace(video_token_index=VIDEO, image_token_index=IMAGE, vision_config=vision)
    fake = SimpleNamespace(config=config)
    fake.craft_full_length = lambda f: Model.craft_full_length(fake, f)
    fake.craft_media_ids = lambda: Model.craft_media_ids(fake)
    fake.craft_columns = Model.craft_columns
    fake.craft_write_positions = lambda *a: Model.craft_write_positions(fake, *a)
    return fake


def _case(seed: int) -> tuple[list[int], torch.Tensor, torch.Tensor, SimpleNamespace]:
    """(prompt ids, kept index [K + 1] with the newline, expected row-0 positions, feature)."""
    n = FRAMES * SIDE * SIDE
    g = torch.Generator().manual_seed(seed)
    kept = torch.randperm(n, generator=g)[: n // 4].sort().values
    kept = torch.cat([kept, torch.tensor([n])])  # the newline row, last
    ids = [TEXT] * BEFORE + [VIDEO] * len(kept) + [TEXT] * AFTER
    # craft-adapters: positions of the FULL sequence, kept rows' picked out
    full = torch.arange(BEFORE + n + 1 + AFTER)
    seq = torch.cat([full[:BEFORE], BEFORE + kept, full[BEFORE + n + 1 :]])
    pixels = SimpleNamespace(data=torch.zeros(FRAMES, 3, 112, 112))
    feature = SimpleNamespace(
        modality="video",
        mm_position=SimpleNamespace(offset=BEFORE, length=len(kept)),
        data={"pixel_values_videos": pixels},
    )
    return ids, kept, seq, feature


def _rows(kept: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.randn(len(kept), 16), index_columns(kept, torch.float32)], dim=1)


def test_one_prefill_gives_craft_adapters_positions() -> None:
    ids, kept, expected, feature = _case(0)
    model = _fake()
    positions, _ = Model.get_mrope_input_positions(model, ids, [feature])
    rows = _rows(kept)
    embeds, new, delta = Model.recompute_mrope_positions(model, ids, [rows], positions, 0)
    assert torch.equal(new[0], expected)
    assert torch.equal(embeds[0], rows[:, :-2])  # index columns stripped
    # decoding continues from the uncompressed length
    assert len(ids) + delta == BEFORE + FRAMES * SIDE * SIDE + 1 + AFTER
    # idempotent: the runner may hand the same rows again
    again = Model.recompute_mrope_positions(model, ids, [rows], new, 0)[1]
    assert torch.equal(again, new)


def test_chunks_starting_inside_the_video() -> None:
    ids, kept, expected, feature = _case(1)
    model = _fake()
    positions, _ = Model.get_mrope_input_positions(model, ids, [feature])
    rows = _rows(kept)
    split = BEFORE + 6  # second chunk starts at the video's 7th placeholder
    first = Model.recompute_mrope_positions(model, ids, [rows[:6]], positions, 0)[1]
    second = Model.recompute_mrope_positions(model, ids, [rows[6:]], first, split)[1]
    assert torch.equal(second[0], expected)


def test_index_columns_exact_in_bfloat16() -> None:
    index = torch.tensor([0, 255, 256, 12543, 12544, 65535])
    cols = index_columns(index, torch.bfloat16).float().round().long()
    assert torch.equal(cols[:, 0] * 256 + cols[:, 1], index)


def test_config_becomes_row_zero_mrope() -> None:
    from transformers import Qwen2Config

    text = Qwen2Config(hidden_size=128, num_attention_heads=2, rope_theta=1e4)
    model_config = SimpleNamespace(hf_config=SimpleNamespace(get_text_config=lambda: text))
    update_model_config(model_config)
    assert text.rope_parameters["mrope_section"] == [32, 0, 0]  # head 64: 32 rotary pairs
    assert text.rope_parameters["rope_theta"] == 1e4
