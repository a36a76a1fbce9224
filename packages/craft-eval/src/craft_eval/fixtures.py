"""Tiny datasets in each benchmark's REAL distributed format, with synthetic videos.

Used by the tests (a few records per benchmark) and by `craft-eval demo` (its built-in
benchmark is `write_fixture("mvbench", ...)`). Videos are short synthetic clips written
with PyAV: a coloured square moving over a gradient, so that a question like "which way
does the square move?" has a true answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

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
    import av

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if frames is None:
        frames = synthetic_frames(**frame_kwargs)
    with av.open(str(path), mode="w") as container:
        stream: Any = container.add_stream(codec, rate=fps)
        stream.width = int(frames.shape[2])
        stream.height = int(frames.shape[1])
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_broken_video(path: str | Path) -> Path:
    """A file with a video extension that no decoder can read."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x00\x00\x00\x18ftypmp42 this is not a video stream" * 4)
    return path


def _parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def _json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")


def _clip(i: int) -> dict[str, str]:
    names = list(DIRECTIONS)
    return {"direction": names[i % 4], "colour": list(COLOURS)[i % 3]}


def _direction_question(i: int) -> tuple[str, list[str], int]:
    clip = _clip(i)
    candidates = list(DIRECTIONS)
    shift = (2 * i + 1) % 4  # varies the gold letter: D, C, B, A, D, ...
    rotated = candidates[shift:] + candidates[:shift]
    return (
        f"Which way does the {clip['colour']} square move?",
        rotated,
        rotated.index(clip["direction"]),
    )


def write_fixture(
    benchmark: str,
    root: str | Path,
    *,
    num_items: int = 4,
    num_frames: int = 8,
    size: tuple[int, int] = (96, 96),
    broken: tuple[int, ...] = (),
) -> Path:
    """Write a tiny `benchmark` dataset under `root` in its distributed layout.

    Items `broken` get an undecodable video. Returns `root`.
    """
    root = Path(root)
    letters = "ABCDE"

    def video(path: Path, i: int) -> str:
        if i in broken:
            write_broken_video(path)
        else:
            clip = _clip(i)
            write_video(
                path,
                num_frames=num_frames,
                size=size,
                seed=i,
                direction=clip["direction"],
                colour=clip["colour"],
            )
        return path.name

    rows: list[dict[str, Any]] = []
    if benchmark == "videomme":
        for i in range(num_items):
            q, cands, gold = _direction_question(i)
            vid = f"vid{i:03d}"
            video(root / "data" / f"{vid}.mp4", i)
            rows.append(
                {
                    "video_id": f"{i:03d}",
                    "duration": ["short", "medium", "long"][i % 3],
                    "domain": ["Knowledge", "Life Record"][i % 2],
                    "sub_category": ["Humanity & History", "Daily Life"][i % 2],
                    "url": f"https://www.youtube.com/watch?v={vid}",
                    "videoID": vid,
                    "question_id": f"{i:03d}-1",
                    "task_type": ["Counting Problem", "Action Recognition"][i % 2],
                    "question": q,
                    "options": [f"{letters[k]}. {c.capitalize()}." for k, c in enumerate(cands)],
                    "answer": letters[gold],
                }
            )
        _parquet(root / "videomme" / "test-00000-of-00001.parquet", rows)
    elif benchmark == "longvideobench":
        for i in range(num_items):
            q, cands, gold = _direction_question(i)
            vid = f"lvb{i:03d}"
            video(root / "videos" / f"{vid}.mp4", i)
            rows.append(
                {
                    "video_id": vid,
                    "id": f"{vid}_0",
                    "question": q,
                    "candidates": [f"It moves {c}." for c in cands] + ["It does not move."],
                    "correct_choice": gold,
                    "question_category": ["TAA", "S2E", "E3E"][i % 3],
                    "duration_group": [15, 60, 600, 3600][i % 4],
                    "duration": 4.0,
                    "video_path": f"{vid}.mp4",
                    "subtitle_path": f"{vid}_en.json",
                }
            )
        _json(root / "lvb_val.json", rows)
    elif benchmark == "mvbench":
        tasks = ["moving_direction", "object_existence"]
        for t, task in enumerate(tasks):
            task_rows: list[dict[str, Any]] = []
            for j in range(num_items):
                i = t * num_items + j
                name = f"{task}_{j:03d}.mp4"
                video(root / "video" / "clevrer" / "video_validation" / name, i)
                if task == "moving_direction":
                    q, cands, gold = _direction_question(i)
                    cands = [f"The square moves {c}." for c in cands]
                else:
                    colour = _clip(i)["colour"]
                    q = f"Is there a {colour} square in the video?"
                    cands = ["yes", "no"] if i % 2 == 0 else ["no", "yes"]
                    gold = cands.index("yes")
                task_rows.append(
                    {"video": name, "question": q, "candidates": cands, "answer": cands[gold]}
                )
            _json(root / "json" / f"{task}.json", task_rows)
    elif benchmark == "egoschema":
        for i in range(num_items):
            q, cands, gold = _direction_question(i)
            uid = f"0000{i:04d}-aaaa-bbbb-cccc-{i:012d}"
            video(root / "videos" / f"{uid}.mp4", i)
            opts = [f"{letters[k]}. The square moves {c}." for k, c in enumerate(cands)]
            opts.append("E. The square stays still.")
            rows.append(
                {
                    "question_idx": uid,
                    "question": q,
                    "video_idx": uid,
                    "option": opts,
                    "answer": str(gold),
                }
            )
        _parquet(root / "Subset" / "test-00000-of-00001.parquet", rows)
    elif benchmark == "mlvu":
        task_types = [
            "plotQA",
            "needle",
            "ego",
            "count",
            "order",
            "anomaly_reco",
            "topic_reasoning",
        ]
        for i in range(num_items):
            q, cands, gold = _direction_question(i)
            name = f"mlvu_{i:03d}.mp4"
            video(root / "video" / name, i)
            text = q + "\n" + "\n".join(f"({letters[k]}) {c}" for k, c in enumerate(cands))
            rows.append(
                {
                    "video_name": name,
                    "duration": 4.0,
                    "question": text,
                    "candidates": cands,
                    "answer": letters[gold],
                    "task_type": task_types[i % 7],
                    "question_id": f"mlvu-{i}",
                }
            )
        _parquet(root / "dev-00000-of-00001.parquet", rows)
    elif benchmark == "tempcompass":
        dims = ["action", "speed", "direction", "order", "attribute_change"]
        for i in range(num_items):
            q, cands, gold = _direction_question(i)
            vid = f"{1034419625 + i}" + ("_reverse" if i % 3 == 2 else "")
            video(root / "videos" / f"{vid}.mp4", i)
            lines = [f"{letters[k]}. {c}" for k, c in enumerate(cands)]
            rows.append(
                {
                    "video_id": vid,
                    "dim": dims[i % 5],
                    "question": q + "\n" + "\n".join(lines),
                    "answer": lines[gold],
                }
            )
        _parquet(root / "multi-choice" / "test-00000-of-00001.parquet", rows)
    else:
        raise KeyError(f"no fixture writer for {benchmark!r}")
    return root
