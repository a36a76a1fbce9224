"""The whole pipeline on a tiny random VLM: reader -> processor -> adapter -> compressor ->
generate -> parser -> scorer, plus the CLI and the demo."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from craft_core import TokenBudget
from craft_eval.backend import HFBackend, build_model_inputs, read_frames
from craft_eval.fixtures import write_fixture
from craft_eval.runner import RunConfig, VideoDecodeError, run_benchmark
from craft_eval.tasks import Prompt, get_benchmark

TASKS = "moving_direction,object_existence"
BACKBONE = "llava_onevision"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    from craft_adapters.tiny import build_tiny_vlm

    return build_tiny_vlm(BACKBONE, tmp_path_factory.mktemp("tiny"))  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mvbench")
    return write_fixture("mvbench", root, num_items=2, num_frames=16, broken=(1,))


def test_reader_errors_become_decode_errors(data: Path, tmp_path: Path) -> None:
    items = get_benchmark("mvbench").load(data, subset=TASKS)
    frames, fps, capped = read_frames(items[0].video, fps=2.0, max_frames=64)
    assert frames.shape == (4, 96, 96, 3) and fps == 2.0 and not capped
    frames, fps, capped = read_frames(items[0].video, fps=2.0, max_frames=2)
    assert frames.shape[0] == 2 and capped and fps < 2.0
    with pytest.raises(VideoDecodeError):
        read_frames(items[1].video, fps=2.0, max_frames=8)  # written broken
    with pytest.raises(VideoDecodeError, match="not found"):
        read_frames(str(tmp_path / "missing.mp4"), fps=2.0, max_frames=8)
    seg, _, _ = read_frames(items[0].video, fps=8.0, max_frames=64, segment=(0.5, 1.0))
    assert 1 <= seg.shape[0] <= 5


def _config(data: Path, method: str, ratio: float | None, max_frames: int) -> RunConfig:
    return RunConfig(
        benchmark="mvbench",
        data_root=str(data),
        model="tiny",
        method=method,
        budget=None if ratio is None else TokenBudget(ratio=ratio),
        subset=TASKS,
        max_frames=max_frames,
    )


def test_end_to_end_uncompressed_and_compressed(
    tiny: tuple[Any, Any], data: Path, tmp_path: Path
) -> None:
    model, processor = tiny
    results = {}
    for method, ratio in [("none", None), ("uniform", 4.0), ("craft-selection", 4.0)]:
        config = _config(data, method, ratio, max_frames=8)
        run_dir = tmp_path / config.run_name()
        backend = HFBackend(
            model,
            processor,
            method=method,
            ratio=ratio,
            max_frames=8,
            merge_map_dir=run_dir,
            merge_maps=1,
        )
        summary = run_benchmark(config, backend, run_dir, progress=False)
        assert summary is not None
        results[method] = (summary["scores"], run_dir)
    base, _ = results["none"]
    assert base["n_items"] == 4 and base["n_errors"] == 1
    assert base["comp_ratio"] == pytest.approx(1.0)
    for method in ("uniform", "craft-selection"):
        scores, run_dir = results[method]
        assert scores["tokens_before_mean"] == base["tokens_before_mean"]
        assert scores["tokens_after_mean"] < scores["tokens_before_mean"]
        assert scores["comp_ratio"] > 2.5
        assert scores["kv_mb_mean"] < base["kv_mb_mean"]
        assert scores["prefill_len_mean"] < base["prefill_len_mean"]
        assert scores["compress_ms_mean"] is not None
        assert (run_dir / "merge_map_0.npz").exists()
        rows = [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines()[1:]]
        ok = [r for r in rows if r["status"] == "ok"]
        assert all(isinstance(r["reply"], str) and r["prefill_ms"] > 0 for r in ok)


def test_profile_reports_median_timings(tiny: tuple[Any, Any], data: Path) -> None:
    model, processor = tiny
    item = get_benchmark("mvbench").load(data, subset=TASKS)[0]
    backend = HFBackend(model, processor, method="uniform", ratio=4.0, max_frames=8)
    prof = backend.profile(item, get_benchmark("mvbench").prompt(item), warmup=1, repeats=2)
    assert prof["prefill_ms"] > 0 and prof["compress_ms"] is not None and prof["kv_mb"] > 0
    assert "median of 2 after 1 warm-up" in prof["timing"]


def test_original_protocol_system_prompt_and_forced_start(
    tiny: tuple[Any, Any], data: Path
) -> None:
    _, processor = tiny
    item = get_benchmark("mvbench").load(data, subset=TASKS)[0]
    frames, fps, _ = read_frames(item.video, fps=2.0, max_frames=4)
    prompt = get_benchmark("mvbench").prompt(item, "original")
    inputs = build_model_inputs(processor, frames, fps, prompt)
    text = processor.tokenizer.decode(inputs["input_ids"][0])
    assert "Carefully watch the video" in text
    assert text.endswith("assistant\nBest option:(")
    plain = build_model_inputs(processor, frames, fps, Prompt("hi", 4))
    assert processor.tokenizer.decode(plain["input_ids"][0]).endswith("assistant\n")


@pytest.fixture
def cli(tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """`craft_eval.cli` whose model loader returns the tiny model."""
    from craft_eval import cli

    monkeypatch.setattr(cli.common, "load_model", lambda args: (tiny[0], tiny[1], "tiny"))
    return cli


def test_cli_run_uses_the_pipeline(
    cli: Any, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(
        [
            "run",
            "--tiny",
            BACKBONE,
            "-b",
            "mvbench",
            "--data-root",
            f"mvbench={data}",
            "--subset",
            TASKS,
            "--method",
            "random",
            "--ratio",
            "4",
            "--frames",
            "8",
            "-o",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert code == 0
    summary = json.loads((tmp_path / "tiny" / "mvbench" / "random-r4" / "summary.json").read_text())
    assert summary["config"]["method"] == "random" and summary["scores"]["n_errors"] == 1
    assert "mvbench/random-r4: accuracy" in capsys.readouterr().out


@pytest.mark.slow
def test_demo_runs_in_the_world_and_keeps_what_it_did_not_create(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from craft_eval.demo import run_demo

    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "mine.txt").write_text("not the demo's")  # `craft-eval demo -o .`
    code = run_demo(
        methods=["craft-selection"], ratio=8.0, output=tmp_path, num_items=3, headline_items=4
    )
    assert code == 0
    assert (tmp_path / "runs" / "mine.txt").read_text() == "not the demo's"
    out = capsys.readouterr().out
    assert "the world's trained backbone" in out and "FLOPs red." in out and "KL to unc." in out
    squares, corners = out.split("[4/4] corners")  # both families, each its own table
    # the headline: the table's 3 corners clips and 1 more, one line at 8x vs DivPrune and the
    # mean rule
    corners, head = corners.split("\nHEADLINE (4 held-out corners questions")
    (line,) = [x for x in head.splitlines() if x.startswith("  8x: ")]
    assert line.count(" SE), accuracy ") == 2 and "not paired" not in line
    assert line.startswith("  8x: vs divprune KL drop ") and "; vs craft-selection KL drop " in line
    assert line.endswith(("MEETS", "does NOT meet"))
    md = (tmp_path / "report" / "corners-headline" / "report.md").read_text()
    assert "## Headline: craft-trained vs DivPrune" in md and "| 8x | divprune | 4 |" in md
    rows = {line.split()[0]: line for line in squares.splitlines() if "+-" in line}
    # the first-token KL of the uncompressed model against itself is 0; the paired line names
    # the other method with its SE
    assert "0.000 +- 0.000" in rows["none"]
    assert any(
        line.strip().startswith("vs craft-selection") and " SE)" in line
        for line in squares.splitlines()
    )
    assert set(rows) >= {"none", "craft-selection", "craft-trained"}
    assert "8x" in rows["craft-trained"] and "144 -> 18" in rows["craft-selection"]
    # compress ms next to the prefill time it saves (uncompressed prefill minus this one)
    assert "compress ms prefill saved" in out
    cells = rows["craft-selection"].split()  # method ratio N -> n prefill compress saved ...
    none_prefill = float(rows["none"].split()[5])
    assert float(cells[7]) == pytest.approx(none_prefill - float(cells[5]), abs=0.11)
    assert float(cells[6]) > 0 and rows["none"].split()[7] == "-"
    # 6 squares questions: the accuracy is k/6 and its standard error sqrt(p (1 - p) / 6).
    acc = float(rows["none"].split("+-")[0].split()[-1])
    assert any(abs(acc - 100 * k / 6) < 0.06 for k in range(7))
    # 3 corners questions (one a clip), the same configurations
    corner_rows = {line.split()[0] for line in corners.splitlines() if "+-" in line}
    assert corner_rows >= {"none", "craft-selection", "craft-trained"}
    assert "(3 questions;" in corners and "(6 questions;" in squares
    assert (tmp_path / "report" / "accuracy_vs_ratio.png").exists()
    for family in ("squares", "corners"):
        assert (tmp_path / "report" / family / "accuracy_vs_compression.png").exists()
        assert (tmp_path / "runs" / "world" / family / "mvbench" / "none").is_dir()
    headline_runs = tmp_path / "runs" / "world" / "corners-more" / "mvbench"
    assert sorted(p.name for p in headline_runs.iterdir()) == [
        "craft-selection-r8", "craft-trained-r8", "divprune-r8", "none"]  # fmt: skip
    # A second run resumes from the records instead of deleting them: the same lines.
    code = run_demo(
        methods=["craft-selection"], ratio=8.0, output=tmp_path, num_items=3, headline_items=4
    )
    assert code == 0
    assert line in capsys.readouterr().out


@pytest.mark.slow
def test_demo_workers_record_what_one_process_records(tmp_path: Path) -> None:
    """The same configurations run by 2 spawned workers and in this one process: every
    question's record the same (reply, kept tokens, option hit; the KL to float32 noise,
    the workers' torch runs 1 thread where this process may run more)."""
    from craft_eval.demo import run_demo
    from craft_eval.runner import run_records

    def records(out: Path) -> dict[str, dict[str, Any]]:
        got = {}
        for run in sorted((out / "runs" / "world").glob("*/mvbench/*/")):
            for r in run_records(run):
                got[f"{run.parent.parent.name}/{run.name}/{r['id']}"] = r
        return got

    sizes = dict(methods=["divprune"], ratio=8.0, num_items=2, headline_items=3)
    assert run_demo(**sizes, families=("corners",), output=tmp_path / "one", workers=1) == 0
    assert run_demo(**sizes, families=("corners",), output=tmp_path / "two", workers=2) == 0
    one, two = records(tmp_path / "one"), records(tmp_path / "two")
    # corners: none, divprune, the headline's mean rule, trained x 2 clips; the headline's 1
    # more clip: the same 4
    assert sorted(one) == sorted(two) and len(one) == 4 * 2 + 4 * 1
    for key, mine in one.items():
        theirs = two[key]
        for field in ("reply", "first_token_correct", "tokens_after"):
            assert mine.get(field) == theirs.get(field), (key, field)
        digests = [r.get("extra", {}).get("kept_digests") for r in (mine, theirs)]
        assert digests[0] == digests[1], key  # the tokens kept and their rows (None: none)
        assert theirs["first_token_kl"] == pytest.approx(mine["first_token_kl"], rel=1e-5,
                                                          abs=1e-7), key  # fmt: skip


@pytest.mark.slow
def test_demo_wraps_each_configuration_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One wrap of the model per configuration (the uncompressed one is also the KL
    reference); the KL is measured on the same wrapped model the run generated with."""
    import craft_adapters
    from craft_eval.demo import run_demo

    real, wrapped = craft_adapters.wrap, []

    def counting_wrap(model: Any, compressor: Any = None, **kwargs: Any) -> Any:
        wrapped.append(compressor)
        return real(model, compressor, **kwargs)

    monkeypatch.setattr(craft_adapters, "wrap", counting_wrap)
    code = run_demo(
        methods=["uniform"], ratio=8.0, output=tmp_path, num_items=1, families=("squares",)
    )
    assert code == 0 and "3 configurations" in capsys.readouterr().out
    # none, uniform @ 8x, craft-trained @ 8x: three wraps, three different compressors
    assert len(wrapped) == 3 and wrapped[0] is None
    assert wrapped[1] is not wrapped[2] and None not in wrapped[1:]


def test_binomial_standard_error() -> None:
    from craft_eval.demo import binomial_se

    assert binomial_se(50.0, 100) == pytest.approx(5.0)
    assert binomial_se(100.0, 10) == 0.0 and binomial_se(None, 10) is None


def test_cli_sweep_runs_base_and_grid_then_reports(
    cli: Any, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sweep", "--tiny", BACKBONE, "-b", "mvbench", "--data-root", str(data)]
    argv += ["--subset", TASKS, "--methods", "uniform", "--ratios", "2", "4", "--frames", "8"]
    assert cli.main([*argv, "-o", str(tmp_path), "--no-progress", "--limit", "2"]) == 0
    for run in ("none", "uniform-r2", "uniform-r4"):
        assert (tmp_path / "tiny" / "mvbench" / run / "summary.json").exists()
    out = capsys.readouterr().out
    assert "| uniform @ 4x |" in out and "accuracy_vs_compression.png" in out


def test_internvl_through_the_pipeline_counts_its_video_tokens(data: Path, tmp_path: Path) -> None:
    """InternVL's placeholder is its image context token: the uncompressed run counts the
    same visual tokens as the compressed one reports (4 frames x 16 per tiny tile)."""
    from craft_adapters.tiny import build_tiny_vlm

    model, processor = build_tiny_vlm("internvl", tmp_path / "internvl")
    scores = {}
    for method, ratio in [("none", None), ("uniform", 4.0)]:
        config = _config(data, method, ratio, max_frames=4)
        backend = HFBackend(model, processor, method=method, ratio=ratio, max_frames=4)
        summary = run_benchmark(config, backend, tmp_path / config.run_name(), progress=False)
        assert summary is not None
        scores[method] = summary["scores"]
    assert scores["none"]["tokens_before_mean"] == scores["uniform"]["tokens_before_mean"] == 64
    assert scores["none"]["comp_ratio"] == pytest.approx(1.0)
    assert scores["uniform"]["tokens_after_mean"] == 16
