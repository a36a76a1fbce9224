"""InternVL (`internvl`, the fifth backbone) on a tiny random model: identity, a compressed
`generate()` against the unmodified transformers model fed the same spliced embeddings,
sessions on one KV cache, the frames' `(t, h, w)`, the received attention, the shared
wrapper tests, and the real-size config of InternVL3.5-8B."""

from __future__ import annotations

from typing import Any

import pytest
import test_adapters_wrapper as shared  # the backbone-generic tests, run here on InternVL
import torch
from adapters_testkit import KeepEvery, make_frames

from craft_adapters import build_inputs, get_adapter, wrap
from craft_adapters.registry import load_reference_arch

GEN = {"max_new_tokens": 5, "do_sample": False}
SIDE = 4  # tiny tiles: 112 px / 14 px patches = 8, pixel-shuffled to 4 x 4 tokens per frame


@pytest.fixture(scope="module")
def internvl(tiny_models: dict[str, Any]) -> tuple[str, Any, Any]:
    model, processor = tiny_models["internvl"]
    return "internvl", model, processor


def _inputs(processor: Any, frames: int = 4, prompt: str = "What?") -> Any:
    return build_inputs(processor, make_frames(frames), 2.0, prompt)


@pytest.mark.parametrize(
    "shared_test",
    [
        "test_identity_equals_hf",
        "test_positions_survive_and_decoding_continues",
        "test_mask_always_reaches_the_language_model",
        "test_session_equals_fresh_full_run",
        "test_video_less_prompt_runs_uncompressed",
        "test_training_forward_slices_labels_and_backprops",
        "test_real_craft_compressor_ratio_and_threshold",
    ],
)
def test_shared_wrapper_tests(shared_test: str, internvl: tuple[str, Any, Any]) -> None:
    getattr(shared, shared_test)(internvl)


def test_processor_output_is_frames_in_pixel_values(internvl: tuple[str, Any, Any]) -> None:
    _, model, processor = internvl
    inputs = _inputs(processor, frames=3)
    assert "pixel_values_videos" not in inputs
    assert tuple(inputs["pixel_values"].shape) == (3, 3, 112, 112)
    n = int((inputs["input_ids"] == model.config.image_token_id).sum())
    assert n == 3 * SIDE * SIDE == 3 * processor.image_seq_length
    assert "Frame3: <img>" in processor.tokenizer.decode(inputs["input_ids"][0])


@torch.no_grad()
def test_coordinates_are_frame_row_column(internvl: tuple[str, Any, Any]) -> None:
    """Token i of frame f is (f, i // 4, i % 4): checked against transformers' own pixel
    shuffle applied to the patch grid's row / column indices."""
    _, model, processor = internvl
    comp = KeepEvery(2)
    wrap(model, comp, ratio=2.0)(**_inputs(processor, frames=3))
    coords = comp.calls[-1]["coords"]
    patches = 2 * SIDE
    grid = torch.stack(torch.meshgrid(torch.arange(patches), torch.arange(patches), indexing="ij"))
    grid = grid.permute(1, 2, 0).unsqueeze(0).float().contiguous()  # [1, 8, 8, (row, col)]
    shuffled = model.model.pixel_shuffle(grid, scale_factor=0.5).reshape(SIDE * SIDE, 4, 2)
    h, w = (
        (shuffled[:, :, 0].min(1).values // 2).long(),
        (shuffled[:, :, 1].min(1).values // 2).long(),
    )
    expected = torch.cat(
        [torch.stack([torch.full_like(h, f), h, w], dim=-1) for f in range(3)], dim=0
    )
    assert torch.equal(coords, expected)


def _reference_generate(model: Any, inputs: Any, steps: int) -> torch.Tensor:
    """Greedy decoding by the unmodified transformers model from spliced embeddings, built
    here without craft-adapters: every other video row of each video kept (KeepEvery(2)'s
    group means), text kept, each token at its position in the full prompt."""
    ids = inputs["input_ids"]
    token = model.config.image_token_id
    rows = model.model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output
    rows = rows.reshape(-1, rows.shape[-1])
    pairs = torch.arange(rows.shape[0]) // 2
    merged = torch.zeros(int(pairs.max()) + 1, rows.shape[-1]).index_add(0, pairs, rows) / 2
    video_at = (ids[0] == token).nonzero().squeeze(1)
    keep = torch.ones(ids.shape[1], dtype=torch.bool)
    keep[video_at[1::2]] = False
    kept_ids = ids[:, keep]
    embeds = model.get_input_embeddings()(kept_ids)
    embeds[0, kept_ids[0] == token] = merged
    positions = torch.arange(ids.shape[1])[keep].unsqueeze(0)
    out, cache, step_in = [], None, embeds
    for k in range(steps):
        res = model(
            inputs_embeds=step_in,
            position_ids=positions,
            attention_mask=torch.ones(1, keep.sum().item() + k, dtype=torch.long),
            past_key_values=cache,
            use_cache=True,
        )
        cache = res.past_key_values
        nxt = res.logits[:, -1].argmax(-1, keepdim=True)
        out.append(nxt)
        step_in = model.get_input_embeddings()(nxt)
        positions = torch.tensor([[ids.shape[1] + k]])
    return torch.cat(out, dim=1)


@torch.no_grad()
def test_compressed_generate_equals_hf_on_spliced_embeddings(
    internvl: tuple[str, Any, Any],
) -> None:
    _, model, processor = internvl
    inputs = _inputs(processor, frames=4, prompt="Describe the motion.")
    wrapped = wrap(model, KeepEvery(2), ratio=2.0)
    out = wrapped.generate(**inputs, **GEN)
    new = out[:, inputs["input_ids"].shape[1] :]
    assert torch.equal(new, _reference_generate(model, inputs, GEN["max_new_tokens"]))
    report = wrapped.last_compression
    assert report is not None and (report.tokens_before, report.tokens_after) == (64, 32)
    # the check can fail: keeping the other half of the rows gives other tokens' logits
    full = model(**inputs).logits[:, -1]
    assert not torch.equal(wrapped(**inputs).logits[:, -1], full)


@torch.no_grad()
def test_received_attention_per_token(internvl: tuple[str, Any, Any]) -> None:
    """needs_attention: one value per video token, the 2 x 2 mean of the last InternViT
    layer's softmax column means (CLS dropped), recomputed here from eager attention."""
    _, model, processor = internvl
    inputs = _inputs(processor, frames=2)

    class Wants(KeepEvery):
        needs_attention = True

        def __call__(self, features: Any, coords: Any, **kw: Any) -> Any:
            self.importance = kw.get("importance")
            return super().__call__(features, coords, **kw)

    comp = Wants(2)
    wrap(model, comp, ratio=2.0)(**inputs)
    got = comp.importance
    tower = model.model.vision_tower
    tower.config._attn_implementation = "eager"
    try:
        out = tower(pixel_values=inputs["pixel_values"], output_attentions=True)
    finally:
        tower.config._attn_implementation = "sdpa"
    probs = out.attentions[-1].mean(dim=(1, 2))[:, 1:]  # [frames, 64]: heads, queries
    grid = probs.reshape(2, SIDE, 2, SIDE, 2).mean(dim=(2, 4)).flatten()
    assert got is not None and got.shape == (2 * SIDE * SIDE,)
    assert torch.allclose(got, grid, atol=1e-6)


def test_adapter_facts(internvl: tuple[str, Any, Any]) -> None:
    _, model, _ = internvl
    adapter = get_adapter(model)
    assert adapter.video_token_id == model.config.image_token_id
    assert not adapter.uses_mrope and adapter.grid_side == SIDE  # type: ignore[attr-defined]


def test_internvl3_5_8b_config_is_the_public_one() -> None:
    """The efficiency shape ships with the backbone: InternVL3.5-8B's public values, read
    back through transformers' own InternVLConfig (names checked, 256 tokens per frame)."""
    from transformers import InternVLConfig

    arch = load_reference_arch("InternVL3.5-8B")
    config = InternVLConfig(
        text_config=arch["text_config"],
        vision_config=arch["vision_config"],
        downsample_ratio=arch["downsample_ratio"],
    )
    text, vision = config.text_config, config.vision_config
    assert (text.hidden_size, text.num_hidden_layers, text.intermediate_size) == (4096, 36, 12288)
    assert (text.num_attention_heads, text.num_key_value_heads, text.vocab_size) == (32, 8, 151936)
    assert (vision.hidden_size, vision.num_hidden_layers, vision.intermediate_size) == (
        1024,
        24,
        4096,
    )
    assert vision.num_attention_heads == 16
    side = vision.image_size[0] // vision.patch_size[0] * config.downsample_ratio
    assert side * side == arch["_video"]["tokens_per_frame"] == config.image_seq_length == 256
