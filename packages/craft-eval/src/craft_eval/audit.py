"""`craft-eval audit`: training data against the six benchmarks (the paper's de-duplication).

    craft-eval audit llava_video.json lf.jsonl -b videomme mvbench --data-root /data/bench
    craft-eval audit mixture.yaml -b videomme longvideobench mvbench egoschema mlvu tempcompass \\
        --data-root /data/bench --write-clean clean/

Every row is checked, whether craft-train can use it or not: a row overlaps a benchmark when
any video it names (a two-video row too) has the same name as one of the benchmark's videos (file name without suffix, or a frame folder's name: the video id) or the
same content (SHA-256 of the file; only files whose byte size matches a benchmark video's
are hashed). Training files are read with `craft_adapters.data_files` (the readers
craft-train trains with; craft-eval may not import craft-train), the benchmarks with their
loaders here (`craft_eval.tasks`). Prints a table per benchmark and training source; exit 1
when anything overlaps. A row that is not JSON cannot be checked: it is listed. `--write-clean
DIR` writes every training file without its overlapping rows and those not JSON (other rows
verbatim) and `DIR/mixture.yaml` listing the clean files, each
with the folder its relative video paths start in.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from craft_adapters.data_files import (
    FormatError,
    Problem,
    Row,
    dataset_path,
    read_file_rows,
    read_rows,
)
from craft_eval.tasks import get_benchmark

__all__ = ["AuditError", "Overlap", "TrainFile", "audit", "training_files", "write_clean"]

NOT_JSON = "not valid JSON"  # how craft_adapters.data_files names a row it cannot parse


class AuditError(ValueError):
    """Bad input (a file that is missing or unreadable, a clash in `--write-clean`)."""


@dataclass(frozen=True)
class TrainFile:
    """One training file and how its rows are read (a mixture entry, or a file as given)."""

    path: Path
    entry: dict[str, Any] = field(default_factory=dict)  # the mixture entry's other fields

    @property
    def video_root(self) -> Path:
        return Path(self.entry.get("video_root") or self.path.parent)


@dataclass(frozen=True)
class Overlap:
    """A training row whose video a benchmark also has."""

    where: str  # file:line
    source: str
    benchmark: str
    video: str
    by: str  # "name" or "content"


def training_files(paths: list[str]) -> tuple[list[TrainFile], dict[str, Any]]:
    """The data files named on the command line, or the datasets of one mixture YAML.
    -> (files, the mixture's other keys: caps, duration mix, seed)."""
    if any(p.endswith((".yaml", ".yml")) for p in paths):
        if len(paths) > 1:
            raise AuditError("give one mixture YAML, or data files, not both")
        return _mixture(Path(paths[0]))
    for p in paths:
        if not Path(p).is_file():
            raise AuditError(f"training file {p} does not exist")
    return [TrainFile(Path(p)) for p in paths], {}


def _mixture(path: Path) -> tuple[list[TrainFile], dict[str, Any]]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise AuditError(f"mixture {path} cannot be read: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("datasets"), list):
        raise AuditError(f"mixture {path}: no `datasets:` list")
    root = data.get("root") or str(path.parent)
    files = []
    for i, entry in enumerate(data["datasets"]):
        if not isinstance(entry, dict) or "json_path" not in entry:
            raise AuditError(f"mixture {path}: datasets[{i}] has no json_path")
        file = dataset_path(root, str(entry["json_path"]))
        if not file.is_file():
            raise AuditError(f"mixture {path}: datasets[{i}].json_path {file} does not exist")
        files.append(TrainFile(file, {k: v for k, v in entry.items() if k != "json_path"}))
    return files, {k: v for k, v in data.items() if k not in ("datasets", "root")}


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _benchmark_videos(roots: dict[str, str], subset: str | None) -> dict[str, set[str]]:
    """Every benchmark's distinct video paths (absolute; as its loader gives them)."""
    return {
        name: {item.video for item in get_benchmark(name).load(root, subset=subset)}
        for name, root in roots.items()
    }


def audit(
    files: list[TrainFile], roots: dict[str, str], *, subset: str | None = None,
    hash_content: bool = True, progress: bool = True,
) -> tuple[list[Overlap], Counter[str], list[Problem]]:  # fmt: skip
    """The overlapping rows of `files` against the benchmarks `{name: data root}`, the rows
    per training source, and the rows that are not JSON (not checked; no trainer reads them).

    Every row is checked, usable for training or not: a row naming two videos overlaps when
    either is a benchmark's (a trainer taking several videos per row would train on it).
    """
    bench = _benchmark_videos(roots, subset)
    names = {b: {_name(v) for v in videos} for b, videos in bench.items()}
    sizes: dict[int, list[tuple[str, str]]] = {}  # byte size -> [(benchmark, video)]
    for b, videos in bench.items():
        for v in videos:
            if hash_content and Path(v).is_file():
                sizes.setdefault(Path(v).stat().st_size, []).append((b, v))
    hashes: dict[str, str] = {}  # path -> sha256, computed once, only where sizes match
    overlaps: list[Overlap] = []
    rows: Counter[str] = Counter()
    unread: list[Problem] = []
    for file in files:
        for row in tqdm(_read(file), desc=f"audit {file.path.name}", disable=not progress):
            rows[row.source] += 1
            if row.problem is not None and row.problem.startswith(NOT_JSON):
                unread.append(Problem(row.where, row.problem))
            overlaps += _row_overlaps(row, names, sizes, hashes)
    return overlaps, rows, unread


def _row_overlaps(
    row: Row, names: dict[str, set[str]], sizes: dict[int, list[tuple[str, str]]],
    hashes: dict[str, str],
) -> list[Overlap]:  # fmt: skip
    """One overlap per benchmark that has any of the row's videos (by name, else content)."""
    found: dict[str, tuple[str, str]] = {}  # benchmark -> (video, by)
    for video in row.videos:
        for b, known in names.items():
            if b not in found and _name(video) in known:
                found[b] = (video, "name")
        path = Path(video)
        if path.is_file() and path.stat().st_size in sizes:
            mine = hashes.setdefault(video, _sha256(video))
            for b, other in sizes[path.stat().st_size]:
                if b not in found and hashes.setdefault(other, _sha256(other)) == mine:
                    found[b] = (video, "content")
    return [Overlap(row.where, row.source, b, v, by) for b, (v, by) in found.items()]


def _name(video: str) -> str:
    """The video id: the file name without its suffix (a frame folder: its name)."""
    path = Path(video)
    return path.name if path.is_dir() else path.stem


def _read(file: TrainFile) -> list[Row]:
    entry = file.entry
    try:
        return read_file_rows(
            file.path, str(entry.get("format", "auto")), source=entry.get("source"),
            video_root=str(file.video_root), columns=entry.get("columns"), tags=entry.get("tags"),
        )  # fmt: skip
    except (FormatError, OSError, UnicodeDecodeError) as error:
        raise AuditError(str(error)) from None


def table(overlaps: list[Overlap], rows: Counter[str], benchmarks: list[str]) -> str:
    """Markdown: per benchmark and training source, rows overlapping by name / by content."""
    lines = [
        "| benchmark | source | rows | overlap by name | by content |",
        "|---|---|---|---|---|",
    ]
    count = Counter((o.benchmark, o.source, o.by) for o in overlaps)
    for b in benchmarks:
        for s in sorted(rows):
            lines.append(f"| {b} | {s} | {rows[s]} | {count[b, s, 'name']} | "
                         f"{count[b, s, 'content']} |")  # fmt: skip
    return "\n".join(lines)


def write_clean(files: list[TrainFile], drop: set[str], out: Path, mixture: dict[str, Any]) -> Path:
    """Each file without the rows whose `file:line` is in `drop` (the overlapping rows and
    those not read) into `out`, other rows as they were, and `out/mixture.yaml` naming them.
    -> the mixture's path.

    Raises:
        AuditError: two training files of the same name, or one that `out` would overwrite.
    """
    import yaml

    names = [f.path.name for f in files]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise AuditError(f"--write-clean: two training files are called {twice[0]}")
    for f in files:
        if (out / f.path.name).resolve() == f.path.resolve():
            raise AuditError(f"--write-clean {out}: would overwrite the training file {f.path}")
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for f in files:
        _write_without(f.path, out / f.path.name, drop)
        entries.append({"json_path": f.path.name, **f.entry, "video_root": str(f.video_root)})
    path = out / "mixture.yaml"
    path.write_text(yaml.safe_dump({**mixture, "datasets": entries}, sort_keys=False))
    return path


def _write_without(src: Path, dst: Path, drop: set[str]) -> None:
    """`src` minus the rows whose `file:line` is in `drop`: JSONL lines verbatim; a JSON
    array as one row per line."""
    text = src.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        kept = [r.value for r in read_rows(src) if f"{src}:{r.line}" not in drop]
        dst.write_text("[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in kept) + "\n]\n",
                       encoding="utf-8")  # fmt: skip
        return
    lines = text.splitlines(keepends=True)
    dst.write_text("".join(x for i, x in enumerate(lines, 1) if f"{src}:{i}" not in drop),
                   encoding="utf-8")  # fmt: skip
