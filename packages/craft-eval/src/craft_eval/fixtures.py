"""Tiny datasets in each benchmark's REAL distributed format, with synthetic videos.

Used by the tests (a few records per benchmark) and by `craft-eval demo`. Each benchmark
says where item i's clip goes and what its annotation row holds (`fixture_item` and
`fixture_file` in `craft_eval.tasks.<benchmark>`); `Benchmark.write_fixture` lays them out
(MVBench, one JSON file per task, writes its own). The clips and shared pieces are in
`craft_eval.synthetic`. A new benchmark's fixture is a method of its own class: nothing here
to edit.
"""

from __future__ import annotations

from pathlib import Path

from craft_eval.synthetic import (
    COLOURS,
    DIRECTIONS,
    synthetic_frames,
    write_broken_video,
    write_video,
)

__all__ = [
    "COLOURS",
    "DIRECTIONS",
    "synthetic_frames",
    "write_broken_video",
    "write_fixture",
    "write_video",
]


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
    from craft_eval.synthetic import clip_of
    from craft_eval.tasks import BENCHMARKS

    if benchmark not in BENCHMARKS:
        raise KeyError(f"no fixture writer for {benchmark!r}")
    root = Path(root)

    def video(path: Path, i: int) -> str:
        if i in broken:
            write_broken_video(path)
        else:
            clip = clip_of(i)
            write_video(
                path,
                num_frames=num_frames,
                size=size,
                seed=i,
                direction=clip["direction"],
                colour=clip["colour"],
            )
        return path.name

    BENCHMARKS[benchmark].write_fixture(root, video, num_items)
    return root
