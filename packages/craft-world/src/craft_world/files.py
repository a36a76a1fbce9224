"""The world's files: clips of every task family written in MVBench's format, with
craft-train's manifests (`make_clips`).

The families live in their own modules (`craft_world.clips`: squares, `craft_world.crowd`:
tiles); this one imports both, so neither imports the other.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from craft_core.checks import check_int
from craft_world.clips import (
    GENERATOR,
    SPLITS,
    VIDEO_FOLDER,
    Question,
    mvbench_prompt,
    questions_for,
    render,
    sample_scene,
    write_mp4,
)
from craft_world.crowd import (
    TILE_FAMILIES,
    crowd_question,
    render_crowd,
    sample_tiles,
    tile_caption,
)

__all__ = ["FAMILIES", "make_clips"]

FAMILIES = ("squares", *TILE_FAMILIES)
"""`make_clips`' task families: `craft_world.clips`' squares, `craft_world.crowd`'s tiles
(crowd, corners, quiz)."""


def make_clips(
    out_dir: str | Path,
    n: int,
    seed: int = 0,
    *,
    split: str = "test",
    start: int = 0,
    family: str = "squares",
) -> Path:
    """Write `n` clips and their questions in MVBench's format, plus craft-train manifests.

    Layout under `out_dir`:

        json/object_existence.json, json/moving_count.json   MVBench records
        video/clevrer/video_validation/<split>_<index>.mp4  the clips
        captions.jsonl   {video, caption, source}            craft-train stage 1
        qa.jsonl         {video, question, answer, source}   craft-train stage 2 (the
                         question is the full MVBench prompt, the answer its letter)
        world.json       {seed, split, start, n}

    Args:
        out_dir: folder (created); an existing clip file is not rewritten unless the folder's
            world.json names another `GENERATOR` (the clips are a pure function: nothing is
            lost).
        n: number of clips (2 questions each).
        seed: world seed; clips are `(seed, split, start + i)` for `i < n`.
        split: "test" (held out), "train" (the backbone's) or "craft" (the merge module's).
        start: first clip index.
        family: "squares" (this module's clips: existence and count questions), "crowd"
            (`craft_world.crowd`: `json/moving_attribute.json`, files `crowd_<split>_<i>.mp4`),
            "corners" (`json/moving_direction.json`, files `corners_<split>_<i>.mp4`) or
            "quiz" (the asked feature drawn per clip: `json/counterfactual_inference.json`,
            files `quiz_<split>_<i>.mp4`, captions listing every feature present).

    Returns:
        `out_dir`, ready for `craft_eval.tasks.get_benchmark("mvbench").load(out_dir)`.
    """
    _check_clip_args(n, seed, split, start, family)
    out = Path(out_dir)
    stale = _other_generator(out)
    videos = out / "video" / VIDEO_FOLDER
    videos.mkdir(parents=True, exist_ok=True)
    (out / "json").mkdir(exist_ok=True)
    records: dict[str, list[dict[str, Any]]] = {}
    captions, qa = [], []
    for index in range(start, start + n):
        name, frames, caption, questions = _clip(family, seed, split, index)
        if stale or not (videos / name).is_file():
            _write_atomically(videos / name, frames())
        rel = f"video/{VIDEO_FOLDER}/{name}"
        captions.append({"video": rel, "caption": caption, "source": "world"})
        for q in questions:
            records.setdefault(q.task, []).append(_mvbench_record(q, name))
            qa.append(_qa_row(q, rel))
    meta = {"seed": seed, "split": split, "start": start, "n": n, "generator": GENERATOR}
    _write_manifests(out, records, captions, qa, {**meta, "family": family})
    return out


def _other_generator(out: Path) -> bool:
    """Whether `out` holds clips of another `GENERATOR` version (they are rewritten)."""
    old = out / "world.json"
    return old.is_file() and json.loads(old.read_text()).get("generator") != GENERATOR


def _write_atomically(path: Path, frames: Any) -> None:
    """The clip's mp4 under a temporary name, then renamed: a killed run leaves no half file."""
    tmp = path.with_suffix(".tmp.mp4")
    write_mp4(tmp, frames)
    tmp.replace(path)


def _write_manifests(
    out: Path,
    records: dict[str, list[dict[str, Any]]],
    captions: list[dict[str, Any]],
    qa: list[dict[str, Any]],
    meta: dict[str, Any],
) -> None:
    """MVBench's `json/<task>.json`, craft-train's captions.jsonl and qa.jsonl, then
    world.json (`meta`)."""
    for task, rows in records.items():
        (out / "json" / f"{task}.json").write_text(json.dumps(rows, indent=1))
    (out / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in captions))
    (out / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in qa))
    (out / "world.json").write_text(json.dumps(meta))


def _clip(
    family: str, seed: int, split: str, index: int
) -> tuple[str, Callable[[], np.ndarray], str, list[Question]]:
    """Clip `index` of `family`: its file name, its frames (rendered when called), caption
    (the colours shown, in palette order) and questions."""
    if family in TILE_FAMILIES:
        tiles = sample_tiles(family, seed, split, index)
        name = f"{family}_{split}_{index:06d}.mp4"
        return name, lambda: render_crowd(tiles), tile_caption(tiles), [crowd_question(tiles)]
    scene = sample_scene(seed, split, index)
    questions = questions_for(scene, seed, split, index)
    return f"{split}_{index:06d}.mp4", lambda: render(scene), scene.caption, questions


def _check_clip_args(n: int, seed: int, split: str, start: int, family: str) -> None:
    """`make_clips`' arguments: whole numbers (True is not 1 clip), n > 0, a known split
    and family."""
    for name, value in (("n", n), ("seed", seed), ("start", start)):
        check_int(name, value)
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    if seed < 0 or start < 0:
        raise ValueError(f"seed and start must be >= 0, got seed={seed} start={start}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")


def _mvbench_record(q: Question, video: str) -> dict[str, Any]:
    """`q` as a row of MVBench's json/<task>.json (`video`: the file name in its folder)."""
    return {
        "video": video,
        "question": q.question,
        "candidates": list(q.candidates),
        "answer": q.answer,
    }


def _qa_row(q: Question, video: str) -> dict[str, Any]:
    """`q` as a row of craft-train's qa.jsonl: the full MVBench prompt, answered by its letter
    (`video`: the path under the world folder)."""
    return {
        "video": video,
        "question": mvbench_prompt(q.question, q.candidates),
        "answer": "ABCDE"[q.candidates.index(q.answer)],
        "source": q.task,
    }
