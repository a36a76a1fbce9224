"""Synthetic clips and the pieces every benchmark's fixture writer shares.

A clip is a coloured square moving over a gradient (`synthetic_frames`), encoded by
craft-adapters' PyAV writer (`write_video`), so that "which way does the square move?" has a
true answer (`direction_question`). `Benchmark.write_fixture` (in `craft_eval.tasks.base`)
lays them out in each benchmark's distributed format; `craft_eval.fixtures.write_fixture(name,
root)` picks the benchmark.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

VideoWriter = Callable[[Path, int], str]
"""`video(path, i) -> file name`: writes item `i`'s clip (or an undecodable file) at `path`."""

DIRECTIONS = {"right": (1, 0), "left": (-1, 0), "down": (0, 1), "up": (0, -1)}
COLOURS = {"red": (230, 40, 40), "green": (40, 200, 60), "blue": (40, 80, 230)}


def synthetic_frames(
    num_frames: int = 16,
    size: tuple[int, int] = (96, 96),
    direction: str = "right",
    colour: str = "red",
    seed: int = 0,
) -> np.ndarray:
    """uint8 `[F, H, W, 3]`: a square of `colour` moving in `direction` over a gradient."""
    h, w = size
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    background = np.stack(
        [
            (xx * 255 // max(1, w - 1)),
            (yy * 255 // max(1, h - 1)),
            np.full_like(xx, 128),
        ],
        axis=-1,
    ).astype(np.uint8)
    side = max(4, min(h, w) // 4)
    dx, dy = DIRECTIONS[direction]
    x0 = (w - side) // 2 - dx * (w - side) // 3
    y0 = (h - side) // 2 - dy * (h - side) // 3
    span = 2 * (min(h, w) - side) // 3
    frames = np.empty((num_frames, h, w, 3), dtype=np.uint8)
    for f in range(num_frames):
        step = round(span * f / max(1, num_frames - 1))
        x, y = x0 + dx * step, y0 + dy * step
        frame = background.copy()
        noise = rng.integers(0, 8, size=frame.shape, dtype=np.uint8)
        frame = np.clip(frame.astype(np.int16) + noise, 0, 255).astype(np.uint8)
        frame[max(0, y) : y + side, max(0, x) : x + side] = COLOURS[colour]
        frames[f] = frame
    return frames


def write_video(
    path: str | Path,
    frames: np.ndarray | None = None,
    fps: int = 8,
    codec: str = "mpeg4",
    **frame_kwargs: Any,
) -> Path:
    """Encode `frames` (default: `synthetic_frames(**frame_kwargs)`) to `path` with PyAV."""
    from craft_adapters.video import write_video as encode  # lazy: craft_adapters imports torch

    if frames is None:
        frames = synthetic_frames(**frame_kwargs)
    return encode(path, frames, fps, codec)


def write_broken_video(path: str | Path) -> Path:
    """A file with a video extension that no decoder can read."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x00\x00\x00\x18ftypmp42 this is not a video stream" * 4)
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")


def clip_of(i: int) -> dict[str, str]:
    names = list(DIRECTIONS)
    return {"direction": names[i % 4], "colour": list(COLOURS)[i % 3]}


class DirectionQuestion(NamedTuple):
    """Which way clip `i`'s square moves: `candidates[gold]` is right."""

    text: str
    candidates: list[str]
    gold: int


def direction_question(i: int) -> DirectionQuestion:
    clip = clip_of(i)
    candidates = list(DIRECTIONS)
    shift = (2 * i + 1) % 4  # varies the gold letter: D, C, B, A, D, ...
    rotated = candidates[shift:] + candidates[:shift]
    return DirectionQuestion(
        f"Which way does the {clip['colour']} square move?",
        rotated,
        rotated.index(clip["direction"]),
    )
