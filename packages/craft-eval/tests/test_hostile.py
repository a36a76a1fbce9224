"""Hostile input to craft-eval, table-driven (issue 12): bad arguments, malformed data, broken
results files, two runs in one folder, a SIGKILLed run, a full disk.

Every CLI case must end with a one-line message naming the option, file or field, the right
exit code (2 for usage errors) and no traceback; none of them loads a model (they fail in
validation, which runs first). Data cases check the right result or a clear error.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from craft_core import TokenBudget
from craft_eval import cli
from craft_eval.fixtures import write_fixture, write_video
from craft_eval.runner import (
    CorruptRecords,
    Generation,
    RunConfig,
    RunLocked,
    _Lock,
    _read_jsonl,
    load_items,
    run_benchmark,
)
from craft_eval.tasks import get_benchmark


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Fixture data of every benchmark plus odd folders, written once."""
    root = tmp_path_factory.mktemp("hostile")
    paths: dict[str, Path] = {"root": root}
    for bench in ("videomme", "mvbench", "egoschema", "longvideobench"):
        paths[bench] = write_fixture(bench, root / "data" / bench, num_items=4, num_frames=4)
    paths["data"] = root / "data"
    paths["empty"] = root / "empty"
    paths["empty"].mkdir()
    paths["afile"] = root / "afile.txt"
    paths["afile"].write_text("not a folder")
    paths["nomodel"] = root / "nomodel"
    paths["nomodel"].mkdir()
    ckpt = root / "badckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{not json")
    (ckpt / "model.safetensors").write_bytes(b"garbage")
    paths["badckpt"] = ckpt
    return paths


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse
        code = int(exit_.code or 0)
    err = capsys.readouterr().err
    return code, err


RUN = ["run", "--tiny", "qwen2_5_vl", "-b", "mvbench", "--data-root", "{data}", "-o", "{out}"]
UNI = [*RUN, "--method", "uniform", "--ratio", "4"]
EFF = ["efficiency", "--arch", "qwen2.5-vl-7b"]

# (id, argv, exit code, text the message must hold)
USAGE_CASES: list[tuple[str, list[str], int, str]] = [
    ("no-model", ["run", "-b", "mvbench", "--data-root", "{data}"], 2, "--model"),
    ("model-missing", ["run", "--model", "{root}/nope", *RUN[3:]], 2, "--model"),
    ("model-no-config", ["run", "--model", "{nomodel}", *RUN[3:]], 2, "config.json"),
    ("model-and-tiny", ["run", "--model", "{nomodel}", *RUN[1:]], 2, "not both"),
    ("tiny-unknown", ["run", "--tiny", "gpt2", *RUN[3:]], 2, "--tiny gpt2"),
    ("benchmark-unknown", [*RUN[:4], "nosuch", *RUN[5:]], 2, "--benchmark nosuch"),
    ("data-root-missing", [*RUN[:6], "{root}/nope", *RUN[7:]], 2, "--data-root"),
    ("data-root-pair-other", [*RUN[:6], "videomme={data}", *RUN[7:]], 2, "videomme"),
    ("data-root-two-plain", [*RUN[:6], "{data}", "{data}", *RUN[7:]], 2, "--data-root"),
    ("data-root-empty", [*RUN[:6], "{empty}", *RUN[7:]], 2, "MVBench: no json"),
    ("limit-0", [*RUN, "--limit", "0"], 2, "--limit"),
    ("limit-negative", [*RUN, "--limit", "-1"], 2, "--limit"),
    ("frames-0", [*RUN, "--frames", "0"], 2, "--frames"),
    ("frames-negative", [*RUN, "--frames", "-3"], 2, "--frames"),
    ("fps-0", [*RUN, "--fps", "0"], 2, "--fps"),
    ("fps-negative", [*RUN, "--fps", "-1"], 2, "--fps"),
    ("fps-nan", [*RUN, "--fps", "nan"], 2, "--fps"),
    ("fps-inf", [*RUN, "--fps", "inf"], 2, "--fps"),
    ("none-with-ratio", [*RUN, "--ratio", "8"], 2, "--ratio"),
    ("none-with-threshold", [*RUN, "--threshold", "0.5"], 2, "--threshold"),
    ("none-with-min-tokens", [*RUN, "--min-tokens", "4"], 2, "--min-tokens"),
    ("none-with-checkpoint", [*RUN, "--checkpoint", "{root}"], 2, "--checkpoint"),
    ("none-with-method-arg", [*RUN, "--method-arg", "seed=1"], 2, "--method-arg"),
    ("method-without-budget", [*RUN, "--method", "uniform"], 2, "--ratio"),
    ("ratio-below-1", [*RUN, "--method", "uniform", "--ratio", "0.5"], 2, "--ratio"),
    ("ratio-negative", [*RUN, "--method", "uniform", "--ratio=-2"], 2, "--ratio"),
    ("ratio-nan", [*RUN, "--method", "uniform", "--ratio", "nan"], 2, "--ratio"),
    ("ratio-inf", [*RUN, "--method", "uniform", "--ratio", "inf"], 2, "--ratio"),
    ("threshold-2", [*RUN, "--method", "craft-prune", "--threshold", "2"], 2, "--threshold"),
    ("threshold-nan", [*RUN, "--method", "craft-prune", "--threshold", "nan"], 2, "--threshold"),
    ("min-tokens-0", [*UNI, "--min-tokens", "0"], 2, "--min-tokens"),
    ("method-unknown", [*RUN, "--method", "bogus", "--ratio", "4"], 2, "--method bogus"),
    ("method-arg-unknown", [*UNI, "--method-arg", "foo=1"], 2, "--method-arg foo"),
    ("method-arg-no-equals", [*UNI, "--method-arg", "seed"], 2, "KEY=VALUE"),
    ("method-arg-no-key", [*UNI, "--method-arg", "=3"], 2, "KEY=VALUE"),
    (
        "craft-arg-unknown",
        [*RUN, "--method", "craft-prune", "--ratio", "4", "--method-arg", "sim_dimension=3"],
        2,
        "sim_dimension",
    ),
    ("craft-no-checkpoint", [*RUN, "--method", "craft", "--ratio", "4"], 2, "--checkpoint"),
    (
        "scissor-no-checkpoint",
        [*RUN, "--method", "scissor-merge", "--ratio", "4"],
        2,
        "--checkpoint",
    ),
    (
        "checkpoint-missing",
        [*RUN, "--method", "craft", "--ratio", "4", "--checkpoint", "{root}/nope"],
        2,
        "--checkpoint",
    ),
    (
        "checkpoint-empty",
        [*RUN, "--method", "craft", "--ratio", "4", "--checkpoint", "{empty}"],
        2,
        "--checkpoint",
    ),
    (
        "checkpoint-corrupt",
        [*RUN, "--method", "craft", "--ratio", "4", "--checkpoint", "{badckpt}"],
        2,
        "--checkpoint",
    ),
    ("protocol-unknown", [*RUN, "--protocol", "mine"], 2, "protocol"),
    (
        "fallback-not-offered",
        [*RUN[:4], "videomme", *RUN[5:], "--fallback", "empty"],
        2,
        "fallback",
    ),
    (
        "egoschema-subset-bad",
        [*RUN[:4], "egoschema", *RUN[5:], "--subset", "half"],
        2,
        "subset",
    ),
    ("merge-maps-negative", [*RUN, "--merge-maps", "-1"], 2, "--merge-maps"),
    ("sweep-no-checkpoint", ["sweep", *RUN[1:], "--methods", "craft"], 2, "--checkpoint"),
    ("sweep-ratio-0", ["sweep", *RUN[1:], "--methods", "uniform", "--ratios", "0"], 2, "--ratio"),
    ("sweep-method-unknown", ["sweep", *RUN[1:], "--methods", "bogus"], 2, "bogus"),
    ("report-missing", ["report", "{root}/nope"], 2, "no such folder"),
    ("report-empty", ["report", "{empty}"], 2, "summary.json"),
    ("eff-arch-unknown", ["efficiency", "--arch", "gpt-9"], 2, "gpt-9"),
    ("eff-frames-0", ["efficiency", "--arch", "qwen2.5-vl-7b", "--frames", "0"], 2, "--frames"),
    ("eff-ratio-0.5", ["efficiency", "--arch", "qwen2.5-vl-7b", "--ratios", "0.5"], 2, "--ratios"),
    ("eff-ratio-nan", ["efficiency", "--arch", "qwen2.5-vl-7b", "--ratios", "nan"], 2, "--ratios"),
    ("eff-repeats-0", ["efficiency", "--arch", "qwen2.5-vl-7b", "--repeats", "0"], 2, "--repeats"),
    ("eff-warmup-neg", ["efficiency", "--arch", "qwen2.5-vl-7b", "--warmup=-1"], 2, "--warmup"),
    ("eff-text-neg", ["efficiency", "--arch", "qwen2.5-vl-7b", "--text-tokens=-1"], 2, "--text"),
    (
        "eff-method-unknown",
        ["efficiency", "--arch", "qwen2.5-vl-7b", "--methods", "bogus"],
        2,
        "bogus",
    ),
    # issue 25: devices, efficiency overrides, demo options (checked before anything loads)
    ("run-device-absent", [*RUN, "--device", "cuda:99"], 2, "--device cuda:99"),
    ("run-device-garbage", [*RUN, "--device", "tpu0"], 2, "--device tpu0"),
    ("sweep-device-absent", ["sweep", *RUN[1:], "--device", "cuda:99"], 2, "--device cuda:99"),
    ("eff-device-absent", [*EFF, "--device", "cuda:99"], 2, "--device cuda:99"),
    ("eff-device-garbage", [*EFF, "--device", "gpu"], 2, "--device gpu"),
    ("eff-override-unknown", [*EFF, "--override", "nosuch=3"], 2, "--override nosuch"),
    (
        "eff-method-arg-not-taken",
        [*EFF, "--methods", "craft", "divprune", "--method-arg", "compile=true"],
        2,
        "compile",
    ),
    ("eff-method-arg-bad-value", [*EFF, "--method-arg", "compile=yes"], 2, "compile"),
    ("eff-method-arg-out-of-range", [*EFF, "--method-arg", "sim_dim=600"], 2, "sim_dim"),
    ("eff-method-arg-no-equals", [*EFF, "--method-arg", "compile"], 2, "KEY=VALUE"),
    ("eff-override-no-equals", [*EFF, "--override", "hidden_size"], 2, "KEY=VALUE"),
    ("eff-override-no-key", [*EFF, "--override", "=3"], 2, "KEY=VALUE"),
    ("eff-override-text", [*EFF, "--override", "hidden_size=big"], 2, "--override hidden_size"),
    ("eff-override-bool", [*EFF, "--override", "hidden_size=true"], 2, "expected int"),
    ("eff-override-float", [*EFF, "--override", "num_hidden_layers=2.5"], 2, "expected int"),
    ("eff-override-zero", [*EFF, "--override", "num_hidden_layers=0"], 2, "positive"),
    ("eff-override-nan", [*EFF, "--override", "rms_norm_eps=NaN"], 2, "rms_norm_eps"),
    ("eff-override-inf", [*EFF, "--override", "rms_norm_eps=1e999"], 2, "rms_norm_eps"),
    ("demo-method-unknown", ["demo", "--methods", "nosuch"], 2, "--methods nosuch"),
    ("demo-method-one-bad", ["demo", "--methods", "uniform", "nosuch"], 2, "--methods nosuch"),
    ("demo-ratio-below-1", ["demo", "--ratio", "0.5"], 2, "--ratio"),
    ("demo-ratio-nan", ["demo", "--ratio", "nan"], 2, "--ratio"),
    ("demo-ratio-inf", ["demo", "--ratio", "inf"], 2, "--ratio"),
    ("demo-items-0", ["demo", "--items", "0"], 2, "--items"),
    ("demo-headline-items-negative", ["demo", "--headline-items", "-1"], 2, "--headline-items"),
    ("demo-workers-0", ["demo", "--workers", "0"], 2, "--workers"),
    ("demo-workers-text", ["demo", "--workers", "two"], 2, "--workers"),
    ("demo-family-unknown", ["demo", "--family", "triangles"], 2, "--family triangles"),
    ("demo-family-case", ["demo", "--family", "Corners"], 2, "--family Corners"),
    ("demo-methods-all-and-more", ["demo", "--methods", "all", "uniform"], 2, "--methods all"),
    ("demo-device-absent", ["demo", "--device", "cuda:99"], 2, "--device cuda:99"),
    ("demo-device-garbage", ["demo", "--device", "abc"], 2, "--device abc"),
    ("demo-backbone-unknown", ["demo", "--backbone", "gpt2"], 2, "--backbone gpt2"),
    ("demo-model-missing", ["demo", "--model", "{root}/nope"], 2, "--model"),
    (
        "demo-model-and-backbone",
        ["demo", "--model", "{nomodel}", "--backbone", "qwen2_5_vl"],
        2,
        "not both",
    ),
    ("run-output-is-a-file", [*RUN[:-1], "{afile}"], 2, "--output"),
    ("run-output-under-a-file", [*RUN[:-1], "{afile}/runs"], 2, "is a file"),
    ("sweep-output-is-a-file", ["sweep", *RUN[1:-1], "{afile}"], 2, "--output"),
    ("demo-output-is-a-file", ["demo", "-o", "{afile}"], 2, "--output"),
    ("eff-json-under-a-file", [*EFF, "--json", "{afile}/e.json"], 2, "--json"),
    ("eff-json-is-a-folder", [*EFF, "--json", "{empty}"], 2, "is a folder"),
    ("report-out-is-a-file", ["report", "{root}", "--out", "{afile}"], 2, "--out"),
    ("argparse-no-command", [], 2, "usage"),
    ("argparse-ratio-text", [*RUN, "--ratio", "abc"], 2, "--ratio"),
    ("argparse-limit-text", [*RUN, "--limit", "abc"], 2, "--limit"),
    ("argparse-ratio-and-threshold", [*UNI, "--threshold", "0.5"], 2, "not allowed"),
    ("argparse-unknown-option", [*RUN, "--colour", "red"], 2, "--colour"),
    ("argparse-dtype", ["efficiency", "--arch", "qwen2.5-vl-7b", "--dtype", "int3"], 2, "int3"),
]


@pytest.mark.parametrize(
    ("argv", "code", "text"), [c[1:] for c in USAGE_CASES], ids=[c[0] for c in USAGE_CASES]
)
def test_cli_usage_errors_are_one_line(
    world: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    code: int,
    text: str,
) -> None:
    def no_model(args: Any) -> Any:
        raise AssertionError("a usage error must be found before any model loads")

    monkeypatch.setattr(cli.common, "load_model", no_model)
    monkeypatch.setattr("craft_eval.demo.run_demo", no_model)
    monkeypatch.setattr("craft_eval.efficiency.measure_efficiency", no_model)
    names = {k: str(v) for k, v in world.items()}
    args = [a.format(**names, out=tmp_path / "out") for a in argv]
    got, err = _main(args, capsys)
    assert got == code, err
    assert text in err
    assert "Traceback" not in err


ANNOTATION_CASES: list[tuple[str, str, Any, str]] = [
    # (benchmark, field, bad value, text the error must hold)
    ("videomme", "answer", "Z", "'Z'"),
    ("videomme", "answer", "E", "'E'"),
    ("videomme", "answer", "a b", "'A B'"),
    ("egoschema", "answer", "-1", "'answer'"),
    ("egoschema", "answer", "5", "'answer'"),
    ("egoschema", "answer", "x", "'answer'"),
    ("videomme", "question_id", None, "question_id"),
]


def _rewrite_parquet(path: Path, field: str, value: Any) -> None:
    rows = pq.read_table(path).to_pylist()
    if value is None:
        for row in rows:
            row.pop(field)
    else:
        rows[1][field] = value
        rows = [{**r, field: str(r[field]) if isinstance(value, str) else r[field]} for r in rows]
    pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.mark.parametrize(("bench", "field", "value", "text"), ANNOTATION_CASES)
def test_bad_annotations_name_the_field(
    tmp_path: Path, bench: str, field: str, value: Any, text: str
) -> None:
    root = write_fixture(bench, tmp_path / bench, num_items=3, num_frames=4)
    path = next(root.rglob("*.parquet"))
    if bench == "videomme" and field == "answer":
        value = value.upper() if value == "a b" else value
    _rewrite_parquet(path, field, value)
    with pytest.raises(ValueError, match=r"answer|malformed|field") as info:
        load_items(RunConfig(bench, str(root), "m"))
    assert text.strip("'").upper() in str(info.value).upper()


BROKEN_FILES: list[tuple[str, str, bytes]] = [
    ("lvb-json-truncated", "lvb_val.json", b'[{"id": '),
    ("lvb-json-not-list-of-objects", "lvb_val.json", b"[1, 2, 3]"),
    ("lvb-json-binary", "lvb_val.json", b"\xff\xfe\x00garbage"),
    ("lvb-json-empty-list", "lvb_val.json", b"[]"),
]


@pytest.mark.parametrize(("name", "rel", "content"), BROKEN_FILES, ids=[b[0] for b in BROKEN_FILES])
def test_broken_annotation_files_are_named(
    tmp_path: Path, name: str, rel: str, content: bytes
) -> None:
    root = write_fixture("longvideobench", tmp_path / "lvb", num_items=2, num_frames=4)
    (root / rel).write_bytes(content)
    with pytest.raises(ValueError) as info:
        load_items(RunConfig("longvideobench", str(root), "m"))
    assert "lvb" in str(info.value) or "no items" in str(info.value)


def test_corrupt_parquet_is_named(tmp_path: Path) -> None:
    root = write_fixture("videomme", tmp_path / "v", num_items=2, num_frames=4)
    path = next(root.rglob("*.parquet"))
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(ValueError, match="cannot be read") as info:
        load_items(RunConfig("videomme", str(root), "m"))
    assert str(path) in str(info.value)


def test_all_videos_missing_is_an_error_not_a_zero_score(tmp_path: Path) -> None:
    root = write_fixture("mvbench", tmp_path / "mv", num_items=2, num_frames=4)
    for video in root.rglob("*.mp4"):
        video.unlink()
    with pytest.raises(FileNotFoundError, match="none of the"):
        load_items(RunConfig("mvbench", str(root), "m"))


def test_videomme_from_the_dataset_root(world: dict[str, Path]) -> None:
    """--data-root at the root of the distributed layout (parquet in videomme/, videos in
    data/): the CLI descends into videomme/ and the loader still finds every video."""
    roots = cli.common.data_roots([str(world["videomme"])], ["videomme"])
    items = load_items(RunConfig("videomme", roots["videomme"], "m"))
    assert len(items) == 4 and all(Path(i.video).is_file() for i in items)


@pytest.mark.parametrize("limit", [1, 2, 3, 4, 10])
def test_limit_is_exact(world: dict[str, Path], limit: int) -> None:
    total = len(load_items(RunConfig("mvbench", str(world["mvbench"]), "m")))
    items = load_items(RunConfig("mvbench", str(world["mvbench"]), "m", limit=limit))
    assert total == 8 and len(items) == min(limit, total)


# -- results files ------------------------------------------------------------------------------


class EchoBackend:
    """Answers "A" to everything (no model)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls = 0

    def generate(self, item: Any, prompt: Any) -> Generation:
        self.calls += 1
        time.sleep(self.delay)
        return Generation(reply="A", tokens_before=10, tokens_after=5)


TWO = TokenBudget(ratio=2.0)


def _config(world: dict[str, Path], **kw: Any) -> RunConfig:
    return RunConfig("mvbench", str(world["mvbench"]), "m", **kw)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_torn_last_line_is_dropped_and_the_run_resumes(
    world: dict[str, Path], tmp_path: Path
) -> None:
    full = run_benchmark(_config(world), EchoBackend(), tmp_path / "a", progress=False)
    run_benchmark(_config(world), EchoBackend(), tmp_path / "b", progress=False, stop_after=2)
    shard = tmp_path / "b" / "records.rank0.jsonl"
    with shard.open("a") as f:
        f.write('{"type": "item", "id": "torn')
    backend = EchoBackend()
    resumed = run_benchmark(_config(world), backend, tmp_path / "b", progress=False)
    assert backend.calls == len(load_items(_config(world))) - 2
    assert resumed is not None and full is not None
    assert resumed["scores"] == full["scores"]


@pytest.mark.parametrize(
    "bad_line",
    ["{not json", "[1, 2]", "\udcff", '"just a string"', "{}{}"],
    ids=["broken-json", "array", "bad-utf8", "string", "two-objects"],
)
def test_bad_middle_line_is_an_error_and_nothing_is_deleted(
    world: dict[str, Path], tmp_path: Path, bad_line: str
) -> None:
    run_benchmark(_config(world), EchoBackend(), tmp_path, progress=False, stop_after=3)
    shard = tmp_path / "records.rank0.jsonl"
    lines = shard.read_bytes().split(b"\n")
    lines.insert(2, bad_line.encode("utf-8", "surrogateescape"))
    shard.write_bytes(b"\n".join(lines))
    before = shard.read_bytes()
    with pytest.raises(CorruptRecords, match="line 3"):
        run_benchmark(_config(world), EchoBackend(), tmp_path, progress=False)
    assert shard.read_bytes() == before


def test_read_jsonl_never_truncates_without_repair(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n{"b": 2')
    assert _read_jsonl(path) == [{"a": 1}]
    assert path.read_text() == '{"a": 1}\n{"b": 2'
    assert _read_jsonl(path, repair=True) == [{"a": 1}]
    assert path.read_text() == '{"a": 1}\n'


def test_a_second_run_into_the_same_folder_is_refused(
    world: dict[str, Path], tmp_path: Path
) -> None:
    tmp_path.mkdir(exist_ok=True)
    lock = _Lock(tmp_path / ".lock.rank0")
    try:
        with pytest.raises(RunLocked, match="another craft-eval process"):
            run_benchmark(_config(world), EchoBackend(), tmp_path, progress=False)
    finally:
        lock.release()
    assert run_benchmark(_config(world), EchoBackend(), tmp_path, progress=False) is not None


@pytest.mark.parametrize(
    "change",
    [{"fps": 1.0}, {"max_frames": 8}, {"method_kwargs": {"seed": 3}}, {"protocol": "original"}],
    ids=["fps", "frames", "method-args", "protocol"],
)
def test_a_changed_option_never_returns_old_results(
    world: dict[str, Path], tmp_path: Path, change: dict[str, Any]
) -> None:
    base = {"method": "random", "budget": TWO}
    run_benchmark(_config(world, **base), EchoBackend(), tmp_path, progress=False)
    with pytest.raises(ValueError, match="different run"):
        run_benchmark(_config(world, **base, **change), EchoBackend(), tmp_path, progress=False)


@pytest.mark.parametrize("min_tokens", [None, 1, 4])
def test_min_tokens_is_part_of_the_run_identity(world: dict[str, Path], min_tokens: Any) -> None:
    budget = TokenBudget(threshold=0.5, min_tokens=min_tokens)
    config = _config(world, method="random", budget=budget)
    other_budget = TokenBudget(threshold=0.5, min_tokens=(min_tokens or 0) + 2)
    other = _config(world, method="random", budget=other_budget)
    assert config.run_name() != other.run_name()
    assert config.identity() != other.identity()


def test_egoschema_full_set_writes_a_submission_and_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = write_fixture("egoschema", tmp_path / "ego", num_items=2, num_frames=4)
    rows = pq.read_table(next(root.rglob("*.parquet"))).to_pylist()
    for row in rows:
        row["answer"] = None
    (root / "MC").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), root / "MC" / "test-00000-of-00001.parquet")
    config = RunConfig("egoschema", str(root), "m", subset="full")
    summary = run_benchmark(config, EchoBackend(), tmp_path / "run", progress=False)
    assert summary is not None and Path(summary["submission"]).is_file()
    assert "submission" in cli.run.score_line(summary)
    assert "n/a" in cli.run.score_line(summary)


_FULL_DISK_SCRIPT = textwrap.dedent(
    """
    import errno, resource, signal, sys
    sys.path.insert(0, {tests!r})
    from test_hostile import EchoBackend
    from craft_eval.runner import RunConfig, run_benchmark
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (1500, 1500))
    config = RunConfig("mvbench", {data!r}, "m")
    try:
        run_benchmark(config, EchoBackend(), {out!r}, progress=False)
    except OSError as error:
        print("ERRNO", error.errno)
    """
)


def test_a_full_disk_mid_run_loses_nothing_and_resumes(
    world: dict[str, Path], tmp_path: Path
) -> None:
    """A write that fails for lack of space (here: RLIMIT_FSIZE, which fails like ENOSPC
    without filling the machine's disk) stops the run with an OSError; the run resumes."""
    if sys.platform == "win32":
        pytest.skip("no RLIMIT_FSIZE")
    out = tmp_path / "full"
    script = _FULL_DISK_SCRIPT.format(
        tests=str(Path(__file__).parent), data=str(world["mvbench"]), out=str(out)
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert "ERRNO 27" in done.stdout, done.stdout + done.stderr  # EFBIG
    shard = out / "records.rank0.jsonl"
    assert shard.stat().st_size <= 1500
    kept = [r for r in _read_jsonl(shard) if r.get("type") == "item"]
    assert 0 < len(kept) < 8
    backend = EchoBackend()
    summary = run_benchmark(_config(world), backend, out, progress=False)
    assert summary is not None and backend.calls == 8 - len(kept)
    assert summary["scores"]["n_scored"] == 8


@pytest.mark.parametrize(
    ("error", "code", "text"),
    [
        (OSError(28, "No space left on device"), 1, "No space left"),
        (RuntimeError("CUDA out of memory"), 1, "out of memory"),
        (RunLocked("another craft-eval process is writing"), 1, "another craft-eval"),
        (CorruptRecords("records.rank0.jsonl: line 3"), 1, "line 3"),
        (KeyboardInterrupt(), 130, "interrupted"),
    ],
    ids=["disk-full", "oom", "locked", "corrupt", "ctrl-c"],
)
def test_runtime_failures_are_one_line(
    world: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    error: BaseException,
    code: int,
    text: str,
) -> None:
    def boom(args: Any) -> int:
        raise error

    monkeypatch.setattr(cli.run, "command", boom)
    got, err = _main(["run", "-b", "mvbench", "--data-root", str(world["mvbench"])], capsys)
    assert got == code and text in err and "Traceback" not in err
    if isinstance(error, KeyboardInterrupt):
        return
    with pytest.raises(type(error)):
        cli.main(["--debug", "run", "-b", "mvbench", "--data-root", str(world["mvbench"])])


_KILL_SCRIPT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {tests!r})
    from test_hostile import EchoBackend
    from craft_eval.runner import RunConfig, run_benchmark
    from craft_core import TokenBudget
    config = RunConfig("mvbench", {data!r}, "m", method="random", budget=TokenBudget(ratio=2.0))
    summary = run_benchmark(config, EchoBackend(delay=float(sys.argv[1])), {out!r},
                            progress=False)
    print("ACC", summary["scores"]["accuracy"])
    """
)


def test_sigkill_mid_run_then_resume_gives_the_uninterrupted_summary(
    world: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "killed"
    script = _KILL_SCRIPT.format(
        tests=str(Path(__file__).parent), data=str(world["mvbench"]), out=str(out)
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", script, "1.0"], env=env)
    shard = out / "records.rank0.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if shard.exists() and sum(1 for _ in shard.open()) >= 2:  # header + one item
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "summary.json").exists()
    kept = _read_jsonl(shard)
    assert any(r.get("type") == "item" for r in kept)
    assert not any(r.get("type") == "done" for r in kept)
    done = subprocess.run(
        [sys.executable, "-c", script, "0"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    full = run_benchmark(
        RunConfig("mvbench", str(world["mvbench"]), "m", method="random", budget=TWO),
        EchoBackend(),
        tmp_path / "full",
        progress=False,
    )
    resumed = json.loads((out / "summary.json").read_text())
    assert full is not None and resumed["scores"] == full["scores"]
    items = [r for r in _read_jsonl(shard) if r.get("type") == "item"]
    assert len(items) == len({r["id"] for r in items}) == 8


def test_efficiency_refuses_a_model_that_does_not_fit(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from craft_eval import efficiency

    monkeypatch.setattr(efficiency, "available_bytes", lambda device: 2**30)
    got, err = _main(["efficiency", "--arch", "qwen2.5-vl-7b"], capsys)
    assert got == 2 and "GiB" in err and "--override" in err and "Traceback" not in err


def test_weight_bytes_counts_on_meta() -> None:
    from craft_eval.efficiency import load_arch, weight_bytes

    arch = load_arch("qwen2.5-vl-7b")
    import torch

    gib = weight_bytes(arch, torch.float32) / 2**30
    assert 20 < gib < 35  # ~7B parameters (the text model) x 4 bytes


def test_get_benchmark_error_lists_the_known() -> None:
    with pytest.raises(KeyError, match="videomme"):
        get_benchmark("nosuch")


def test_broken_video_file_is_an_item_error(world: dict[str, Path], tmp_path: Path) -> None:
    root = write_fixture("mvbench", tmp_path / "mv", num_items=3, num_frames=4, broken=(1,))
    write_video(tmp_path / "unused.mp4", num_frames=2)
    from craft_eval.backend import read_frames
    from craft_eval.runner import VideoDecodeError

    items = load_items(RunConfig("mvbench", str(root), "m"))
    with pytest.raises(VideoDecodeError):
        read_frames(items[1].video, fps=2.0, max_frames=8)


# -- issue 25: a garbage summary.json among good ones; a demo whose configurations fail ----------

_GOOD_SUMMARY = {
    "config": {"model": "m", "method": "none", "benchmark": "mvbench"},
    "protocol": {"protocol": "lmms-eval", "reference": "lmms-eval"},
    "scores": {"accuracy": 50.0, "comp_ratio": None, "n_scored": 4, "n_errors": 0},
}
BAD_SUMMARIES: list[tuple[str, bytes]] = [
    ("not-json", b"{not json"),
    ("binary", b"\xff\xfe\x00garbage"),
    ("a-list", b"[]"),
    ("no-scores", json.dumps({"config": _GOOD_SUMMARY["config"]}).encode()),
    ("config-not-object", json.dumps({**_GOOD_SUMMARY, "config": 3}).encode()),
    ("method-missing", json.dumps({**_GOOD_SUMMARY, "config": {"model": "m"}}).encode()),
    (
        "accuracy-text",
        json.dumps({**_GOOD_SUMMARY, "scores": {"accuracy": "high"}}).encode(),
    ),
    (
        "ratio-bool",
        json.dumps(
            {**_GOOD_SUMMARY, "config": {**_GOOD_SUMMARY["config"], "ratio": True}}
        ).encode(),
    ),
    (
        "accuracy-nan",
        json.dumps({**_GOOD_SUMMARY, "scores": {"accuracy": float("nan")}}).encode(),
    ),
    (
        "no-protocol",
        json.dumps({k: v for k, v in _GOOD_SUMMARY.items() if k != "protocol"}).encode(),
    ),
]


@pytest.mark.parametrize(
    "content", [b[1] for b in BAD_SUMMARIES], ids=[b[0] for b in BAD_SUMMARIES]
)
def test_report_skips_a_garbage_summary_naming_it_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    good = tmp_path / "runs" / "m" / "good"
    good.mkdir(parents=True)
    (good / "summary.json").write_text(json.dumps(_GOOD_SUMMARY))
    bad = tmp_path / "runs" / "m" / "bad" / "summary.json"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(content)
    code, err = _main(["report", str(tmp_path / "runs")], capsys)
    assert code == 1 and str(bad) in err and "skipped" in err and "Traceback" not in err
    assert (tmp_path / "runs" / "report" / "report.md").is_file()  # the good run is reported
    # alone, the garbage file is a usage error naming it; the library call refuses it
    good.joinpath("summary.json").unlink()
    code, err = _main(["report", str(tmp_path / "runs")], capsys)
    assert code == 2 and str(bad) in err and "Traceback" not in err
    from craft_eval.report import BadSummary, collect_runs

    with pytest.raises(BadSummary, match=r"summary\.json"):
        collect_runs(tmp_path / "runs")


def test_report_control_good_summaries_exit_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "runs" / "m" / "good"
    good.mkdir(parents=True)
    (good / "summary.json").write_text(json.dumps(_GOOD_SUMMARY))
    code, err = _main(["report", str(tmp_path / "runs")], capsys)
    assert code == 0 and "skipped" not in err


@pytest.mark.parametrize(
    ("failing", "code"),
    [((), 0), (("uniform",), 1), (("none", "uniform", "random"), 1)],
    ids=["none-failed", "one-failed", "all-failed"],
)
def test_demo_exit_code_says_whether_a_configuration_failed(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    failing: tuple[str, ...],
    code: int,
) -> None:
    """The demo's pieces replaced by stubs: only its bookkeeping of failures is under test
    (one family here; both: test_demo.py)."""
    from craft_eval import demo

    stub = demo.World(None, "world", None, [demo.Family("squares", 2, None, None)])
    monkeypatch.setattr("craft_eval.backend.adapters_status", lambda: (True, ""))
    monkeypatch.setattr(demo, "_world", lambda *a: stub)
    monkeypatch.setattr(demo, "_finish", lambda *a: None)

    def job(world: Any, fam: Any, method: str, ratio: float | None, **kw: Any) -> dict[str, Any]:
        if method in failing:
            return {"method": method, "ratio": ratio, "error": "ValueError: boom"}
        return {"method": method, "ratio": ratio, "scores": {}}

    monkeypatch.setattr(demo, "run_job", job)
    argv = ["demo", "--methods", "uniform", "random", "--ratio", "4", "--workers", "1"]
    got = cli.main([*argv, "-o", str(tmp_path)])
    out = capsys.readouterr().out
    assert got == code
    if failing:
        assert f"{len(failing)} of 3 configurations FAILED" in out
        assert all(f"{m}@" in out for m in failing)
    else:
        assert "FAILED" not in out


BOOL_CONFIG_CASES: list[tuple[str, dict[str, Any], str]] = [
    # (id, RunConfig fields, option the error must name): True is not 1
    ("fps-true", {"fps": True}, "--fps"),
    ("frames-true", {"max_frames": True}, "--frames"),
    ("limit-true", {"limit": True}, "--limit"),
]
# (id, parse_budget arguments, option the error must name): the budget is parsed once, by
# the command line's parse_budget, before any RunConfig exists
BOOL_BUDGET_CASES: list[tuple[str, tuple[Any, ...], str]] = [
    ("ratio-true", ("uniform", True), "--ratio"),
    ("threshold-false", ("craft-prune", None, False), "--threshold"),
    ("min-tokens-true", ("uniform", None, 0.5, True), "--min-tokens"),
]


@pytest.mark.parametrize(
    ("fields", "option"), [c[1:] for c in BOOL_CONFIG_CASES], ids=[c[0] for c in BOOL_CONFIG_CASES]
)
def test_run_config_refuses_a_bool_for_a_number(
    world: dict[str, Path], fields: dict[str, Any], option: str
) -> None:
    with pytest.raises(ValueError, match=option):
        RunConfig("mvbench", str(world["mvbench"]), "m", **fields).validate()


@pytest.mark.parametrize(
    ("args", "option"), [c[1:] for c in BOOL_BUDGET_CASES], ids=[c[0] for c in BOOL_BUDGET_CASES]
)
def test_parse_budget_refuses_a_bool_for_a_number(args: tuple[Any, ...], option: str) -> None:
    from craft_eval.cli.common import UsageError, parse_budget

    with pytest.raises(UsageError, match=option):
        parse_budget(*args)


def test_run_config_holds_the_budget_alone(world: dict[str, Path]) -> None:
    """The budget is one TokenBudget (no copies of its fields); the one-of rule is
    craft-core's, named with the command line's options; none with --method none."""
    config = _config(world, method="uniform", budget=TWO)
    assert config.token_budget() is TWO and config.run_name() == "mvbench/uniform-r2"
    assert config.identity()["ratio"] == 2.0 and config.identity()["threshold"] is None
    with pytest.raises(ValueError, match="exactly one budget: --ratio"):
        _config(world, method="uniform").validate()
    with pytest.raises(ValueError, match="--ratio given with --method none"):
        _config(world, budget=TWO).validate()


@pytest.mark.parametrize(
    ("errors", "code"),
    [(0, 0), (2, 0), (4, 1)],
    ids=["no-item-failed", "some-failed", "all-failed"],
)
def test_run_exits_1_when_every_item_of_a_run_failed(
    world: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    errors: int,
    code: int,
) -> None:
    """Model and benchmark loop replaced: only the exit-code bookkeeping is under test."""
    monkeypatch.setattr(cli.common, "load_model", lambda args: (None, None, "m"))

    def fake_run(config: Any, backend: Any, run_dir: Any, **kwargs: Any) -> dict[str, Any]:
        bad = [{"id": i, "error": "VideoDecodeError: x"} for i in range(errors)]
        scores = {"n_items": 4, "n_scored": 4 - errors, "n_errors": errors, "errors": bad}
        return {"scores": {**scores, "accuracy": None if errors == 4 else 50.0}}

    monkeypatch.setattr(cli.run, "run_benchmark", fake_run)
    argv = [a.format(data=world["mvbench"], out=tmp_path) for a in RUN]
    got, err = _main(argv, capsys)
    assert got == code, err
    assert ("every item of" in err) == (code == 1) and "Traceback" not in err
