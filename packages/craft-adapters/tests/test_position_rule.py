"""`wrap(positions="original")`: Qwen2.5-VL's positions as Qwen's own code lays them out.

transformers 5.x starts the text after a Qwen2.5-VL video at `start + max(h, w)`; Qwen's
original code (the rule its checkpoints were trained with, and vLLM's) at the video's largest
position + 1. The reference here is a plain loop over the token ids that re-states the
original rule (Qwen2-VL's `get_rope_index` before transformers 5: text at `st_idx =
previous max + 1`, a video's rows `(t * tokens_per_second * second_per_grid, row, col) +
st_idx`), with no use of `mm_token_type_ids` or transformers' code. Each check is made
through logits too: the model called with the reference positions by hand.
"""

from __future__ import annotations

import pytest
import torch
from adapters_testkit import KeepEvery, make_frames

import craft_adapters
from craft_adapters.backbones.qwen2_5_vl import text_after_media_at_max
from craft_adapters.tiny import build_tiny_vlm

FPS = 2.0
FRAMES = 12  # 6 temporal grid steps: temporal rows reach past the 4 x 4 merged grid


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, processor = build_tiny_vlm("qwen2_5_vl", tmp_path_factory.mktemp("q25"))
    with torch.no_grad():  # greedy steps of a random tiny model are near-ties: logits are compared
        model.lm_head.weight.mul_(8.0)
    return model, processor


def _inputs(processor, frames: int = FRAMES, question: str = "What moves?") -> dict:
    return craft_adapters.build_inputs(processor, make_frames(frames, seed=3), FPS, question)


def original_rule(model, inputs: dict) -> torch.Tensor:
    """`[3, 1, L]` positions by Qwen's original rule, from the token ids alone (one row)."""
    cfg = model.config
    ids = inputs["input_ids"][0].tolist()
    merge = cfg.vision_config.spatial_merge_size
    per_second = cfg.vision_config.tokens_per_second
    grids = inputs["video_grid_thw"].tolist()
    seconds = inputs["second_per_grid_ts"].tolist()
    columns: list[list[int]] = []  # one [t, h, w] per token
    i, video = 0, 0
    while i < len(ids):
        start = max(max(c) for c in columns) + 1 if columns else 0
        if ids[i] != cfg.video_token_id:
            columns.append([start] * 3)
            i += 1
            continue
        t, h, w = grids[video]
        h, w = h // merge, w // merge
        for ti in range(t):
            for hi in range(h):
                for wi in range(w):
                    step = int(ti * per_second * seconds[video])
                    columns.append([start + step, start + hi, start + wi])
        i += t * h * w
        video += 1
    return torch.tensor(columns).T.unsqueeze(1)


def _logits(model, inputs: dict, positions: torch.Tensor) -> torch.Tensor:
    return model(**_hf(inputs), position_ids=positions).logits


def test_original_rule_equals_the_plain_loop_and_differs_from_transformers(tiny) -> None:
    model, processor = tiny
    inputs = _inputs(processor)
    reference = original_rule(model, inputs)
    wrapped = craft_adapters.wrap(model, positions="original")
    positions, deltas = wrapped.adapter.full_positions(inputs)
    assert torch.equal(positions, reference)
    assert int(deltas) == int(reference.max()) + 1 - reference.shape[-1]
    library, _ = craft_adapters.wrap(model).adapter.full_positions(inputs)
    after = int((inputs["input_ids"][0] == model.config.video_token_id).nonzero().max()) + 1
    # the premise: transformers 5.x's text after the video starts earlier (a rule to choose)
    assert int(library[0, 0, after]) < int(reference[0, 0, after])


def test_no_compressor_logits_equal_the_model_at_the_original_positions(tiny) -> None:
    model, processor = tiny
    inputs = _inputs(processor)
    with torch.no_grad():
        wrapped = craft_adapters.wrap(model, positions="original")(**inputs).logits
        by_hand = _logits(model, inputs, original_rule(model, inputs))
        library = craft_adapters.wrap(model)(**inputs).logits
    assert torch.allclose(wrapped, by_hand, atol=1e-5, rtol=0)
    assert (wrapped - library).abs().max() > 1e-2  # the rule reaches the logits


def test_compressed_rows_keep_their_original_positions_and_text_follows(tiny) -> None:
    """Ratio 2 (every other row kept): the compressed run's positions are the reference's at
    the kept rows, and its logits the model's on the hand-sliced sequence."""
    model, processor = tiny
    inputs = _inputs(processor)
    wrapped = craft_adapters.wrap(model, KeepEvery(2), ratio=2, positions="original")
    with torch.no_grad():
        out = wrapped(**inputs).logits
    kept = wrapped.compressed_index(0)
    reference = original_rule(model, inputs)[:, :, kept]
    # by hand: the kept rows' features and positions, the rest of the sequence untouched
    with torch.no_grad():
        hand = _hand_compressed(model, inputs, kept, reference)
    assert torch.allclose(out, hand, atol=1e-5, rtol=0)


def _hand_compressed(model, inputs, kept, positions) -> torch.Tensor:
    """The language model on the kept sequence, the video rows merged by KeepEvery(2)."""
    video = model.model.get_video_features(
        inputs["pixel_values_videos"], inputs["video_grid_thw"], return_dict=True
    ).pooler_output[0]
    merged = KeepEvery(2)(video, torch.zeros(video.shape[0], 3, dtype=torch.long), ratio=2)
    ids = inputs["input_ids"][:, kept]
    embeds = model.get_input_embeddings()(ids)
    slots = (ids[0] == model.config.video_token_id).nonzero().squeeze(1)
    embeds[0, slots] = merged.features.to(embeds.dtype)
    return model.model.language_model(
        inputs_embeds=embeds, position_ids=positions, attention_mask=torch.ones_like(ids)
    ).last_hidden_state.matmul(model.lm_head.weight.T)


@pytest.mark.parametrize("model_type", ["qwen3_vl", "qwen3_5", "llava_onevision"])
def test_the_rules_coincide_elsewhere(tmp_path, model_type) -> None:
    model, processor = build_tiny_vlm(model_type, tmp_path)
    inputs = craft_adapters.build_inputs(processor, make_frames(8, seed=1), FPS, "Q?")
    wrapped = craft_adapters.wrap(model, positions="original")
    assert not wrapped.adapter.original_rule_differs
    with torch.no_grad():
        assert torch.equal(wrapped(**inputs).logits, model(**_hf(inputs)).logits)


def _hf(inputs: dict) -> dict:
    return {k: v for k, v in inputs.items() if k != "video_metadata"}


def test_padded_batch_rows_follow_the_rule_row_by_row() -> None:
    """Left padding keeps its rows; each row's text after its video moves by its own gap."""
    positions = torch.tensor([[[0, 0, 1, 2, 5, 5, 4, 5]], [[0, 0, 1, 1, 1, 1, 2, 3]]])
    positions = torch.cat([positions, positions[:1]], 0)  # [3, 1, 8]
    types = torch.tensor([[0, 0, 0, 2, 2, 2, 0, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1]])
    out, deltas = text_after_media_at_max(positions, types, mask)
    assert out[:, 0, 0].tolist() == [0, 0, 0]  # padding untouched
    assert out[0, 0, 6:].tolist() == [6, 7]  # after max 5, not at 4
    assert deltas.tolist() == [[8 - 7]]


def test_an_unknown_rule_is_named() -> None:
    model = type("M", (), {"config": type("C", (), {"model_type": "qwen2_5_vl"})()})()
    with pytest.raises(ValueError, match="positions must be one of transformers, original"):
        craft_adapters.wrap(model, positions="vllm")
