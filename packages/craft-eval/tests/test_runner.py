"""The JSONL runner: streaming, resume after a kill, decode errors, sharding and merging."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from evalhelpers import ScriptedBackend

from craft_core import TokenBudget
from craft_eval.fixtures import write_fixture
from craft_eval.runner import RunConfig, merge_run, run_benchmark

N_ITEMS = 6


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("videomme")
    return write_fixture("videomme", root, num_items=N_ITEMS, num_frames=3, broken=(3,))


def _config(root: Path) -> RunConfig:
    return RunConfig(
        benchmark="videomme",
        data_root=str(root),
        model="scripted",
        method="uniform",
        budget=TokenBudget(ratio=8.0),
    )


def _items(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "records.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines[1:]]


def test_full_run_scores_streams_and_records_decode_error(data_root: Path, tmp_path: Path) -> None:
    summary = run_benchmark(_config(data_root), ScriptedBackend(), tmp_path, progress=False)
    assert summary is not None
    scores = summary["scores"]
    assert scores["n_items"] == N_ITEMS and scores["n_errors"] == 1
    assert scores["errors"][0]["id"] == "003-1"
    # ids 000..005: even ones answered right, odd ones wrong, 003 an error (wrong)
    assert scores["accuracy"] == pytest.approx(100 * 3 / 6)
    assert scores["comp_ratio"] == pytest.approx(8.0)
    assert summary["protocol"]["protocol"] == "lmms-eval"
    assert summary["protocol"]["reference"] == "lmms-eval 0.7.3"
    header = json.loads((tmp_path / "records.jsonl").read_text().splitlines()[0])
    assert header["protocol"]["benchmark"] == "videomme"  # protocol in every result file
    rows = _items(tmp_path)
    assert [r["index"] for r in rows] == list(range(N_ITEMS))
    error = rows[3]
    assert error["status"] == "error" and "VideoDecodeError" in error["error"]
    assert scores["breakdowns"]["duration"]["short"]["n"] == 2


def test_resume_after_stop_skips_finished_items(data_root: Path, tmp_path: Path) -> None:
    first = ScriptedBackend()
    assert run_benchmark(_config(data_root), first, tmp_path, progress=False, stop_after=2) is None
    assert len(first.calls) == 2
    # a torn half line, as a kill during a write leaves it
    with open(tmp_path / "records.rank0.jsonl", "a") as f:
        f.write('{"type": "item", "id": "00')
    second = ScriptedBackend()
    resumed = run_benchmark(_config(data_root), second, tmp_path, progress=False)
    assert not set(first.calls) & set(second.calls)
    assert len(first.calls) + len(second.calls) == N_ITEMS - 1  # one video is broken
    fresh = run_benchmark(_config(data_root), ScriptedBackend(), tmp_path / "fresh", progress=False)
    assert resumed is not None and fresh is not None
    assert resumed["scores"] == fresh["scores"]
    # a finished run started again does nothing and gives the same summary
    third = ScriptedBackend()
    again = run_benchmark(_config(data_root), third, tmp_path, progress=False)
    assert third.calls == [] and again == resumed


def test_resume_refuses_a_different_run(data_root: Path, tmp_path: Path) -> None:
    run_benchmark(_config(data_root), ScriptedBackend(), tmp_path, progress=False, stop_after=1)
    other = _config(data_root)
    other.budget = TokenBudget(ratio=4.0)
    with pytest.raises(ValueError, match="different run"):
        run_benchmark(other, ScriptedBackend(), tmp_path, progress=False)


SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from evalhelpers import ScriptedBackend
from craft_eval.runner import RunConfig, run_benchmark
from craft_core import TokenBudget
config = RunConfig(benchmark="videomme", data_root={root!r}, model="scripted", method="uniform", budget=TokenBudget(ratio=8.0))
run_benchmark(config, ScriptedBackend(delay_s=0.5), {out!r}, progress=False)
"""


def test_killed_process_resumes_to_the_same_summary(data_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "killed"
    script = SCRIPT.format(tests=str(Path(__file__).parent), root=str(data_root), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", script])
    shard = out / "records.rank0.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if shard.exists() and shard.read_text().count('"type": "item"') >= 2:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = shard.read_text().count('"type": "item"')
    assert 2 <= done_before < N_ITEMS
    assert not (out / "summary.json").exists()
    backend = ScriptedBackend()
    resumed = run_benchmark(_config(data_root), backend, out, progress=False)
    assert len(backend.calls) <= N_ITEMS - done_before
    fresh = run_benchmark(_config(data_root), ScriptedBackend(), tmp_path / "fresh", progress=False)
    assert resumed is not None and fresh is not None
    assert resumed["scores"] == fresh["scores"]
    assert [r["id"] for r in _items(out)] == [r["id"] for r in _items(tmp_path / "fresh")]


def test_simulated_ranks_shard_and_merge(data_root: Path, tmp_path: Path) -> None:
    backends = [ScriptedBackend(), ScriptedBackend(), ScriptedBackend()]
    results = [
        run_benchmark(
            _config(data_root), backends[r], tmp_path, rank=r, world_size=3, progress=False
        )
        for r in (1, 2, 0)  # rank 0 last: it merges once every shard is done
    ]
    assert results[0] is None and results[1] is None and results[2] is not None
    seen = [set(b.calls) for b in backends]
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2]) and not (seen[0] & seen[2])
    single = run_benchmark(
        _config(data_root), ScriptedBackend(), tmp_path / "single", progress=False
    )
    assert single is not None
    assert results[2]["scores"] == single["scores"]
    assert results[2]["world_size"] == 3
    assert merge_run(tmp_path)["scores"] == single["scores"]


def test_rank_from_environment(
    data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    backend = ScriptedBackend()
    assert run_benchmark(_config(data_root), backend, tmp_path, progress=False) is None
    assert backend.calls == ["001-1", "005-1"]  # items 1, 3, 5; item 3's video is broken
    with pytest.raises(TimeoutError, match=r"ranks \[0\]"):
        from craft_eval.runner import wait_for_shards

        wait_for_shards(tmp_path, 2, timeout_s=0.1, poll_s=0.05)
