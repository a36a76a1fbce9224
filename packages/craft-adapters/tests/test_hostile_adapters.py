"""Hostile input to craft-adapters, table-driven (issue 12): odd and broken video files, bad
reader arguments, compressors that return non-finite or malformed output, and the tiny model's
saved folder loading like a real checkpoint.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from adapters_testkit import make_frames, write_video

import craft_adapters
from craft_adapters import read_video
from craft_adapters.splice import _check_result
from craft_adapters.video import VideoReadError


def _audio_only(path: Path) -> Path:
    import av

    with av.open(str(path), mode="w") as container:
        stream: Any = container.add_stream("aac", rate=8000)
        frame = av.AudioFrame.from_ndarray(
            np.zeros((1, 1024), dtype=np.float32), format="fltp", layout="mono"
        )
        frame.sample_rate = 8000
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def _make(kind: str, folder: Path) -> Path:
    """A file of `kind` in `folder`."""
    path = folder / f"{kind}.mp4"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "random-bytes":
        path.write_bytes(np.random.default_rng(0).bytes(4096))
    elif kind == "text":
        path.write_text("this is not a video\n")
    elif kind == "fake-header":
        path.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 200)
    elif kind == "audio-only":
        _audio_only(path)
    elif kind == "truncated":
        write_video(path, make_frames(20))
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif kind == "folder":
        path.mkdir()
    return path


BAD_FILES = ["empty", "random-bytes", "text", "fake-header", "audio-only", "folder", "missing"]


@pytest.mark.parametrize("backend", [None, "pyav"])
@pytest.mark.parametrize("kind", BAD_FILES)
def test_unreadable_files_raise_a_named_error(
    tmp_path: Path, kind: str, backend: str | None
) -> None:
    path = tmp_path / "missing.mp4" if kind == "missing" else _make(kind, tmp_path)
    expected = FileNotFoundError if kind in ("missing", "folder") else VideoReadError
    with pytest.raises(expected) as info:
        read_video(path, backend=backend)
    assert str(path) in str(info.value)


def test_truncated_file_reads_what_it_can_or_fails_clearly(tmp_path: Path) -> None:
    path = _make("truncated", tmp_path)
    try:
        video = read_video(path)
    except VideoReadError as error:
        assert str(path) in str(error)
    else:
        assert video.frames.ndim == 4 and video.frames.shape[0] >= 1


BAD_ARGS: list[tuple[dict[str, Any], str]] = [
    ({"fps": 0.0}, "fps"),
    ({"fps": -1.0}, "fps"),
    ({"fps": math.nan}, "fps"),
    ({"fps": math.inf}, "fps"),
    ({"max_frames": 0}, "max_frames"),
    ({"max_frames": -5}, "max_frames"),
    ({"backend": "opencv"}, "backend"),
]


@pytest.mark.parametrize(("kwargs", "name"), BAD_ARGS)
def test_bad_reader_arguments_name_themselves(
    tmp_path: Path, kwargs: dict[str, Any], name: str
) -> None:
    path = write_video(tmp_path / "ok.mp4", make_frames(4))
    with pytest.raises(ValueError, match=name):
        read_video(path, **kwargs)


@pytest.mark.parametrize(
    ("size", "frames"), [(48, 6), (32, 1), (64, 3), (50, 4)], ids=["48px", "1-frame", "64px", "odd"]
)
def test_small_valid_videos_read_with_any_backend(tmp_path: Path, size: int, frames: int) -> None:
    path = write_video(tmp_path / "small.mp4", make_frames(frames, size=size))
    video = read_video(path, fps=2.0, max_frames=8)
    assert video.frames.shape[1:] == (size, size, 3)
    assert video.frames.dtype == np.uint8 and video.frames.shape[0] >= 1


def test_a_failing_decoder_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """decord fails on some valid files (issue 12: a 48 x 48 mp4): it is used only when asked,
    and its failure names the file and the decoder's own message."""
    import sys
    import types

    from craft_adapters import video as video_module

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("decord: cannot seek")

    monkeypatch.setitem(sys.modules, "decord", types.ModuleType("decord"))
    monkeypatch.setattr(video_module, "_read_decord", broken)
    path = write_video(tmp_path / "48.mp4", make_frames(6, size=48))
    video = read_video(path)
    assert video.backend in ("pyav", "torchcodec") and video.frames.shape[0] >= 1
    with pytest.raises(VideoReadError, match=r"48\.mp4: cannot decode .*decord: cannot seek"):
        read_video(path, backend="decord")


# -- compressor output checks ---------------------------------------------------------------------

N, D = 12, 8


def _result(**change: Any) -> Any:
    kept = torch.arange(0, N, 3)
    base = {
        "features": torch.randn(kept.numel(), D),
        "kept_index": kept,
        "assignment": torch.arange(N) // 3,
        "coords": torch.zeros(kept.numel(), 3, dtype=torch.long),
    }
    base.update(change)
    return SimpleNamespace(**base)


def _poison(value: float, rows: int = 1) -> torch.Tensor:
    features = torch.randn(4, D)
    features[:rows, 0] = value
    return features


RESULT_CASES: list[tuple[str, dict[str, Any], type[Exception] | None, str]] = [
    ("ok", {}, None, ""),
    ("nan", {"features": _poison(math.nan)}, ValueError, "non-finite"),
    ("inf", {"features": _poison(math.inf)}, ValueError, "non-finite"),
    ("-inf", {"features": _poison(-math.inf)}, ValueError, "non-finite"),
    ("all-nan", {"features": torch.full((4, D), math.nan)}, ValueError, "4 of 4"),
    ("half-nan", {"features": _poison(math.nan, rows=2)}, ValueError, "2 of 4"),
    ("bf16-inf", {"features": _poison(math.inf).bfloat16()}, ValueError, "non-finite"),
    ("huge-but-finite", {"features": _poison(1e30)}, None, ""),
    ("wrong-width", {"features": torch.randn(4, D + 1)}, ValueError, "shape"),
    ("wrong-rows", {"features": torch.randn(5, D)}, ValueError, "shape"),
    ("3d-features", {"features": torch.randn(1, 4, D)}, ValueError, "shape"),
    (
        "kept-not-ascending",
        {"kept_index": torch.tensor([3, 0, 6, 9])},
        ValueError,
        "ascending",
    ),
    ("kept-out-of-range", {"kept_index": torch.tensor([0, 3, 6, 12])}, ValueError, "outside"),
    ("kept-negative", {"kept_index": torch.tensor([-1, 3, 6, 9])}, ValueError, "outside"),
    ("assignment-short", {"assignment": torch.zeros(N - 1, dtype=torch.long)}, ValueError, "[12]"),
    ("features-not-tensor", {"features": [[0.0] * D] * 4}, TypeError, "features"),
    ("kept-missing", {"kept_index": None}, TypeError, "kept_index"),
]


@pytest.mark.parametrize(
    ("change", "error", "text"), [c[1:] for c in RESULT_CASES], ids=[c[0] for c in RESULT_CASES]
)
def test_compressor_output_is_checked(
    change: dict[str, Any], error: type[Exception] | None, text: str
) -> None:
    result = _result(**change)
    if error is None:
        _check_result(result, N, D)
        return
    with pytest.raises(error) as info:
        _check_result(result, N, D)
    assert text in str(info.value)


class _NaNCompressor:
    """Keeps every 4th token and returns NaN features (a diverged merge module)."""

    def __call__(self, features: torch.Tensor, coords: torch.Tensor, **kwargs: Any) -> Any:
        kept = torch.arange(0, features.shape[0], 4, device=features.device)
        return SimpleNamespace(
            features=torch.full((kept.numel(), features.shape[1]), math.nan),
            coords=coords[kept],
            kept_index=kept,
            assignment=torch.arange(features.shape[0]) // 4,
            rounds=1,
            info={},
        )


def test_nan_compressor_never_reaches_the_language_model(
    tiny_models: dict[str, tuple[Any, Any]],
) -> None:
    model, processor = tiny_models["qwen2_5_vl"]
    reached = []
    handle = model.model.language_model.register_forward_pre_hook(
        lambda module, args: reached.append(1)
    )
    try:
        wrapped = craft_adapters.wrap(model, _NaNCompressor(), ratio=4.0)
        inputs = craft_adapters.build_inputs(processor, make_frames(4), 2.0, "What?")
        with pytest.raises(ValueError, match="non-finite"):
            wrapped(**inputs)
    finally:
        handle.remove()
    assert reached == []


@pytest.mark.parametrize("model_type", ["qwen2_5_vl", "llava_onevision"])
def test_tiny_model_folder_loads_like_a_checkpoint(model_type: str) -> None:
    """build_tiny_vlm saves its processor too: `craft-eval run --model DIR` works on it."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = Path(tempfile.mkdtemp(prefix="craft-tiny-"))
    _, processor = craft_adapters.tiny.build_tiny_vlm(model_type, folder)
    loaded = AutoProcessor.from_pretrained(folder)
    assert type(loaded) is type(processor)
    assert loaded.tokenizer("hello")["input_ids"] == processor.tokenizer("hello")["input_ids"]
    AutoModelForImageTextToText.from_pretrained(folder)
