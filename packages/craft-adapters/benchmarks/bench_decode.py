"""Decode time of a 64-frame clip with each video backend of `craft_adapters.read_video`.

    uv run python packages/craft-adapters/benchmarks/bench_decode.py [--repeats 5] [--size 640x360]

Two H.264 clips (libx264 through PyAV, GOP 250 as x264's default, random texture so the
encoder cannot skip work), both read to 64 frames:

- "sampled": 64 frames at 2 fps from a 32 s, 30 fps clip (960 source frames): the paper's
  setting (fps = 2, max_frames = 64);
- "whole": a 64-frame, 30 fps clip read at its own rate (every frame).

Printed per backend: median seconds over `--repeats` runs (after one warm-up read; the
backends take turns within a repeat), frames per second, the ratio to PyAV, and whether its
frames equal PyAV's bit for bit. A backend that cannot run here is listed with the reason.
When torchcodec is installed but finds no system FFmpeg (pip cannot install it), the script
re-runs itself with PyAV's bundled FFmpeg 7 libraries exposed under their standard names
(LD_LIBRARY_PATH; Linux), and says so: that is how the README's torchcodec row was measured. `--no-pyav-ffmpeg` turns this off.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

from craft_adapters.video import BACKENDS, _torchcodec_problem, read_video, write_video


def write_clip(path: Path, frames: int, size: tuple[int, int], fps: int = 30) -> Path:
    """An H.264 (yuv420p) clip of smooth moving texture plus noise; frame k is seeded by k."""
    width, height = size
    yy, xx = np.mgrid[0:height, 0:width]

    def frame(k: int) -> np.ndarray:
        rng = np.random.default_rng(k)
        img = np.stack([(xx + 3 * k + 40 * c + yy // 2) % 256 for c in range(3)], axis=-1)
        return np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)

    options = {"preset": "veryfast", "crf": "23"}
    return write_video(path, map(frame, range(frames)), Fraction(fps), "libx264", options)


def _problem(backend: str) -> str | None:
    if backend == "torchcodec":
        return _torchcodec_problem()
    if backend == "decord":
        try:
            import decord  # noqa: F401
        except ImportError:
            return "decord is not installed"
    return None


def time_backends(
    path: Path, fps: float, backends: list[str], repeats: int
) -> dict[str, tuple[float, np.ndarray]]:
    """Median seconds of `read_video(path, fps, 64, backend)` per backend, and its frames.
    The backends take turns within each repeat, so that load from other processes on a
    shared machine falls on all of them alike."""
    frames = {b: read_video(path, fps=fps, max_frames=64, backend=b).frames for b in backends}
    seconds: dict[str, list[float]] = {b: [] for b in backends}  # after a warm-up read each
    for _ in range(repeats):
        for backend in backends:
            start = time.perf_counter()
            read_video(path, fps=fps, max_frames=64, backend=backend)
            seconds[backend].append(time.perf_counter() - start)
    return {b: (statistics.median(seconds[b]), frames[b]) for b in backends}


_FFMPEG_LIBS = ("libavutil", "libavcodec", "libavformat", "libavdevice", "libavfilter")
_FFMPEG_LIBS += ("libswscale", "libswresample")


def _pyav_ffmpeg_dir(tmp: Path) -> Path:
    """Symlinks named libavutil.so.59, ... to the FFmpeg libraries bundled in PyAV's wheel,
    beside links to every library there under its own name (their RPATH is $ORIGIN)."""
    import av

    libs = Path(av.__file__).parent.parent / "av.libs"
    tmp.mkdir(parents=True, exist_ok=True)
    for lib in libs.iterdir():
        (tmp / lib.name).symlink_to(lib)
        name = lib.name.split("-")[0]  # libavutil-a63ffd27.so.59.39.100 -> libavutil
        if name in _FFMPEG_LIBS:
            major = lib.name.split(".so.")[1].split(".")[0]
            (tmp / f"{name}.so.{major}").symlink_to(lib)
    return tmp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--size", default="640x360", help="WIDTHxHEIGHT of the clips")
    parser.add_argument("--no-pyav-ffmpeg", action="store_true")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    try:
        width, height = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        parser.error(f"--size must be WIDTHxHEIGHT, got {args.size!r}")
    if (
        not args.no_pyav_ffmpeg
        and sys.platform.startswith("linux")
        and importlib.util.find_spec("torchcodec") is not None
        and _torchcodec_problem() is not None
    ):
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "LD_LIBRARY_PATH": str(_pyav_ffmpeg_dir(Path(tmp) / "lib"))}
            print("torchcodec: no system FFmpeg; run on PyAV's bundled FFmpeg", flush=True)
            raise SystemExit(
                subprocess.call([sys.executable, *sys.argv, "--no-pyav-ffmpeg"], env=env)
            )

    print(f"threads available: {len(os.sched_getaffinity(0))}; clips {width}x{height} H.264")
    with tempfile.TemporaryDirectory() as tmp:
        clips = {
            "sampled (64 of 960 frames, 2 fps)": (
                write_clip(Path(tmp) / "long.mp4", 960, (width, height)),
                2.0,
            ),
            "whole (64 of 64 frames)": (
                write_clip(Path(tmp) / "short.mp4", 64, (width, height)),
                30.0,
            ),
        }
        usable = [b for b in BACKENDS if _problem(b) is None]
        for backend in BACKENDS:
            if backend not in usable:
                print(f"  {backend:<11} not run: {_problem(backend)}")
        for label, (path, fps) in clips.items():
            print(f"\n{label}")
            results = time_backends(path, fps, usable, args.repeats)
            base_seconds, base_frames = results["pyav"]
            for backend, (seconds, frames) in results.items():
                same = frames.shape == base_frames.shape and np.array_equal(frames, base_frames)
                print(
                    f"  {backend:<11} {seconds * 1e3:8.1f} ms  {len(frames) / seconds:7.1f} "
                    f"frames/s  x{base_seconds / seconds:5.2f} vs pyav  "
                    f"pixels {'== pyav' if same else '!= pyav'}"
                )


if __name__ == "__main__":
    main()
