"""The miniature world: seeded synthetic clips, their questions, and MVBench-format files.

A clip is 8 frames of 84 x 84 at 2 fps (4 s): a static grey texture (per-pixel sigma 14 on a
smooth random shade) with per-frame sensor noise (sigma 6), and one to three squares of distinct
colours (10 to 15 px a side) moving in straight lines. Each
square is, with probability 0.4, TRANSIENT: visible in only 2 consecutive frames (one
temporal patch pair of Qwen2.5-VL, i.e. 1 to 4 of the clip's 144 video tokens), so a
compressor that blurs or drops the few tokens that hold it loses the answer.

Questions (MVBench's multiple choice, options fixed in order):

    object_existence  "Is there a red square?"        (A) yes (B) no
    moving_count      "How many squares are there?"   (A) 1 (B) 2 (C) 3

and a caption ("Describe this video in detail." -> "red, blue.": the colours present, in
palette order) for craft-train's stage 1.

Everything is a pure function of `(seed, split, index)`: `craft_world.files.make_clips(out, n,
seed)` writes the same bytes on every machine that has the same PyAV / libx264 build.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from craft_adapters.video import write_video

__all__ = [
    "CAPTION_PROMPT",
    "FPS",
    "FRAMES",
    "MAX_SQUARES",
    "PALETTE",
    "SIZE",
    "SPLITS",
    "SQUARE_SIDES",
    "TASKS",
    "VIDEO_FOLDER",
    "Question",
    "Scene",
    "mvbench_prompt",
    "questions_for",
    "render",
    "sample_scene",
    "write_mp4",
]

FRAMES = 8
"""Frames per clip."""
SIZE = 84
"""Frame side in pixels (6 x 6 patches of 14 px)."""
FPS = 2
"""Frame rate of the written mp4 (the readers' default sampling rate: every frame is kept)."""
SQUARE_SIDES = (10, 15)
"""Smallest and largest side of a square in pixels (drawn uniformly per square)."""
MAX_SQUARES = 3
"""Squares per clip: 1 to MAX_SQUARES (the count question's options)."""
P_TRANSIENT = 0.4
"""Probability that a square is visible in only 2 of the 8 frames."""
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (225, 30, 30),
    "green": (30, 200, 40),
    "blue": (40, 60, 235),
    "yellow": (235, 215, 30),
    "magenta": (215, 40, 205),
    "cyan": (40, 215, 215),
}
TASKS = ("object_existence", "moving_count")
"""The MVBench task names the questions are filed under."""
VIDEO_FOLDER = "clevrer/video_validation"
"""MVBench's video folder of both tasks (`craft_eval.tasks.mvbench.VIDEO_FOLDERS`)."""
SPLITS = {"train": 0, "test": 1, "craft": 2}
"""Disjoint seed streams: backbone training, held-out evaluation, merge-module training."""
CAPTION_PROMPT = "Describe this video in detail."
"""craft-train's default stage-1 prompt."""
COUNT_OPTIONS = ("1", "2", "3")
YES_NO = ("yes", "no")
GENERATOR = 3
"""Version of the scene generator, renderer and encoder (1: craft-world 0.1's 8 px squares; 2:
x264 with its macroblock tree, whose output differed between processes). A folder
`make_clips` wrote with another version has its clip files rewritten, not reused."""


@dataclass(frozen=True)
class Scene:
    """What a clip shows.

    Attributes:
        colours: the squares' colour names (distinct, 1 to 3).
        spans: `(first, last + 1)` frame range each square is visible in.
        starts: top-left pixel `(y, x)` of each square at frame 0.
        ends: top-left pixel `(y, x)` at frame 7 (straight-line motion in between).
        seed: seed of the texture and noise.
        sides: side of each square in pixels.
    """

    colours: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]
    starts: tuple[tuple[int, int], ...]
    ends: tuple[tuple[int, int], ...]
    seed: int
    sides: tuple[int, ...]

    def position(self, k: int, t: int) -> tuple[int, int] | None:
        """Top-left pixel `(y, x)` of square `k` at frame `t`, or None where it is not shown."""
        (a, b), (y0, x0), (y1, x1) = self.spans[k], self.starts[k], self.ends[k]
        if not a <= t < b:
            return None
        return round(y0 + (y1 - y0) * t / (FRAMES - 1)), round(x0 + (x1 - x0) * t / (FRAMES - 1))

    @property
    def caption(self) -> str:
        names = [c for c in PALETTE if c in self.colours]
        return ", ".join(names) + "."


@dataclass(frozen=True)
class Question:
    """One multiple-choice question about a scene (MVBench record fields)."""

    task: str
    question: str
    candidates: tuple[str, ...]
    answer: str


def _rng(seed: int, split: str, index: int, stream: int = 0) -> np.random.Generator:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    return np.random.default_rng([seed, SPLITS[split], index, stream])


def sample_scene(
    seed: int,
    split: str,
    index: int,
    *,
    sides: tuple[int, int] = SQUARE_SIDES,
    max_squares: int = MAX_SQUARES,
) -> Scene:
    """The scene of clip `index` of `split` (a pure function of its arguments).

    `sides` (inclusive pixel range) and `max_squares` are the backbone recipe's curriculum
    knobs (bigger, fewer squares early in training); every question file uses the defaults.
    """
    if not 1 <= sides[0] <= sides[1] <= SIZE // 2:
        raise ValueError(f"sides must be 1 <= lo <= hi <= {SIZE // 2}, got {sides}")
    if not 1 <= max_squares <= MAX_SQUARES:
        raise ValueError(f"max_squares must be in 1..{MAX_SQUARES}, got {max_squares}")
    rng = _rng(seed, split, index)
    k = int(rng.integers(1, max_squares + 1))
    colours = tuple(str(c) for c in rng.choice(list(PALETTE), size=k, replace=False))
    spans, starts, ends, side_list = [], [], [], []
    for _ in colours:
        side = int(rng.integers(sides[0], sides[1] + 1))
        hi = SIZE - side
        if rng.random() < P_TRANSIENT:
            first = 2 * int(rng.integers(0, FRAMES // 2))
            spans.append((first, first + 2))
        else:
            spans.append((0, FRAMES))
        starts.append((int(rng.integers(0, hi + 1)), int(rng.integers(0, hi + 1))))
        ends.append((int(rng.integers(0, hi + 1)), int(rng.integers(0, hi + 1))))
        side_list.append(side)
    return Scene(
        colours,
        tuple(spans),
        tuple(starts),
        tuple(ends),
        int(rng.integers(2**31)),
        tuple(side_list),
    )


def render(scene: Scene) -> np.ndarray:
    """The clip's frames: uint8 `[FRAMES, SIZE, SIZE, 3]`."""
    rng = np.random.default_rng(scene.seed)
    coarse = rng.random((4, 4))  # a smooth shade: bilinear upsampling of a 4 x 4 grid
    axis = np.linspace(0, 3, SIZE)
    i0 = np.minimum(axis.astype(int), 2)
    f = axis - i0
    rows = coarse[i0] * (1 - f)[:, None] + coarse[i0 + 1] * f[:, None]
    shade = rows[:, i0] * (1 - f)[None, :] + rows[:, i0 + 1] * f[None, :]
    # static grey texture (the same in every frame): a square must be told from it by colour
    grey = 95 + 60 * shade + rng.normal(0.0, 14.0, (SIZE, SIZE))
    base = np.repeat(grey[..., None], 3, axis=-1)
    frames = np.empty((FRAMES, SIZE, SIZE, 3), dtype=np.uint8)
    for t in range(FRAMES):
        image = base + rng.normal(0.0, 6.0, base.shape)  # sensor noise
        for k, colour in enumerate(scene.colours):
            at = scene.position(k, t)
            if at is not None:
                side = scene.sides[k]
                image[at[0] : at[0] + side, at[1] : at[1] + side] = PALETTE[colour]
        frames[t] = np.clip(np.rint(image), 0, 255).astype(np.uint8)
    return frames


def write_mp4(path: str | Path, frames: np.ndarray, fps: int = FPS) -> None:
    """Write uint8 `[F, H, W, 3]` frames as an H.264 mp4 (near-lossless, one thread): the same
    bytes in every process.

    x264's macroblock tree (`mbtree`, on by default) made the bytes differ between processes
    even on one thread: 2 to 3 of 60 clips written by separate processes from the same frames
    had other bytes and decoded up to 5 levels apart (PyAV's libx264; measured). With it off,
    three processes wrote the same bytes."""
    import av

    if "libx264" in av.codecs_available:
        options = {"crf": "6", "preset": "medium", "threads": "1", "x264-params": "mbtree=0"}
        write_video(path, frames, fps, "libx264", options)
    else:  # pragma: no cover - PyAV wheels ship libx264
        write_video(path, frames, fps, "mpeg4", {"qscale": "1"})


def questions_for(scene: Scene, seed: int, split: str, index: int) -> list[Question]:
    """One existence question (asked colour present with probability 1/2) and one count."""
    rng = _rng(seed, split, index, stream=1)
    if rng.random() < 0.5:
        colour, answer = str(rng.choice(list(scene.colours))), "yes"
    else:
        absent = [c for c in PALETTE if c not in scene.colours]
        colour, answer = str(rng.choice(absent)), "no"
    return [
        Question("object_existence", f"Is there a {colour} square?", YES_NO, answer),
        Question(
            "moving_count", "How many squares are there?", COUNT_OPTIONS, str(len(scene.colours))
        ),
    ]


def mvbench_prompt(question: str, candidates: Sequence[str]) -> str:
    """The lmms-eval MVBench prompt text (`craft_eval.tasks.mvbench.MVBench.prompt`)."""
    lines = "\n".join(f"({'ABCDE'[i]}) {c}" for i, c in enumerate(candidates))
    return f"Question:{question}\nOption:\n{lines}\nOnly give the best option.\n"
