"""The teacher's greedy responses of a distillation run, generated once and kept on disk.

    cache = TeacherCache(folder, meta)            # refuses a folder written by another teacher
    cache.responses()                            # {key: [token ids] | "error text"}
    fill_cache(cache, examples, generate, rank=0, world=1)

The folder (default `output_dir/teacher`) holds `meta.json` (what produced the responses:
teacher, frames, generation length) and one `responses-<rank>.jsonl` per process, a row per
(video, prompt) pair written (and flushed) as soon as it is generated:

    {"key": "3f2a...", "video": "/data/a.mp4", "prompt": "What happens?", "ids": [785, 12, ...]}
    {"key": "9bc1...", "video": "/data/b.mp4", "prompt": "...", "error": "DecodeError: ..."}

A killed run leaves at most one half-written last line, which is dropped when the file is
read again; the pairs already written are never generated twice. A video that fails to
decode is recorded with its error (and skipped in training) rather than retried.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from craft_train.config import ConfigError
from craft_train.data import DecodeError, Example

__all__ = ["TeacherCache", "example_key", "fill_cache"]

log = logging.getLogger(__name__)

META_FILE = "meta.json"


def example_key(example: Example) -> str:
    """The cache key of one (video, prompt) pair: a SHA-1 of both (hex, 20 characters)."""
    text = json.dumps([example.video, example.prompt])
    return hashlib.sha1(text.encode()).hexdigest()[:20]


class TeacherCache:
    """The responses folder of one teacher setup.

    Args:
        folder: where `meta.json` and `responses-*.jsonl` live (created if missing).
        meta: what produced the responses (JSON-able); a folder written with other values is
            refused, naming the values that differ.
        create: write `meta.json` if the folder has none (the main process only).
    """

    def __init__(self, folder: str | Path, meta: dict[str, Any], *, create: bool = True) -> None:
        self.folder = Path(folder)
        self.meta = json.loads(json.dumps(meta))  # tuples -> lists, as read back
        path = self.folder / META_FILE
        if path.is_file():
            saved = json.loads(path.read_text())
            changed = sorted(k for k in set(saved) | set(self.meta) if saved.get(k) != meta.get(k))
            if changed:
                raise ConfigError(
                    f"distill.cache_dir: {self.folder} holds responses of another teacher setup "
                    f"(changed: {', '.join(changed)}); delete it or set another distill.cache_dir"
                )
        elif create:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            try:
                tmp.write_text(json.dumps(self.meta, indent=1))
                tmp.rename(path)
            except OSError as err:  # a full disk: no half-written meta.tmp stays behind
                tmp.unlink(missing_ok=True)
                raise OSError(err.errno, f"teacher cache {path}: {err.strerror}") from err

    def responses(self) -> dict[str, list[int] | str]:
        """Every cached pair: key -> token ids, or the error text of a failed video."""
        out: dict[str, list[int] | str] = {}
        for path in sorted(self.folder.glob("responses-*.jsonl")):
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # the half-written line of a killed run
                    continue
                out[row["key"]] = row["ids"] if "ids" in row else str(row["error"])
        return out

    def writer(self, rank: int) -> _Appender:
        """An appender to this process's file (a torn last line is cut off first)."""
        return _Appender(self.folder / f"responses-{rank}.jsonl")


class _Appender:
    """Appends rows to one responses file, flushing each. A write that fails (a full disk)
    raises an OSError naming the file; the rows before it are kept."""

    def __init__(self, path: Path) -> None:
        self.path, self.written = path, 0
        if path.is_file():
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):  # truncated in place: needs no free space
                os.truncate(path, data.rfind(b"\n") + 1)
        self.handle = path.open("a")

    def write(self, row: dict[str, Any]) -> None:
        try:
            self.handle.write(json.dumps(row) + "\n")
            self.handle.flush()
        except OSError as err:
            raise OSError(
                err.errno,
                f"teacher cache {self.path}: {err.strerror}; the {self.written} responses "
                "written before are kept: free space and run the same command again",
            ) from err
        self.written += 1

    def close(self) -> None:
        with contextlib.suppress(OSError):  # the unwritten rest of a failed row: dropped on read
            self.handle.close()


def fill_cache(
    cache: TeacherCache,
    examples: Sequence[Example],
    generate: Callable[[Example], list[int]],
    *,
    rank: int = 0,
    world: int = 1,
    progress: bool = False,
) -> int:
    """Generate the responses the cache lacks; this process takes every `world`-th of them.

    `generate(example)` returns the teacher's token ids, or raises `DecodeError` for a video
    that cannot be read. Returns how many pairs this process generated. Call it on every
    rank, then wait for all of them before reading `cache.responses()`.
    """
    have = cache.responses()
    todo: dict[str, Example] = {}
    for example in examples:  # a pair repeated by the mixture is generated once
        key = example_key(example)
        if key not in have and key not in todo:
            todo[key] = example
    mine = list(todo.items())[rank::world]
    if not mine:
        return 0
    log.info("teacher: generating %d responses (%d already cached)", len(mine), len(have))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(mine), desc="teacher responses", unit="video")
    writer = cache.writer(rank)
    try:
        for key, example in mine:
            row: dict[str, Any] = {"key": key, "video": example.video, "prompt": example.prompt}
            try:
                row["ids"] = [int(i) for i in generate(example)]
            except DecodeError as err:
                log.warning("teacher: skipping %s: %s", example.video, err)
                row["error"] = f"{type(err).__name__}: {err}"
            writer.write(row)
            if bar is not None:
                bar.update(1)
    finally:
        writer.close()
        if bar is not None:
            bar.close()
    return len(mine)
