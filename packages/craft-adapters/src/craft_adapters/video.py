"""Read a video file into uint8 frames sampled at a given fps, up to a frame cap.

decord is used when it imports (fast seeking); otherwise, or when decord fails on a file
(it does on some small valid mp4s), PyAV decodes the stream (decord has no wheels for some
platforms). A file neither can read raises `VideoReadError` naming the path. Both give the same frame indices:

- `n = round(duration * fps)` frames at timestamps `k / fps` (frame index
  `min(total - 1, floor(k * native_fps / fps + 0.5))`), at least one frame;
- when `n > max_frames`, `max_frames` indices spread uniformly over the whole clip
  (`linspace(0, total - 1, max_frames)` rounded), and the reported fps becomes the effective
  rate `max_frames / duration`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["SampledVideo", "VideoReadError", "read_video", "sample_indices"]


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
        backend: "decord" or "pyav".
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


def sample_indices(
    num_frames: int, native_fps: float, fps: float = 2.0, max_frames: int = 64
) -> tuple[np.ndarray, float]:
    """Frame indices to read and the rate they represent; see the module docstring."""
    if num_frames < 1:
        raise ValueError("the video has no frames")
    if fps <= 0 or max_frames < 1:
        raise ValueError(f"fps must be > 0 and max_frames >= 1, got {fps}, {max_frames}")
    if not native_fps or native_fps <= 0 or not math.isfinite(native_fps):
        native_fps = 30.0
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
    native = float(vr.get_avg_fps())
    idx, rate = sample_indices(total, native, fps, max_frames)
    frames = vr.get_batch(idx.tolist()).asnumpy()
    return SampledVideo(
        np.ascontiguousarray(frames, dtype=np.uint8), rate, idx, native, total, "decord"
    )


def _read_pyav(path: str, fps: float, max_frames: int) -> SampledVideo:
    import av

    with av.open(path) as container:
        if not container.streams.video:
            raise VideoReadError(f"{path}: no video stream (audio-only or not a video file)")
        stream = container.streams.video[0]
        native = float(stream.average_rate or stream.guessed_rate or 30.0)
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
        backend: "decord", "pyav", or None (decord if it imports, else PyAV).

    Returns:
        A `SampledVideo` (unpacks as `frames, fps`).
    """
    path = str(path)
    if backend not in (None, "decord", "pyav"):
        raise ValueError(f"backend: unknown video backend {backend!r}; use 'decord' or 'pyav'")
    if not (math.isfinite(fps) and fps > 0):
        raise ValueError(f"fps must be a positive number, got {fps}")
    if max_frames < 1:
        raise ValueError(f"max_frames must be at least 1, got {max_frames}")
    if not Path(path).is_file():
        raise FileNotFoundError(f"video not found: {path}")
    if backend is None:
        try:
            import decord  # noqa: F401

            backend = "decord"
        except ImportError:
            backend = "pyav"
        if backend == "decord":  # decord fails on some valid files: PyAV gets a second try
            try:
                return _read_decord(path, fps, max_frames)
            except Exception:
                backend = "pyav"
    try:
        if backend == "decord":
            return _read_decord(path, fps, max_frames)
        return _read_pyav(path, fps, max_frames)
    except VideoReadError:
        raise
    except Exception as error:
        raise VideoReadError(f"{path}: cannot decode ({type(error).__name__}: {error})") from error
