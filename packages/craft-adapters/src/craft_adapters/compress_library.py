"""A video library compressed once: the loop behind `craft-compress` (compress_cli.py).

    entries = list_videos("videos/")                  # a folder, a glob, a .jsonl / .csv list
    settings = Settings(backbone=..., ...)             # what every payload is made with
    compress_share(craft, processor, entries, out, settings, rank=0, world=1)
    rows = read_index(out / INDEX)                     # one row per entry, in entry order

Each entry becomes `out/<stem>-<key>.craft.safetensors` (`save_compressed_video`), written to
a temporary name and moved into place (`os.replace`), so a file under its final name is
whole. Rank `r` of `world` takes entries `i % world == r` of the sorted list and appends one
JSON row per entry to its shard (`shards/`); the process that finishes last (or the next
run) merges the shards into `index.jsonl`. A rerun skips an entry whose payload is present,
loads, and was made from the same source bytes (SHA-256) with the same settings.
"""

from __future__ import annotations

import csv
import errno
import glob
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from craft_adapters.compressed import (
    CompressedVideo,
    load_compressed_video,
    save_compressed_video,
)

__all__ = [
    "INDEX",
    "SETTINGS",
    "DiskFull",
    "Entry",
    "Settings",
    "compress_share",
    "list_videos",
    "merge_index",
    "read_index",
]

INDEX = "index.jsonl"
SETTINGS = "craft-compress.json"
SHARDS = "shards"
SUFFIX = ".craft.safetensors"
VIDEO_EXTENSIONS = {".mp4", ".mkv", ".webm", ".avi", ".mov", ".m4v", ".mpg", ".mpeg", ".flv"}
LIST_COLUMNS = ("path", "fps", "frames")
_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once: umask can only be read by setting it


class DiskFull(OSError):
    """The output's filesystem is full: the run stops, nothing half-written is left."""


@dataclass(frozen=True, order=True)
class Entry:
    """One video to compress: its path and how to sample it (the list's or the defaults)."""

    source: str
    fps: float
    frames: int

    @property
    def output(self) -> str:
        """The payload's file name: the video's stem and a digest of path + sampling."""
        key = hashlib.sha256(f"{self.source}|{self.fps!r}|{self.frames}".encode()).hexdigest()
        return f"{Path(self.source).stem}-{key[:12]}{SUFFIX}"


@dataclass(frozen=True)
class Settings:
    """What every payload of an output folder is made with (`craft-compress.json`)."""

    backbone: str
    model_type: str
    hidden_size: int
    craft_checkpoint: str
    craft_sha256: str
    budget: str
    dtype: str

    def payload_metadata(self) -> dict[str, Any]:
        """The keys a payload carries so a server can refuse a mismatch."""
        keys = ("backbone", "model_type", "hidden_size", "craft_sha256", "budget")
        return {k: getattr(self, k) for k in keys}


# ----------------------------------------------------------------------------- the videos


def list_videos(spec: str, fps: float, frames: int) -> list[Entry]:
    """The entries `spec` names, sorted: a folder (its video files, recursively), a `.jsonl`
    / `.csv` list (columns `path`, optional `fps`, `frames`; relative paths from the list's
    folder), a glob (`*`, `?`, `[`), or one video file. `fps` / `frames`: the defaults.

    Raises:
        ValueError: nothing matched, a list row that does not check (named by file:line), a
            duplicate entry. The message starts with `spec`.
    """
    path = Path(spec)
    if path.is_dir():
        found = [p for p in path.rglob("*") if p.suffix.lower() in VIDEO_EXTENSIONS]
        entries = [Entry(os.path.abspath(p), fps, frames) for p in found if p.is_file()]
        what = f"{spec}: no video file ({', '.join(sorted(VIDEO_EXTENSIONS))}) in the folder"
    elif path.suffix.lower() in (".jsonl", ".csv") and path.is_file():
        entries = list(_read_list(path, fps, frames))
        what = f"{spec}: the list names no video"
    elif any(c in spec for c in "*?["):
        matches = sorted(glob.glob(spec, recursive=True))
        entries = [Entry(os.path.abspath(p), fps, frames) for p in matches]
        what = f"{spec}: the glob matches no file"
    elif path.is_file():
        entries = [Entry(os.path.abspath(path), fps, frames)]
        what = ""
    else:
        raise ValueError(f"{spec}: no such folder, list (.jsonl / .csv), glob or video file")
    if not entries:
        raise ValueError(what)
    seen: set[Entry] = set()
    for entry in entries:
        if entry in seen:
            raise ValueError(f"{spec}: {entry.source} is listed twice with the same fps / frames")
        seen.add(entry)
    return sorted(entries)


def _read_list(path: Path, fps: float, frames: int) -> Iterator[Entry]:
    """The rows of a JSONL / CSV list as entries; a bad row is named `file:line`."""
    with path.open(newline="", encoding="utf-8") as handle:
        if path.suffix.lower() == ".csv":
            reader = csv.DictReader(handle)
            rows: Iterable[tuple[int, Any]] = ((i + 2, row) for i, row in enumerate(reader))
        else:
            rows = _jsonl_rows(path, handle)
        for line, row in rows:
            yield _list_entry(f"{path}:{line}", row, path.parent, fps, frames)


def _jsonl_rows(path: Path, handle: Iterable[str]) -> Iterator[tuple[int, Any]]:
    for line, text in enumerate(handle, start=1):
        if text.strip():
            try:
                yield line, json.loads(text)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{line}: not JSON ({error.msg})") from None


def _list_entry(where: str, row: Any, base: Path, fps: float, frames: int) -> Entry:
    """One list row (`{"path": ..., "fps": ..., "frames": ...}`) as an entry."""
    if not isinstance(row, dict) or not row.get("path") or not isinstance(row["path"], str):
        raise ValueError(f"{where}: a row needs a 'path' (text), got {row!r}")
    unknown = sorted(set(row) - set(LIST_COLUMNS))
    if unknown:
        raise ValueError(f"{where}: unknown column(s) {unknown}; a row has {list(LIST_COLUMNS)}")
    rate = _number(where, "fps", row.get("fps"), float, fps)
    cap = _number(where, "frames", row.get("frames"), int, frames)
    if not (0 < rate < float("inf")) or cap < 1:
        raise ValueError(f"{where}: fps must be > 0 and finite, frames >= 1; got {rate}, {cap}")
    source = Path(row["path"]).expanduser()
    return Entry(os.path.abspath(base / source), rate, cap)


def _number(where: str, name: str, value: Any, kind: type, default: Any) -> Any:
    if value is None or value == "":
        return default
    if isinstance(value, bool) or (kind is int and isinstance(value, float)):
        raise ValueError(f"{where}: {name} must be {'an int' if kind is int else 'a number'}")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {name}={value!r} is not a number") from None


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- writing


def _is_disk_full(error: BaseException) -> bool:
    """ENOSPC / EDQUOT, as Python raises it or as safetensors' Rust writer words it."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return "os error 28" in str(error) or "No space left on device" in str(error)


def write_atomic(path: Path, write: Any) -> None:
    """`write(tmp)` then `os.replace(tmp, path)`: `path` is whole or untouched. The
    temporary file is removed on any failure (a full disk raises `DiskFull`)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # safetensors writes 0600; a library is shared
        os.replace(tmp, path)
    except BaseException as error:
        tmp.unlink(missing_ok=True)
        if isinstance(error, Exception) and _is_disk_full(error):
            raise DiskFull(errno.ENOSPC, f"disk full writing {path}") from error
        raise


def write_json_atomic(path: Path, value: Any, lines: bool = False) -> None:
    text = "".join(json.dumps(v) + "\n" for v in value) if lines else json.dumps(value, indent=2)
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


class Shard:
    """One rank's rows, appended as they are made (`shards/index.rankR-of-W.jsonl.part`)
    and renamed when the share is done. A row is whole or absent: a failed append is cut
    back to the previous length."""

    def __init__(self, out: Path, rank: int, world: int) -> None:
        folder = out / SHARDS
        folder.mkdir(exist_ok=True)
        self.final = folder / f"index.rank{rank}-of-{world}.jsonl"
        self.part = self.final.with_name(self.final.name + ".part")
        self.final.unlink(missing_ok=True)  # this run remakes this rank's rows
        self.handle = self.part.open("w", encoding="utf-8")

    def append(self, row: dict[str, Any]) -> None:
        start = self.handle.tell()
        try:
            self.handle.write(json.dumps(row) + "\n")
            self.handle.flush()
            os.fsync(self.handle.fileno())
        except OSError as error:
            self.handle.seek(start)
            self.handle.truncate()
            if _is_disk_full(error):
                raise DiskFull(errno.ENOSPC, f"disk full writing {self.part}") from error
            raise

    def close(self, complete: bool) -> None:
        self.handle.close()
        if complete:
            os.replace(self.part, self.final)


def read_index(path: str | Path) -> list[dict[str, Any]]:
    """The rows of an index (or shard) file; a line that is not a JSON object is named."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line, text in enumerate(handle, start=1):
            try:
                row = json.loads(text)
            except json.JSONDecodeError:
                row = None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{line}: not an index row")
            rows.append(row)
    return rows


def merge_index(out: Path, entries: list[Entry], world: int) -> list[dict[str, Any]] | None:
    """Merge the `world` complete shards into `out/index.jsonl` (rows in entry order) when
    they hold exactly one row per entry; None (nothing written) while a shard is missing or
    stale. Ranks that merge at the same time write the same bytes."""
    rows: dict[tuple[str, float, int], dict[str, Any]] = {}
    for rank in range(world):
        shard = out / SHARDS / f"index.rank{rank}-of-{world}.jsonl"
        if not shard.is_file():
            return None
        for row in read_index(shard):
            rows[(row["source"], row["fps"], row["frames"])] = row
    keys = [(e.source, e.fps, e.frames) for e in entries]
    if set(rows) != set(keys) or len(rows) != len(keys):
        return None
    merged = [rows[k] for k in keys]
    write_json_atomic(out / INDEX, merged, lines=True)
    return merged


def _previous_seconds(out: Path) -> dict[tuple[str, str], float]:
    """Seconds that earlier runs spent on each (source bytes, payload), from their index and
    shards, carried from run to run (a line a killed run left unfinished is passed over)."""
    found: dict[tuple[str, str], float] = {}
    files = [out / INDEX, *sorted((out / SHARDS).glob("index.rank*"))]
    for path in files:
        if not path.is_file():
            continue
        for text in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(text)
                if row.get("status") == "done" and row.get("seconds") is not None:
                    found[(row["sha256"], row["output"])] = float(row["seconds"])  # carried
            except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
                continue
    return found


# ----------------------------------------------------------------------------- the loop


def _verified(path: Path, sha: str, meta: dict[str, Any]) -> CompressedVideo | None:
    """The payload at `path` if it is whole, loads, and was made from these bytes with these
    settings; None otherwise (it is then made again)."""
    if not path.is_file():
        return None
    try:
        video = load_compressed_video(path)
    except ValueError:
        return None
    want = {**meta, "source_sha256": sha}
    return video if all(video.metadata.get(k) == v for k, v in want.items()) else None


def _compress_one(
    craft: Any, processor: Any, entry: Entry, meta: dict[str, Any]
) -> CompressedVideo:
    """The entry's `CompressedVideo`, its metadata extended by `meta` and what was sampled."""
    from craft_adapters.inputs import build_inputs
    from craft_adapters.video import read_video

    sampled = read_video(entry.source, fps=entry.fps, max_frames=entry.frames)
    inputs = build_inputs(processor, sampled.frames, sampled.fps, "")
    (video,) = craft.compress_videos(**inputs)
    extra = {"fps": float(sampled.fps), "frames": int(sampled.frames.shape[0])}
    meta = {**video.metadata, **meta, **extra}
    return CompressedVideo(video.features, video.coords, video.grid, meta)


def _row(entry: Entry, sha: str | None, status: str, **fields: Any) -> dict[str, Any]:
    row = {"source": entry.source, "fps": entry.fps, "frames": entry.frames, "sha256": sha}
    row |= {"output": None, "status": status, "reason": None, "tokens_before": None}
    row |= {"tokens": None, "ratio": None, "seconds": None, "reused": False}
    return row | fields


def _done_row(entry: Entry, sha: str, video: CompressedVideo, **fields: Any) -> dict[str, Any]:
    n, k = video.num_tokens, video.features.shape[0]
    return _row(entry, sha, "done", output=entry.output, tokens_before=n, tokens=k) | {
        "ratio": n / k,
        "sampled_fps": video.metadata.get("fps"),
        "sampled_frames": video.metadata.get("frames"),
        **fields,
    }


def process_entry(
    craft: Any, processor: Any, entry: Entry, out: Path, meta: dict[str, Any], seconds: dict
) -> dict[str, Any]:
    """Compress (or verify) one entry; its index row. A video that is missing, unreadable or
    refused by the model gets a row with the reason; a full disk raises `DiskFull`."""
    start = time.perf_counter()
    if not Path(entry.source).is_file():
        return _row(entry, None, "missing", reason=f"no such file: {entry.source}")
    try:
        sha = sha256_file(entry.source)
    except OSError as error:
        return _row(entry, None, "unreadable", reason=f"{type(error).__name__}: {error}")
    target = out / entry.output
    target.with_name(f".{target.name}.tmp").unlink(missing_ok=True)  # a killed run's
    previous = _verified(target, sha, meta)
    if previous is not None:
        spent = seconds.get((sha, entry.output))
        return _done_row(entry, sha, previous, seconds=spent, reused=True)
    from craft_adapters.video import VideoReadError

    try:
        video = _compress_one(craft, processor, entry, {**meta, "source_sha256": sha})
    except (VideoReadError, OSError) as error:
        return _row(entry, sha, "unreadable", reason=_one_line(error))
    except (ValueError, TypeError, RuntimeError) as error:
        return _row(entry, sha, "failed", reason=_one_line(error))
    write_atomic(target, lambda tmp: save_compressed_video(tmp, video))
    return _done_row(entry, sha, video, seconds=round(time.perf_counter() - start, 4))


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


def compress_share(
    craft: Any,
    processor: Any,
    entries: list[Entry],
    out: Path,
    settings: Settings,
    *,
    rank: int = 0,
    world: int = 1,
    progress: bool = True,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Compress rank `rank`'s share (`entries[i]`, `i % world == rank`) into `out`.

    Returns this rank's rows and the merged index (None when another rank is still working:
    the last one to finish merges). Raises `DiskFull` (the shard keeps the whole rows made so
    far, no temporary file is left).
    """
    share = [e for i, e in enumerate(entries) if i % world == rank]
    meta = settings.payload_metadata()
    seconds = _previous_seconds(out)
    shard = Shard(out, rank, world)
    rows: list[dict[str, Any]] = []
    bar = _Progress(len(share), rank, world, progress)
    try:
        for entry in share:
            row = process_entry(craft, processor, entry, out, meta, seconds)
            shard.append(row)
            rows.append(row)
            bar.update(row)
    finally:
        bar.close()
        shard.close(complete=len(rows) == len(share))
    return rows, merge_index(out, entries, world)


class _Progress:
    """A tqdm bar on stderr (one per rank), or nothing when `enabled` is False."""

    def __init__(self, total: int, rank: int, world: int, enabled: bool) -> None:
        from tqdm.auto import tqdm

        desc = "compress" if world == 1 else f"rank {rank}/{world}"
        self.bar = tqdm(total=total, desc=desc, unit="video", file=sys.stderr, disable=not enabled)
        self.failed = 0

    def update(self, row: dict[str, Any]) -> None:
        self.failed += row["status"] != "done"
        self.bar.set_postfix(failed=self.failed, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def settings_check(out: Path, settings: Settings) -> None:
    """Record `settings` in `out/craft-compress.json`, or check them against the record: a
    folder holds one library (ValueError naming the first setting that differs)."""
    path = out / SETTINGS
    mine = asdict(settings)
    if path.is_file():
        try:
            theirs = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            raise ValueError(f"{path} is not JSON; is this a craft-compress folder?") from None
        for key, value in mine.items():
            if key != "craft_checkpoint" and theirs.get(key) != value:  # its digest decides
                raise ValueError(
                    f"{out} holds a library made with {key}={theirs.get(key)!r}, not "
                    f"{value!r}; use another output folder"
                )
        return
    write_json_atomic(path, mine)
