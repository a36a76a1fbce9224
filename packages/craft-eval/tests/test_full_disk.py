"""A real full disk under a run (issue 32): the run folder on a small tmpfs that fills while
records are written, or while the shards are merged. Nothing already written is lost, no
half-written `records.jsonl` / `summary.json` / `.tmp` file is left, and once space is freed
the same run resumes to the summary of an uninterrupted one. Skipped where a tmpfs cannot be
mounted (not root).
"""

from __future__ import annotations

import contextlib
import errno
import json
from pathlib import Path
from typing import Any

import pytest

from craft_eval.fixtures import write_fixture
from craft_eval.runner import Generation, RunConfig, merge_run, run_benchmark
from craft_testkit.filesystem import PAGE, fill_filesystem, small_filesystem


class _Echo:
    """Answers "A" to everything (no model); `fill` runs before its first answer."""

    def __init__(self, fill: Any = None) -> None:
        self.calls, self.fill = 0, fill

    def generate(self, item: Any, prompt: Any) -> Generation:
        if self.calls == 0 and self.fill is not None:
            self.fill()
        self.calls += 1
        return Generation(reply="A", tokens_before=10, tokens_after=5)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 MVBench items: their records take several pages."""
    root = tmp_path_factory.mktemp("fulldisk") / "mv"
    return write_fixture("mvbench", root, num_items=20, num_frames=4)


def _config(data: Path) -> RunConfig:
    return RunConfig("mvbench", str(data), "m")


def _names(out: Path) -> list[str]:
    """The files of a run folder, less its lock files (`.lock.rank<r>`, kept by design)."""
    return sorted(p.name for p in out.iterdir() if not p.name.startswith(".lock"))


def _items(shard: Path) -> int:
    rows = []
    for line in shard.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # the torn line the full disk left
            rows.append(json.loads(line))
    return sum(1 for r in rows if r.get("type") == "item")


@pytest.mark.filterwarnings("ignore:MVBench. task files missing")
def test_a_disk_that_fills_mid_run_loses_nothing_and_resumes(data: Path, tmp_path: Path) -> None:
    reference = run_benchmark(_config(data), _Echo(), tmp_path / "ref", progress=False)
    with small_filesystem(tmp_path / "disk", 256 * 1024) as disk:
        out, filler = disk / "run", disk / "filler"
        with pytest.raises(OSError) as stopped:
            run_benchmark(
                _config(data), _Echo(lambda: fill_filesystem(disk, 0)), out, progress=False
            )
        assert stopped.value.errno == errno.ENOSPC
        kept = _items(out / "records.rank0.jsonl")
        assert 0 < kept < 40
        assert _names(out) == ["records.rank0.jsonl"]

        filler.unlink()  # space freed: the same run resumes
        backend = _Echo()
        resumed = run_benchmark(_config(data), backend, out, progress=False)
        assert backend.calls == 40 - kept
        assert resumed is not None and reference is not None
        assert resumed["scores"] == reference["scores"]
        assert not list(out.glob("*.tmp"))


@pytest.mark.filterwarnings("ignore:MVBench. task files missing")
def test_a_disk_that_fills_during_the_merge_leaves_no_half_file(data: Path, tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "disk", 256 * 1024) as disk:
        out = disk / "run"
        summary = run_benchmark(_config(data), _Echo(), out, progress=False)
        for name in ("records.jsonl", "summary.json"):  # as they were before the merge
            (out / name).unlink()
        filler = fill_filesystem(disk, PAGE)  # less than records.jsonl needs
        with pytest.raises(OSError) as stopped:
            merge_run(out)
        assert stopped.value.errno == errno.ENOSPC
        assert _names(out) == ["records.rank0.jsonl"]

        filler.unlink()
        assert merge_run(out) == summary
        assert _names(out) == [
            "records.jsonl",
            "records.rank0.jsonl",
            "summary.json",
        ]
