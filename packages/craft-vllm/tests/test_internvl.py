"""InternVL's layout and positions against craft-adapters', without an engine. (Served at a
ratio: test_backbones.py, `internvl`; from payloads: test_precompressed.py, `internvl`.)

craft-adapters keeps, per frame, `Frame{i}: <img>` + the frame's kept tokens + `</img>`,
every token at its ORIGINAL position, and continues decoding from the uncompressed length.
The variant reserves the layout's length before the encoder runs and fills every slot
after it (`internvl.py`): `test_layout_and_positions_equal_craft_adapters` checks the slots'
ids, rows and row-0 positions against transformers' processor output with craft-adapters'
rule, in one prefill and in chunks.
"""

from __future__ import annotations

from types import SimpleNamespace

import engine
import pytest
import tiny_internvl as kind
import torch
from craft_vllm.internvl import CraftInternVLForConditionalGeneration as Model
from craft_vllm.internvl import _layout
from craft_vllm.positions import BASE

import craft_adapters

WIDTH = 8  # the fake embedding's width


def _fake() -> SimpleNamespace:
    """The members of the model `_layout_rows` and the position hooks read; the language
    model's embedding writes each token id in every column."""
    tokenizer = kind.processor().tokenizer
    fake = SimpleNamespace(
        craft_tokenizer=tokenizer,
        craft_video_id=tokenizer.convert_tokens_to_ids("<video>"),
        craft_side=4,
        config=SimpleNamespace(image_token_id=kind.config().image_token_id),
    )
    embed = SimpleNamespace(embed_input_ids=lambda ids: ids[:, None].float().expand(-1, WIDTH))
    fake.get_language_model = lambda: embed
    fake.craft_full_length = lambda f: Model.craft_full_length(fake, f)
    fake.craft_media_ids = lambda: Model.craft_media_ids(fake)
    fake.craft_columns = Model.craft_columns
    fake.craft_write_positions = lambda *a: Model.craft_write_positions(fake, *a)
    return fake


def _find(seq: list[int], part: list[int]) -> int:
    return next(i for i in range(len(seq)) if seq[i : i + len(part)] == part)


@pytest.mark.parametrize("cut", [None, 3, 30])
def test_layout_and_positions_equal_craft_adapters(cut: int | None) -> None:
    """`cut`: a prefill chunk ends `cut` slots into the video (None: one prefill)."""
    frames, fake = 3, _fake()
    n = frames * kind.PER_FRAME
    inputs = craft_adapters.build_inputs(
        kind.processor(), kind.video(frames, 0), engine.FPS, engine.QUESTION
    )
    hf = inputs["input_ids"][0]
    context = kind.config().image_token_id
    # vLLM's uncompressed layout is transformers' (frame tokens written as <video>)
    full = list(_layout(fake.craft_tokenizer, frames, kind.PER_FRAME))
    start = _find(hf.tolist(), full[:4])
    span = hf[start : start + len(full)].clone()
    span[span == context] = fake.craft_video_id
    assert span.tolist() == full
    # craft-adapters: the frame tokens at `kept` stay, every token at its original position
    kept = torch.randperm(n, generator=torch.Generator().manual_seed(0))[: n // 4].sort().values
    keep = torch.ones(hf.shape[0], dtype=torch.bool)
    frame_slots = (hf == context).nonzero(as_tuple=True)[0]
    keep[frame_slots] = False
    keep[frame_slots[kept]] = True
    want_ids, want_pos = hf[keep], torch.arange(hf.shape[0])[keep]
    # the variant: rows (row i = 1000 + kept[i]) -> the placeholder's slots and positions
    rows = (1000 + kept)[:, None].float().expand(-1, WIDTH)
    out = Model._layout_rows(fake, rows, kept, frames)
    length = out.shape[0]
    ids = [*hf[:start].tolist(), *[fake.craft_video_id] * length]
    ids += hf[start + len(full) :].tolist()
    assert len(ids) == int(keep.sum())
    expected = want_ids.float().clone()
    expected[want_ids == context] = (1000 + kept).float()
    feature = SimpleNamespace(
        modality="video",
        mm_position=SimpleNamespace(offset=start, length=length),
        data={"video_num_patches": SimpleNamespace(data=torch.tensor(frames))},
    )
    positions, _ = Model.get_mrope_input_positions(fake, ids, [feature])
    if cut is None:
        embeds, new, delta = Model.recompute_mrope_positions(fake, ids, [out], positions, 0)
    else:  # the runner hands each chunk its slice of the video's rows
        first = Model.recompute_mrope_positions(fake, ids, [out[:cut]], positions, 0)
        embeds, new, delta = Model.recompute_mrope_positions(
            fake, ids, [out[cut:]], first[1], start + cut
        )
        embeds = [torch.cat([first[0][0], embeds[0]])]
    assert torch.equal(embeds[0][:, 0], expected[start : start + length])
    assert torch.equal(new[0], want_pos)
    assert len(ids) + delta == hf.shape[0]  # decoding continues from the uncompressed length
    assert int(out[:, -2:].max()) < BASE  # both index columns exact
