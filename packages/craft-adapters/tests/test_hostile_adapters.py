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
from adapters_testkit import make_frames

import craft_adapters
from craft_adapters import read_video
from craft_adapters.splice import _check_result
from craft_adapters.video import VideoReadError, write_video


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
        write_video(path, make_frames(20), fps=10)
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
    path = write_video(tmp_path / "ok.mp4", make_frames(4), fps=10)
    with pytest.raises(ValueError, match=name):
        read_video(path, **kwargs)


@pytest.mark.parametrize(
    ("size", "frames"), [(48, 6), (32, 1), (64, 3), (50, 4)], ids=["48px", "1-frame", "64px", "odd"]
)
def test_small_valid_videos_read_with_any_backend(tmp_path: Path, size: int, frames: int) -> None:
    path = write_video(tmp_path / "small.mp4", make_frames(frames, size=size), fps=10)
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
    path = write_video(tmp_path / "48.mp4", make_frames(6, size=48), fps=10)
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
    # issue 25: wrong dtypes, out-of-range assignment, duplicates, empty, inconsistent rows
    ("kept-float", {"kept_index": torch.tensor([0.0, 3.0, 6.0, 9.0])}, TypeError, "kept_index"),
    ("kept-bool", {"kept_index": torch.tensor([True, False, True, True])}, TypeError, "kept_index"),
    ("assignment-float", {"assignment": (torch.arange(N) // 3).float()}, TypeError, "assignment"),
    ("assignment-bool", {"assignment": torch.arange(N) % 2 == 0}, TypeError, "assignment"),
    ("assignment-too-big", {"assignment": torch.full((N,), 4)}, ValueError, "[0, 4)"),
    ("assignment-negative", {"assignment": torch.full((N,), -1)}, ValueError, "[0, 4)"),
    (
        "assignment-kept-elsewhere",
        {"assignment": torch.tensor([1, 1, 1, 0, 0, 0, 2, 2, 2, 3, 3, 3])},
        ValueError,
        "another output row",
    ),
    ("kept-duplicate", {"kept_index": torch.tensor([0, 3, 3, 9])}, ValueError, "duplicates"),
    ("kept-2d", {"kept_index": torch.arange(0, N, 3)[None]}, ValueError, "kept_index"),
    (
        "kept-empty",
        {"kept_index": torch.arange(0), "features": torch.randn(0, D)},
        ValueError,
        "kept 0",
    ),
    ("features-int", {"features": torch.ones(4, D, dtype=torch.long)}, TypeError, "floating"),
    ("features-bool", {"features": torch.ones(4, D, dtype=torch.bool)}, TypeError, "floating"),
    ("bf16-features-ok", {"features": torch.randn(4, D).bfloat16()}, None, ""),
    ("int32-indices-ok", {"kept_index": torch.arange(0, N, 3).int()}, None, ""),
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


# -- argument tables of every public entry point (issue 25) ---------------------------------------

READER_CASES: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("fps-bool", {"fps": True}, TypeError, "fps"),
    ("fps-str", {"fps": "2"}, TypeError, "fps"),
    ("max-frames-float", {"max_frames": 8.5}, TypeError, "max_frames"),
    ("max-frames-bool", {"max_frames": True}, TypeError, "max_frames"),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "name"), [c[1:] for c in READER_CASES], ids=[c[0] for c in READER_CASES]
)
def test_reader_argument_types(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], name: str
) -> None:
    path = write_video(tmp_path / "ok.mp4", make_frames(4), fps=10)
    with pytest.raises(error, match=name):
        read_video(path, **kwargs)


def test_reader_path_of_the_wrong_type() -> None:
    with pytest.raises(TypeError, match="path must be a str or Path"):
        read_video(None)  # type: ignore[arg-type]


SAMPLE_CASES: list[tuple[str, tuple[Any, ...], type[Exception], str]] = [
    ("frames-bool", (True, 30.0, 2.0, 8), TypeError, "num_frames"),
    ("frames-float", (10.0, 30.0, 2.0, 8), TypeError, "num_frames"),
    ("frames-zero", (0, 30.0, 2.0, 8), ValueError, "no frames"),
    ("fps-zero", (10, 30.0, 0.0, 8), ValueError, "fps"),
    ("fps-nan", (10, 30.0, math.nan, 8), ValueError, "fps"),
    ("fps-bool", (10, 30.0, True, 8), TypeError, "fps"),
    ("native-zero", (10, 0.0, 2.0, 8), ValueError, "native_fps"),
    ("native-nan", (10, math.nan, 2.0, 8), ValueError, "native_fps"),
    ("native-none", (10, None, 2.0, 8), TypeError, "native_fps"),
    ("max-frames-zero", (10, 30.0, 2.0, 0), ValueError, "max_frames"),
    ("max-frames-float", (10, 30.0, 2.0, 4.0), TypeError, "max_frames"),
]


@pytest.mark.parametrize(
    ("args", "error", "name"), [c[1:] for c in SAMPLE_CASES], ids=[c[0] for c in SAMPLE_CASES]
)
def test_sample_indices_arguments(args: tuple[Any, ...], error: type[Exception], name: str) -> None:
    with pytest.raises(error, match=name):
        craft_adapters.sample_indices(*args)


BUILD_CASES: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("fps-zero", {"fps": 0}, ValueError, "fps"),
    ("fps-negative", {"fps": -2.0}, ValueError, "fps"),
    ("fps-nan", {"fps": math.nan}, ValueError, "fps"),
    ("fps-inf", {"fps": math.inf}, ValueError, "fps"),
    ("fps-bool", {"fps": True}, TypeError, "fps"),
    ("fps-str", {"fps": "2"}, TypeError, "fps"),
    ("fps-list-with-zero", {"fps": [0.0]}, ValueError, "fps"),
    ("fps-list-too-long", {"fps": [2.0, 2.0]}, ValueError, "fps value"),
    ("min-pixels-zero", {"min_pixels": 0}, ValueError, "min_pixels"),
    ("max-pixels-float", {"max_pixels": 1e5}, TypeError, "max_pixels"),
    ("total-pixels-bool", {"total_pixels": True}, TypeError, "total_pixels"),
    ("frames-float", {"frames": make_frames(2).astype(np.float32)}, ValueError, "uint8"),
    ("frames-gray", {"frames": make_frames(2)[..., 0]}, ValueError, "frames"),
    ("frames-zero-width", {"frames": make_frames(2)[:, :, :0]}, ValueError, "empty"),
    ("frames-none", {"frames": make_frames(2)[:0]}, ValueError, "empty"),
    ("prompts-mismatch", {"prompt": ["a", "b"]}, ValueError, "prompt"),
]


@pytest.mark.parametrize(
    ("change", "error", "name"), [c[1:] for c in BUILD_CASES], ids=[c[0] for c in BUILD_CASES]
)
def test_build_inputs_arguments(
    tiny_models: dict[str, tuple[Any, Any]],
    change: dict[str, Any],
    error: type[Exception],
    name: str,
) -> None:
    _, processor = tiny_models["qwen2_5_vl"]
    args: dict[str, Any] = {"frames": make_frames(2), "fps": 2.0, "prompt": "What?", **change}
    with pytest.raises(error, match=name):
        craft_adapters.build_inputs(processor, **args)


def test_session_inputs_check_fps_and_questions(tiny_models: dict[str, tuple[Any, Any]]) -> None:
    _, processor = tiny_models["qwen2_5_vl"]
    with pytest.raises(ValueError, match="fps"):
        craft_adapters.build_session_inputs(processor, make_frames(2), 0.0, ["What?"])
    with pytest.raises(TypeError, match="questions"):
        craft_adapters.build_session_inputs(processor, make_frames(2), 2.0, "What?")  # type: ignore[arg-type]


WRAP_CASES: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("compressor-str", {"compressor": "craft", "ratio": 2.0}, TypeError, "compressor"),
    ("budget-dict", {"budget": {"ratio": 2.0}}, TypeError, "budget"),
    ("ratio-bool", {"ratio": True}, TypeError, "ratio"),
    ("ratio-str", {"ratio": "8"}, TypeError, "ratio"),
    ("ratio-nan", {"ratio": math.nan}, ValueError, "ratio"),
    ("threshold-nan", {"threshold": math.nan}, ValueError, "threshold"),
    ("threshold-bool", {"threshold": True}, TypeError, "threshold"),
    ("min-tokens-float", {"threshold": 0.5, "min_tokens": 2.0}, TypeError, "min_tokens"),
    ("min-tokens-with-ratio", {"ratio": 2.0, "min_tokens": 2}, ValueError, "min_tokens"),
    ("both-budgets", {"ratio": 2.0, "threshold": 0.5}, ValueError, "exactly one"),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "name"), [c[1:] for c in WRAP_CASES], ids=[c[0] for c in WRAP_CASES]
)
def test_wrap_arguments(
    tiny_models: dict[str, tuple[Any, Any]],
    kwargs: dict[str, Any],
    error: type[Exception],
    name: str,
) -> None:
    model, _ = tiny_models["qwen2_5_vl"]
    kwargs = {"compressor": _KeepHalf(), **kwargs}
    with pytest.raises(error, match=name):
        craft_adapters.wrap(model, **kwargs)


class _KeepHalf:
    def __call__(self, features: torch.Tensor, coords: torch.Tensor, **kwargs: Any) -> Any:
        n = features.shape[0]
        kept = torch.arange(0, n, 2)
        return SimpleNamespace(
            features=features[kept], kept_index=kept, assignment=torch.arange(n) // 2
        )


def _grid(inputs: dict[str, Any], **change: Any) -> dict[str, Any]:
    grid = inputs["video_grid_thw"].clone()
    for axis, delta in change.items():
        grid[0, "thw".index(axis)] += delta
    return {**inputs, "video_grid_thw": grid}


GRID_CASES: list[tuple[str, Any, type[Exception], str]] = [
    ("grid-more-frames", lambda i: _grid(i, t=1), ValueError, "claims"),
    ("grid-fewer-frames", lambda i: _grid(i, t=-1), ValueError, "claims"),
    ("grid-taller", lambda i: _grid(i, h=2), ValueError, "claims"),
    ("grid-odd-width", lambda i: _grid(i, w=1), ValueError, "spatial_merge_size"),
    ("grid-zero", lambda i: _grid(i, t=-2), ValueError, ">= 1"),
    (
        "grid-float",
        lambda i: {**i, "video_grid_thw": i["video_grid_thw"].float()},
        TypeError,
        "video_grid_thw",
    ),
    (
        "grid-bool",
        lambda i: {**i, "video_grid_thw": i["video_grid_thw"] > 0},
        TypeError,
        "video_grid_thw",
    ),
    (
        "grid-two-columns",
        lambda i: {**i, "video_grid_thw": i["video_grid_thw"][:, :2]},
        ValueError,
        "video_grid_thw",
    ),
    (
        "pixels-half",
        lambda i: {**i, "pixel_values_videos": i["pixel_values_videos"][:36]},
        ValueError,
        "holds 36",
    ),
    (
        "pixels-int",
        lambda i: {**i, "pixel_values_videos": i["pixel_values_videos"].long()},
        TypeError,
        "pixel_values_videos",
    ),
    (
        "pixels-meta",
        lambda i: {**i, "pixel_values_videos": i["pixel_values_videos"].to("meta")},
        ValueError,
        "pixel_values_videos is on the meta device",
    ),
    (
        "pixels-3d",
        lambda i: {**i, "pixel_values_videos": i["pixel_values_videos"][None]},
        ValueError,
        "pixel_values_videos",
    ),
    (
        "grid-missing",
        lambda i: {k: v for k, v in i.items() if k != "video_grid_thw"},
        ValueError,
        "video_grid_thw",
    ),
]


@pytest.mark.parametrize(
    ("change", "error", "text"), [c[1:] for c in GRID_CASES], ids=[c[0] for c in GRID_CASES]
)
def test_processor_outputs_that_disagree_are_named(
    tiny_models: dict[str, tuple[Any, Any]], change: Any, error: type[Exception], text: str
) -> None:
    """A grid that claims more frames than the pixels hold ended in an IndexError deep inside
    transformers (issue 25); now the grid and the row count are named first."""
    model, processor = tiny_models["qwen2_5_vl"]
    inputs = dict(craft_adapters.build_inputs(processor, make_frames(4), 2.0, "What?"))
    assert inputs["video_grid_thw"].tolist() == [[2, 6, 6]]  # the table's numbers assume it
    with pytest.raises(error, match=text):
        craft_adapters.wrap(model, _KeepHalf(), ratio=2.0)(**change(inputs))


def test_float_token_ids_are_refused(tiny_models: dict[str, tuple[Any, Any]]) -> None:
    model, processor = tiny_models["qwen2_5_vl"]
    inputs = dict(craft_adapters.build_inputs(processor, make_frames(4), 2.0, "What?"))
    wrapped = craft_adapters.wrap(model, _KeepHalf(), ratio=2.0)
    with pytest.raises(TypeError, match="input_ids must be an integer tensor"):
        wrapped(**{**inputs, "input_ids": inputs["input_ids"].float()})
    session = wrapped.encode_video(**inputs)
    with pytest.raises(TypeError, match="question input_ids must be an integer tensor"):
        session.ask(torch.tensor([[10.0, 11.0]]), max_new_tokens=1)


@pytest.mark.parametrize(
    "cls", [object, "qwen2_5_vl", type("NoTypes", (craft_adapters.BackboneAdapter,), {})]
)
def test_register_backbone_takes_an_adapter_class(cls: Any) -> None:
    error = ValueError if isinstance(cls, type) and cls.__name__ == "NoTypes" else TypeError
    with pytest.raises(error, match=r"register_backbone|model_types"):
        craft_adapters.register_backbone(cls)
