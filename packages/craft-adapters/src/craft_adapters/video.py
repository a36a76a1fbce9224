"""Read a video file into uint8 frames sampled at a given fps, up to a frame cap; write one.

    video = read_video("clip.mp4", fps=2.0, max_frames=64)   # frames [F, H, W, 3] uint8
    frames, fps = video                                       # what build_inputs wants
    write_video("clip.mp4", frames, fps=4)                    # the workspace's one mp4 writer

Decoders (`backend=`), all giving the same frame indices and, on the project's synthetic
videos, the same pixels:

- "pyav": PyAV, whose wheels bundle FFmpeg: works on a fresh machine. The default when
  torchcodec is not usable.
- "torchcodec": PyTorch's decoder (`pip install craft-adapters[torchcodec]`); it needs the
  system's FFmpeg shared libraries (4 to 8), which pip cannot install. `backend=None` uses it
  when it imports AND finds FFmpeg, and falls back to PyAV on a file it cannot read.
- "decord": only when asked (decord 0.6, 2021; it fails on some small valid mp4s).

transformers' `video_utils.load_video` is not used: its PyAV reader keeps each index once
(a clip shorter than the cap repeats indices) and trusts the header's frame count. A file no
backend can read raises `VideoReadError` naming the path. The frame-index rule:

- `n = round(duration * fps)` frames at timestamps `k / fps` (frame index
  `min(total - 1, floor(k * native_fps / fps + 0.5))`), at least one frame;
- when `n > max_frames`, `max_frames` indices spread uniformly over the whole clip
  (`linspace(0, total - 1, max_frames)` rounded), and the reported fps becomes the effective
  rate `max_frames / duration`.

`total` and `native_fps` come from the container's header (frames counted by decoding when
the header has no count; 30 fps when it has no rate); a header that over-counts repeats the last decodable frame.
Speed of each backend: `packages/craft-adapters/benchmarks/bench_decode.py`.

`write_video` encodes frames with PyAV (yuv420p, `codec` and its `options`): the synthetic
clips of craft-world, craft-eval's fixtures and every package's tests are written by it.
"""

from __future__ import annotations

import itertools
import math
import numbers
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from craft_core.checks import check_int

__all__ = [
    "BACKENDS",
    "SampledVideo",
    "VideoReadError",
    "available_backends",
    "read_video",
    "sample_indices",
    "write_video",
]

BACKENDS = ("pyav", "torchcodec", "decord")


class VideoReadError(ValueError):
    """A file that holds no decodable video stream (the message names the path)."""


@dataclass(frozen=True)
class SampledVideo:
    """Frames sampled from a video.

    Unpacks as `(frames, fps)`: `frames, fps = read_video(path)`.

    Attributes:
        frames: `[F, H, W, 3]` uint8 RGB.
        fps: the rate the frames were sampled at (what `build_inputs` wants).
        indices: `[F]` frame indices in the source video.
        native_fps: the source's frame rate.
        num_source_frames: frames in the source.
        backend: the decoder that read it: "pyav", "torchcodec" or "decord".
    """

    frames: np.ndarray
    fps: float
    indices: np.ndarray
    native_fps: float
    num_source_frames: int
    backend: str

    def __iter__(self) -> Any:
        return iter((self.frames, self.fps))

    @property
    def timestamps(self) -> list[float]:
        """Seconds of each sampled frame in the source."""
        return [float(i) / self.native_fps for i in self.indices]


def _check_rate(fps: Any, name: str = "fps") -> float:
    # fps = 0 would divide by zero inside the processor (a raw traceback); NaN would give
    # garbage timestamps silently. (Also `inputs.py`'s check of the processor's fps.)
    if isinstance(fps, bool) or not isinstance(fps, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(fps).__name__} {fps!r}")
    rate = float(fps)
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"{name} must be a positive finite number, got {fps!r}")
    return rate


def _header_rate(value: Any) -> float:
    """The container's frame rate, or 30 when its header has none (0, None, NaN)."""
    try:
        rate = float(value or 0.0)
    except (TypeError, ValueError):
        return 30.0
    return rate if math.isfinite(rate) and rate > 0 else 30.0


def sample_indices(
    num_frames: int, native_fps: float, fps: float = 2.0, max_frames: int = 64
) -> tuple[np.ndarray, float]:
    """Frame indices to read and the rate they represent; see the module docstring.

    Raises:
        TypeError: `num_frames` / `max_frames` not an int (a bool is not), `fps` not a number.
        ValueError: `num_frames < 1`, `max_frames < 1`, `fps` not a positive finite number.
    """
    if check_int("num_frames", num_frames) < 1:
        raise ValueError("the video has no frames (num_frames < 1)")
    fps = _check_rate(fps)
    max_frames = check_int("max_frames", max_frames, minimum=1)
    native_fps = _check_rate(native_fps, "native_fps")
    duration = num_frames / native_fps
    n = max(1, round(duration * fps))
    if n > max_frames:
        idx = np.rint(np.linspace(0, num_frames - 1, max_frames)).astype(np.int64)
        return idx, max_frames / duration
    idx = np.floor(np.arange(n) * native_fps / fps + 0.5).astype(np.int64)
    return np.minimum(idx, num_frames - 1), float(fps)


def _read_decord(path: str, fps: float, max_frames: int) -> SampledVideo:
    import decord

    vr = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=1)
    total = len(vr)
    native = _header_rate(vr.get_avg_fps())
    idx, rate = sample_indices(total, native, fps, max_frames)
    frames = vr.get_batch(idx.tolist()).asnumpy()
    return SampledVideo(
        np.ascontiguousarray(frames, dtype=np.uint8), rate, idx, native, total, "decord"
    )


@lru_cache(maxsize=1)
def _torchcodec_problem() -> str | None:
    """Why torchcodec cannot decode here, or None when it can (it loads FFmpeg at import)."""
    try:
        import torchcodec
    except ImportError:
        return "torchcodec is not installed (pip install craft-adapters[torchcodec])"
    except Exception as error:  # a broken install raises its own errors
        return f"torchcodec does not import ({type(error).__name__}: {error})"
    if getattr(torchcodec, "ffmpeg_major_version", None) is None:
        return "torchcodec found no FFmpeg 4-8 shared libraries (e.g. apt install ffmpeg)"
    return None


def available_backends() -> list[str]:
    """The backends that can decode on this machine, in `backend=None`'s order of choice."""
    found = ["torchcodec"] if _torchcodec_problem() is None else []
    found.append("pyav")
    try:
        import decord  # noqa: F401

        found.append("decord")
    except ImportError:
        pass
    return found


def _read_torchcodec(path: str, fps: float, max_frames: int) -> SampledVideo:
    from torchcodec.decoders import VideoDecoder

    # "exact" scans the file once: frame i is the i-th frame in presentation order, as PyAV
    # counts them (the "approximate" mode computes indices from timestamps).
    decoder = VideoDecoder(path, seek_mode="exact", dimension_order="NHWC")
    meta = decoder.metadata
    decodable = int(meta.num_frames_from_content or meta.num_frames or 0)
    total = int(meta.num_frames_from_header or decodable)  # PyAV's count: the header's
    native = _header_rate(meta.average_fps_from_header or meta.average_fps)
    if decodable < 1:
        raise VideoReadError(f"{path}: no decodable video frame")
    idx, rate = sample_indices(total, native, fps, max_frames)
    batch = decoder.get_frames_at(indices=np.minimum(idx, decodable - 1).tolist())
    frames = np.ascontiguousarray(batch.data.numpy(), dtype=np.uint8)
    return SampledVideo(frames, rate, idx, native, total, "torchcodec")


def _read_pyav(path: str, fps: float, max_frames: int) -> SampledVideo:
    import av

    with av.open(path) as container:
        if not container.streams.video:
            raise VideoReadError(f"{path}: no video stream (audio-only or not a video file)")
        stream = container.streams.video[0]
        native = _header_rate(stream.average_rate or stream.guessed_rate)
        total = int(stream.frames or 0)
        if total <= 0:  # no frame count in the header: count by decoding
            total = sum(1 for _ in container.decode(stream))
            container.seek(0)
        idx, rate = sample_indices(total, native, fps, max_frames)
        wanted: dict[int, list[int]] = {}
        for out_pos, frame_idx in enumerate(idx.tolist()):
            wanted.setdefault(frame_idx, []).append(out_pos)
        last = int(idx.max())
        frames: list[np.ndarray | None] = [None] * len(idx)
        previous: np.ndarray | None = None
        for i, frame in enumerate(container.decode(stream)):
            if i > last:
                break
            if i in wanted:
                previous = frame.to_ndarray(format="rgb24")
                for pos in wanted[i]:
                    frames[pos] = previous
    # A header that over-counts frames: repeat the last decoded one.
    filled = []
    for f in frames:
        if f is None:
            if previous is None:
                raise ValueError(f"could not decode any frame of {path}")
            f = previous
        filled.append(f)
    return SampledVideo(np.stack(filled).astype(np.uint8), rate, idx, native, total, "pyav")


def read_video(
    path: str | Path, fps: float = 2.0, max_frames: int = 64, backend: str | None = None
) -> SampledVideo:
    """Sample `path` at `fps` frames per second, at most `max_frames` (the paper: 2 and 64).

    Args:
        path: a video file.
        fps: sampling rate.
        max_frames: frame cap; when it binds the frames spread uniformly over the clip.
        backend: "pyav", "torchcodec", "decord", or None: torchcodec when it is installed and
            finds FFmpeg, else PyAV (and PyAV again on a file torchcodec cannot read).

    Returns:
        A `SampledVideo` (unpacks as `frames, fps`).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or Path, got {type(path).__name__}")
    path = str(path)
    if backend is not None and backend not in BACKENDS:
        raise ValueError(
            f"backend: unknown video backend {backend!r}; use one of {', '.join(BACKENDS)} or None"
        )
    fps = _check_rate(fps)
    max_frames = check_int("max_frames", max_frames, minimum=1)
    if not Path(path).is_file():
        raise FileNotFoundError(f"video not found: {path}")
    if backend == "torchcodec" and _torchcodec_problem() is not None:
        raise ImportError(f"backend='torchcodec': {_torchcodec_problem()}")
    if backend is None:
        backend = "pyav"
        if _torchcodec_problem() is None:  # a file torchcodec rejects gets a PyAV try
            try:
                return _read_torchcodec(path, fps, max_frames)
            except Exception:
                pass
    try:
        reader = {"pyav": _read_pyav, "torchcodec": _read_torchcodec, "decord": _read_decord}
        return reader[backend](path, fps, max_frames)
    except VideoReadError:
        raise
    except Exception as error:
        raise VideoReadError(f"{path}: cannot decode ({type(error).__name__}: {error})") from error


def write_video(
    path: str | Path,
    frames: np.ndarray | Iterable[np.ndarray],
    fps: int | Fraction = 8,
    codec: str = "mpeg4",
    options: Mapping[str, str] | None = None,
) -> Path:
    """Encode uint8 RGB `frames` (`[F, H, W, 3]`, or an iterable of `[H, W, 3]`, read lazily)
    to `path` with PyAV, yuv420p, creating the parent folders.

    Args:
        path: the file to write (its container from the extension, e.g. `.mp4`).
        frames: the frames; their size is the first frame's.
        fps: the stream's frame rate (an int, or a `Fraction` such as 30000/1001).
        codec: an FFmpeg encoder name ("mpeg4", "libx264", ...).
        options: the encoder's options, e.g. `{"crf": "6"}` for libx264, `{"qscale": "1"}`.

    Returns:
        `path` as a `Path`.
    """
    import av

    path = Path(path)
    frames = iter(frames)
    first = next(frames, None)
    if first is None:
        raise ValueError(f"frames: no frame to write to {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        stream: Any = container.add_stream(codec, rate=fps)
        stream.options = dict(options or {})
        stream.width, stream.height = int(first.shape[1]), int(first.shape[0])
        stream.pix_fmt = "yuv420p"
        for image in itertools.chain([first], frames):
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():  # flush the encoder's delayed frames
            container.mux(packet)
    return path
