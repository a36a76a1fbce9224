"""InternVL (`internvl`) on a tiny random model: the conformance suite, the frames' `(t, h, w)`
against transformers' own pixel shuffle, and the real-size config of InternVL3.5-8B."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from adapters_conformance import BackboneConformance, Video
from adapters_testkit import KeepEvery, make_frames

from craft_adapters import build_inputs, get_adapter, wrap
from craft_adapters.registry import load_reference_arch

SIDE = 4  # tiny tiles: 112 px / 14 px patches = 8, pixel-shuffled to 4 x 4 tokens per frame


class TestInternVL(BackboneConformance):
    model_type = "internvl"
    batch_frames = (3, 3)  # the processor stacks a batch's frames: equal lengths only
    saves_compressed_videos = True  # every frame token (craft-vllm serves them)
    images_beside_video = False  # the processor does not tell images from frames

    def expected_videos(self, model: Any, inputs: Any, positions: torch.Tensor) -> list[Video]:
        """One video per prompt: every `<IMG_CONTEXT>`, frame by frame, 4 x 4 row-major."""
        seq = (inputs["input_ids"][0] == model.config.image_token_id).nonzero().squeeze(1)
        idx = torch.arange(seq.numel())
        coords = torch.stack([idx // SIDE**2, (idx % SIDE**2) // SIDE, idx % SIDE], dim=-1)
        return [Video(seq, coords)]

    def attention_layer(self, model: Any) -> torch.nn.Module:
        layers = model.model.vision_tower.encoder.layer
        return layers[model.config.vision_feature_layer].attention  # type: ignore[no-any-return]

    def attention_to_tokens(
        self, model: Any, inputs: Any, features: list[torch.Tensor], received: list[torch.Tensor]
    ) -> torch.Tensor:
        """CLS column dropped, then the mean of each 2 x 2 pixel-shuffle group."""
        probs = torch.cat(received)[:, 1:]  # [frames, 64]
        return probs.reshape(-1, SIDE, 2, SIDE, 2).mean(dim=(2, 4)).flatten()


@pytest.fixture(scope="module")
def internvl(tiny_models: dict[str, Any]) -> tuple[str, Any, Any]:
    model, processor = tiny_models["internvl"]
    return "internvl", model, processor


def _inputs(processor: Any, frames: int = 4, prompt: str = "What?") -> Any:
    return build_inputs(processor, make_frames(frames), 2.0, prompt)


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
