"""read_video (PyAV, torchcodec, decord: same indices and frames), sampling, build_inputs,
registry, tiny models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from adapters_testkit import make_frames

import craft_adapters
from craft_adapters import build_inputs, read_video, sample_indices
from craft_adapters import video as video_module
from craft_adapters.video import BACKENDS, available_backends, write_video

USABLE = available_backends()


def _skip_unusable(backend: str) -> None:
    if backend not in USABLE:
        reason = video_module._torchcodec_problem() if backend == "torchcodec" else "no decord"
        pytest.skip(f"{backend} cannot decode here: {reason}")


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


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_video_backends(clip: tuple[Path, np.ndarray], backend: str) -> None:
    _skip_unusable(backend)
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


def test_default_backend_is_torchcodec_when_usable_else_pyav(
    clip: tuple[Path, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = "torchcodec" if "torchcodec" in USABLE else "pyav"
    assert read_video(clip[0]).backend == expected
    monkeypatch.setattr(video_module, "_torchcodec_problem", lambda: "no FFmpeg here")
    video = read_video(clip[0])
    assert video.backend == "pyav" and video.frames.shape[0] == 6
    with pytest.raises(ImportError, match="backend='torchcodec': no FFmpeg here"):
        read_video(clip[0], backend="torchcodec")
    assert available_backends()[0] == "pyav"


def test_a_file_torchcodec_rejects_gets_a_pyav_try(
    clip: tuple[Path, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("torchcodec: cannot seek")

    monkeypatch.setattr(video_module, "_torchcodec_problem", lambda: None)
    monkeypatch.setattr(video_module, "_read_torchcodec", broken)
    video = read_video(clip[0])
    assert video.backend == "pyav" and video.indices.tolist() == [0, 5, 10, 15, 20, 25]
    with pytest.raises(video_module.VideoReadError, match="torchcodec: cannot seek"):
        read_video(clip[0], backend="torchcodec")


# (frames, size (h, w), fps written, fps read, max_frames): short clips, the cap binding,
# a clip shorter than the cap read faster than its rate (repeated indices), odd sizes.
SYNTHETIC = [
    (30, (48, 64), 10, 2.0, 64),
    (90, (64, 64), 30, 2.0, 4),
    (1, (32, 32), 10, 2.0, 64),
    (7, (50, 66), 7, 13.0, 64),
    (120, (96, 128), 24, 3.0, 16),
    (45, (64, 96), 15, 1.0, 64),
]


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "pyav"])
def test_every_backend_gives_pyavs_indices_and_frames(tmp_path: Path, backend: str) -> None:
    _skip_unusable(backend)
    for i, (count, (h, w), rate, fps, cap) in enumerate(SYNTHETIC):
        frames = make_frames(count, seed=i, size=max(h, w))[:, :h, :w]
        path = write_video(tmp_path / f"v{i}.mp4", np.ascontiguousarray(frames), fps=rate)
        ref = read_video(path, fps=fps, max_frames=cap, backend="pyav")
        got = read_video(path, fps=fps, max_frames=cap, backend=backend)
        expected, _ = sample_indices(count, float(rate), fps, cap)  # the rule, from the writer
        assert ref.indices.tolist() == got.indices.tolist() == expected.tolist(), (i, backend)
        assert (got.fps, got.native_fps, got.num_source_frames) == (
            ref.fps,
            ref.native_fps,
            ref.num_source_frames,
        )
        assert got.frames.shape == ref.frames.shape and got.frames.dtype == np.uint8
        assert np.array_equal(got.frames, ref.frames), (i, backend)


def test_torchcodec_on_pyavs_ffmpeg_in_a_fresh_process(tmp_path: Path) -> None:
    """Where torchcodec is installed but finds no system FFmpeg (pip cannot install it), run
    it on the FFmpeg libraries bundled in PyAV's wheel (as the benchmark does): its indices
    and frames must equal PyAV's."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("torchcodec") is None or not sys.platform.startswith("linux"):
        pytest.skip("torchcodec is not installed (or not Linux)")
    bench = Path(__file__).parents[1] / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        from bench_decode import _pyav_ffmpeg_dir
    finally:
        sys.path.remove(str(bench))
    libs = _pyav_ffmpeg_dir(Path(tmp_path / "ffmpeg"))
    path = write_video(tmp_path / "v.mp4", make_frames(40, size=64), fps=10)
    script = (
        "import sys, numpy as np\n"
        "from craft_adapters import read_video\n"
        "for cap in (64, 6):\n"
        "    a = read_video(sys.argv[1], fps=3.0, max_frames=cap, backend='torchcodec')\n"
        "    b = read_video(sys.argv[1], fps=3.0, max_frames=cap, backend='pyav')\n"
        "    assert a.indices.tolist() == b.indices.tolist(), (a.indices, b.indices)\n"
        "    assert np.array_equal(a.frames, b.frames)\n"
        "print(read_video(sys.argv[1]).backend)\n"
    )
    env = {**os.environ, "LD_LIBRARY_PATH": str(libs)}
    out = subprocess.run(
        [sys.executable, "-c", script, str(path)], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "torchcodec"  # the default where it finds FFmpeg


def test_read_video_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_video(tmp_path / "missing.mp4")
    (tmp_path / "x.mp4").write_bytes(b"")
    with pytest.raises(ValueError, match="unknown video backend 'opencv'; use one of pyav"):
        read_video(tmp_path / "x.mp4", backend="opencv")


def _reference_mp4(path: Path, frames: np.ndarray, fps: int, codec: str, options: dict) -> bytes:
    """The obvious PyAV loop that each package's writer was before `write_video`."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.options = options
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for image in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path.read_bytes()


@pytest.mark.parametrize(
    "codec, options", [("mpeg4", {}), ("mpeg4", {"qscale": "1"}), ("libx264", {"crf": "6"})]
)
def test_write_video_is_the_plain_pyav_loop(codec: str, options: dict, tmp_path: Path) -> None:
    frames = make_frames(7, seed=3, size=48)[:, :, :32]  # H 48, W 32: the sides are not swapped
    want = _reference_mp4(tmp_path / "ref.mp4", frames, 5, codec, options)
    path = write_video(tmp_path / "new" / "a.mp4", frames, 5, codec, options)
    assert path == tmp_path / "new" / "a.mp4" and path.read_bytes() == want
    lazy = write_video(tmp_path / "lazy.mp4", iter(list(frames)), 5, codec, options)
    assert lazy.read_bytes() == want  # frames from an iterator, read one at a time
    # Control: other encoder options give other bytes (the options reach the encoder).
    other = write_video(tmp_path / "o.mp4", frames, 5, codec, {**options, "g": "1"})
    assert other.read_bytes() != want
    back = read_video(path, fps=5, max_frames=64, backend="pyav")
    assert back.frames.shape == frames.shape and back.fps == 5
    assert np.abs(back.frames.astype(int) - frames).mean() < 20  # lossy, but these frames


def test_write_video_refuses_no_frame(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="frames: no frame to write"):
        write_video(tmp_path / "none.mp4", np.zeros((0, 8, 8, 3), np.uint8))
    assert not (tmp_path / "none.mp4").exists()


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
