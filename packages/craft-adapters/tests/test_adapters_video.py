"""read_video (decord and the PyAV fallback), sampling, build_inputs, registry, tiny models."""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from adapters_testkit import BACKBONES, make_frames, write_video

import craft_adapters
from craft_adapters import build_inputs, read_video, sample_indices
from craft_adapters.tiny import build_tiny_processor


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """A 3-second, 10 fps clip whose frame k has mean brightness proportional to k."""
    frames = np.stack([np.full((48, 64, 3), 6 * k + 10, dtype=np.uint8) for k in range(30)])
    path = tmp_path_factory.mktemp("video") / "clip.mp4"
    return write_video(path, frames, fps=10), frames


def _brightness_index(frames: np.ndarray) -> list[int]:
    return [round((float(f.mean()) - 10) / 6) for f in frames]


def test_sample_indices_fps_and_cap() -> None:
    idx, rate = sample_indices(300, 30.0, fps=2.0, max_frames=64)  # 10 s -> 20 frames
    assert rate == 2.0 and len(idx) == 20
    assert idx.tolist() == [15 * k for k in range(20)]
    idx, rate = sample_indices(3000, 30.0, fps=2.0, max_frames=64)  # 100 s -> cap binds
    assert len(idx) == 64 and idx[0] == 0 and idx[-1] == 2999
    assert np.all(np.diff(idx) > 0)
    assert abs(np.diff(idx).max() - np.diff(idx).min()) <= 1  # uniform over the clip
    assert rate == pytest.approx(64 / 100.0)
    idx, rate = sample_indices(5, 30.0)  # very short: at least one frame
    assert idx.tolist() == [0] and rate == 2.0
    with pytest.raises(ValueError, match="no frames"):
        sample_indices(0, 30.0)


@pytest.mark.parametrize("backend", ["decord", "pyav"])
def test_read_video_backends(clip: tuple[Path, np.ndarray], backend: str) -> None:
    if backend == "decord":
        pytest.importorskip("decord")
    path, _ = clip
    video = read_video(path, fps=2.0, backend=backend)
    assert video.backend == backend
    assert video.frames.dtype == np.uint8 and video.frames.shape == (6, 48, 64, 3)
    assert video.fps == 2.0 and video.native_fps == pytest.approx(10.0)
    assert video.indices.tolist() == [0, 5, 10, 15, 20, 25]
    assert _brightness_index(video.frames) == [0, 5, 10, 15, 20, 25]
    frames, fps = video  # unpacks as (frames, fps)
    assert frames is video.frames and fps == 2.0
    capped = read_video(path, fps=2.0, max_frames=4, backend=backend)
    assert capped.indices.tolist() == [0, 10, 19, 29]
    assert _brightness_index(capped.frames) == [0, 10, 19, 29]
    assert capped.fps == pytest.approx(4 / 3.0)


def test_read_video_falls_back_to_pyav(
    clip: tuple[Path, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_decord(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "decord":
            raise ImportError("no decord here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_decord)
    video = read_video(clip[0])
    assert video.backend == "pyav" and video.frames.shape[0] == 6


def test_read_video_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_video(tmp_path / "missing.mp4")
    (tmp_path / "x.mp4").write_bytes(b"")
    with pytest.raises(ValueError, match="unknown video backend"):
        read_video(tmp_path / "x.mp4", backend="opencv")


@pytest.mark.parametrize("model_type", BACKBONES)
def test_build_inputs_through_hf_processors(model_type: str, tmp_path: Path) -> None:
    processor = build_tiny_processor(model_type)
    frames = make_frames(4)
    inputs = build_inputs(processor, frames, 2.0, "Describe.")
    ids = inputs["input_ids"]
    assert ids.shape[0] == 1 and inputs["attention_mask"].shape == ids.shape
    video_id = processor.video_token_id
    n_video = int((ids == video_id).sum())
    if model_type == "llava_onevision":
        assert inputs["pixel_values_videos"].shape[:2] == (1, 4)
        assert n_video == 4 * 4 + 1
    else:
        t, h, w = inputs["video_grid_thw"][0].tolist()
        assert t == 2 and n_video == t * h * w // 4
        assert "mm_token_type_ids" in inputs
    if model_type == "qwen2_5_vl":  # fps reaches the time scaling: 2 frames per group at 2 fps
        assert inputs["second_per_grid_ts"][0] == pytest.approx(1.0)
    if model_type in ("qwen3_vl", "qwen3_5"):  # per-frame-group timestamps k / fps
        text = processor.tokenizer.decode(ids[0])
        assert "<0.2 seconds>" in text and "<1.2 seconds>" in text
    text = processor.tokenizer.decode(ids[0])
    assert "Describe." in text and text.endswith("assistant\n")
    with_system = build_inputs(processor, frames, 2.0, "Describe.", system="Be brief.")
    assert "Be brief." in processor.tokenizer.decode(with_system["input_ids"][0])
    with pytest.raises(ValueError, match="uint8"):
        build_inputs(processor, frames.astype(np.float32), 2.0, "x")
    with pytest.raises(ValueError, match="2 video"):
        build_inputs(processor, [frames, frames], 2.0, ["x"])


def test_file_to_generation_end_to_end(
    clip: tuple[Path, np.ndarray], tiny_models: dict[str, Any]
) -> None:
    """read_video -> build_inputs -> wrap(...).generate on one backbone."""
    from adapters_testkit import KeepEvery

    model, processor = tiny_models["qwen2_5_vl"]
    frames, fps = read_video(clip[0], fps=2.0, max_frames=4)
    frames = np.stack([np.pad(f, ((24, 24), (16, 16), (0, 0))) for f in frames])  # 96 x 96
    inputs = build_inputs(processor, frames, fps, "What?")
    wrapped = craft_adapters.wrap(model, KeepEvery(2), ratio=2.0)
    out = wrapped.generate(**inputs, max_new_tokens=2, do_sample=False)
    assert out.shape == (1, inputs["input_ids"].shape[1] + 2)
    assert torch.equal(out[:, : inputs["input_ids"].shape[1]], inputs["input_ids"])


def test_registry() -> None:
    assert craft_adapters.supported_model_types() == sorted(BACKBONES)
    from craft_adapters.registry import BackboneAdapter, register_backbone

    with pytest.raises(ValueError, match="model_types is empty"):

        @register_backbone
        class Empty(BackboneAdapter):
            pass


@pytest.mark.parametrize("model_type", BACKBONES)
def test_tiny_model_is_saved_and_reloaded(model_type: str, tiny_models: dict[str, Any]) -> None:
    model, processor = tiny_models[model_type]
    assert model.config.model_type == model_type
    assert model.config.get_text_config().hidden_size == 64
    assert not model.training
    assert processor.tokenizer.convert_tokens_to_ids("<|video_pad|>") == 262
    with pytest.raises(ValueError, match="no tiny model"):
        craft_adapters.tiny.build_tiny_vlm("bert", "/nonexistent")
