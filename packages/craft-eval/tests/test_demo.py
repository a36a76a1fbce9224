"""`craft-eval demo`'s bookkeeping with its model runs replaced by stubs (no model loads):
both families, the default methods and ratios, the stored ablation ladder, the figure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from craft_eval import cli, demo, demo_report
from craft_eval.methods import list_methods

# A sample of craft-world's ladder file (the format `craft_world.ladder_path()` names).
SAMPLE_LADDER: dict[str, Any] = {
    "family": "corners",
    "questions": 600,
    "uncompressed": 0.973,
    "ratios": [8, 16],
    "steps": [["mean rule", "craft-selection"], ["+ stage 2", "stage2"], ["DivPrune", "divprune"]],
    "results": {
        "craft-selection@8": {"accuracy": 0.863, "accuracy_se": 0.014, "kl": 1.254, "kl_se": 0.133},
        "craft-selection@16": {"accuracy": 0.712, "accuracy_se": 0.0183, "kl": 2.5, "kl_se": 0.2},
        "stage2@8": {"accuracy": 0.95, "accuracy_se": 0.0089, "kl": 0.31, "kl_se": 0.041},
        "divprune@8": {"accuracy": 0.7, "accuracy_se": 0.0187, "kl": 2.01, "kl_se": 0.15},
        "divprune@16": {"accuracy": 0.6, "accuracy_se": 0.02, "kl": 3.0, "kl_se": 0.25},
    },  # stage2@16 left out: its cells print "-"
}


@pytest.fixture
def stub_demo(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """`run_demo` with its world and model runs replaced: `seen["jobs"]` lists `(family,
    method, ratio)` in run order, `seen["rows"]` what `_finish` got; a job listed in
    `seen["fail"]` returns an error row."""
    seen: dict[str, Any] = {"jobs": [], "fail": set()}

    def world(*args: Any) -> Any:
        families = args[-1]
        seen["families"] = families
        fams = [demo.Family(f, demo.FAMILY_QUESTIONS[f] * args[4], None, None) for f in families]
        return demo.World(None, "world", "trained-module", fams)

    def more_clips(w: Any, out: Any, start: int, n: int, seed: int) -> Any:
        seen["more"] = (start, n)
        return demo.Family(demo.MORE, n, None, None)

    def job(w: Any, fam: Any, method: str, ratio: float | None, **kw: Any) -> dict[str, Any]:
        seen["jobs"].append((fam.name, method, ratio))
        if (fam.name, method) in seen["fail"]:
            return {"method": method, "ratio": ratio, "error": "ValueError: boom"}
        return {"method": method, "ratio": ratio, "scores": {}, "records": []}

    monkeypatch.setattr("craft_eval.backend.adapters_status", lambda: (True, ""))
    monkeypatch.setattr(demo, "_world", world)
    monkeypatch.setattr(demo, "_more_clips", more_clips)

    def parallel(spec: Any, todo: Any, workers: int, on_done: Any) -> list[dict[str, Any]]:
        # the pool's contract without processes: every job's row, in the order given
        seen["workers"] = workers
        rows = []
        for name, method, ratio, _profile in todo:
            rows.append(job(None, demo.Family(name, 0, None, None), method, ratio))
            on_done(name)
        return rows

    monkeypatch.setattr(demo, "run_job", job)
    monkeypatch.setattr(demo, "_worker_spec", lambda *args: None)
    monkeypatch.setattr("craft_eval.demo_pool.run_parallel", parallel)
    monkeypatch.setattr(
        demo, "_finish", lambda w, rows, out, head=None, more=None: seen.update(
            rows=rows, headline=head, more_rows=more)
    )  # fmt: skip
    return seen


def test_demo_runs_both_families_with_the_default_methods_and_ratios(
    stub_demo: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["demo", "-o", str(tmp_path)]) == 0
    defaults = ["divprune", "visionzip", "fastvid", "flashvid-llm", "holitom-llm",
                "craft-selection"]  # fmt: skip
    expected = [("none", None)] + [(m, r) for r in (8.0, 16.0) for m in defaults]
    expected += [("craft-trained", 8.0), ("craft-trained", 16.0)]
    # then the headline on 160 corners clips: the table's 40 (reused) and 120 more, on which
    # only what it needs runs, after the tables
    head = [("none", None)] + [(m, r) for r in (8.0, 16.0) for m in ("divprune", "craft-selection")]
    head += [("craft-trained", 8.0), ("craft-trained", 16.0)]
    assert stub_demo["jobs"] == [(f, m, r) for f in ("squares", "corners") for m, r in expected] + [
        ("corners-more", m, r) for m, r in head]  # fmt: skip
    assert stub_demo["more"] == (40, 120)  # clips 40..159 of the seed
    assert list(stub_demo["rows"]) == ["squares", "corners"]
    assert [(r["method"], r["ratio"]) for r in stub_demo["rows"]["corners"]] == expected
    assert [(r["method"], r["ratio"]) for r in stub_demo["headline"]] == head
    assert [(r["method"], r["ratio"]) for r in stub_demo["more_rows"]] == head
    out = capsys.readouterr().out
    assert "squares 80, corners 40" in out  # 40 clips: 2 and 1 a clip
    assert "; headline 160 corners: the table's + 7 x 120 more" in out
    assert demo.HEADLINE_ITEMS == 160


def test_demo_shares_configurations_out_between_workers_in_job_order(
    stub_demo: dict[str, Any], tmp_path: Path
) -> None:
    from craft_eval.demo_pool import default_workers

    argv = ["demo", "--methods", "uniform", "--ratio", "8", "--headline-items", "3"]
    assert cli.main([*argv, "-o", str(tmp_path / "a"), "--workers", "1"]) == 0
    alone, rows_alone = list(stub_demo["jobs"]), stub_demo["rows"]
    assert "workers" not in stub_demo  # one process: the pool is not used
    stub_demo["jobs"].clear()
    assert cli.main([*argv, "-o", str(tmp_path / "b")]) == 0
    assert stub_demo["workers"] == default_workers() >= 1
    assert stub_demo["jobs"] == alone and stub_demo["rows"] == rows_alone
    assert cli.main([*argv, "-o", str(tmp_path / "c"), "--workers", "3"]) == 0
    assert stub_demo["workers"] == 3


@pytest.mark.parametrize(
    ("argv", "trained", "more"),
    [
        (["--headline-items", "50"], True, (40, 10)),
        (["--headline-items", "12"], True, None),  # the table's first 12: nothing more runs
        (["--headline-items", "0"], True, False),
        (["--family", "squares"], True, False),  # the headline asks corners questions
        ([], False, False),  # no trained module shipped: nothing to compare
    ],
    ids=["50-clips", "12-clips", "none-asked", "no-corners", "no-trained-module"],
)
def test_demo_runs_the_headline_only_where_it_can(
    stub_demo: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    trained: bool,
    more: tuple[int, int] | bool | None,
) -> None:
    """`more`: the clips beyond the table's (start, count); None: a headline on the table's
    clips only; False: no headline."""
    if not trained:
        world = demo._world  # the stub

        def untrained(*args: Any) -> Any:
            w = world(*args)
            w.trained = None
            return w

        monkeypatch.setattr(demo, "_world", untrained)
    assert cli.main(["demo", "--ratio", "8", *argv, "-o", str(tmp_path)]) == 0
    ran = [(m, r) for f, m, r in stub_demo["jobs"] if f == "corners-more"]
    head = [("none", None), ("divprune", 8.0), ("craft-selection", 8.0), ("craft-trained", 8.0)]
    assert stub_demo.get("more") == (more or None)
    assert ran == (head if more else [])
    if more is False:
        assert stub_demo["headline"] is None
    else:
        assert [(r["method"], r["ratio"]) for r in stub_demo["headline"]] == head


def test_demo_names_a_failed_headline_configuration(
    stub_demo: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stub_demo["fail"] = {("corners-more", "divprune")}
    argv = ["demo", "--methods", "uniform", "--ratio", "8", "--family", "corners", "--items", "2"]
    assert cli.main([*argv, "--headline-items", "5", "-o", str(tmp_path)]) == 1
    # corners: none, uniform, the headline's divprune and craft-selection, craft-trained; its 3
    # more clips: none, divprune, craft-selection, craft-trained
    assert "1 of 9 configurations FAILED (corners-more:divprune@8.0)" in capsys.readouterr().out
    (divprune,) = [r for r in stub_demo["headline"] if r["method"] == "divprune"]
    assert divprune["error"] == "more: ValueError: boom"


def _records(kl: list[float], correct: list[int], order: list[int] | None = None) -> list[Any]:
    """A run's records over questions q0, q1, ... (in `order` when given: pairing is by id)."""
    rows = [{"id": f"q{i}", "first_token_kl": k, "first_token_correct": bool(c)}
            for i, (k, c) in enumerate(zip(kl, correct))]  # fmt: skip
    return [rows[i] for i in order] if order is not None else rows


def _plain_pair(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean of a - b and its standard error, written out (not craft_eval.scoring)."""
    d = [x - y for x, y in zip(a, b)]
    mean = sum(d) / len(d)
    return mean, (sum((x - mean) ** 2 for x in d) / (len(d) - 1)) ** 0.5 / len(d) ** 0.5


# 8 questions: the trained module close to the uncompressed answer on all; DivPrune far and
# wrong on 3; the mean rule close and right on all (a KL drop but no accuracy gain).
KL_T = [0.1, 0.2, 0.1, 0.3, 0.2, 0.1, 0.2, 0.1]
KL_D = [1.5, 1.2, 1.9, 1.4, 1.0, 1.6, 1.3, 1.8]
KL_S = [0.4, 0.3, 0.5, 0.2, 0.6, 0.2, 0.4, 0.5]
HIT_T, HIT_D, HIT_S = [1] * 8, [1, 0, 1, 0, 1, 1, 0, 1], [1] * 8


def test_demo_headline_line_is_computed_from_the_records(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Per ratio ONE line: the trained module vs DivPrune and vs the mean rule, paired by
    question id (the rivals' records in other orders), KL drop +- SE (n SE), accuracy points
    +- paired SE, and whether it meets >= 3 SE and >= 3 points; a rival whose run failed or
    scored other questions is named, not paired."""
    shuffled = [3, 0, 7, 5, 1, 6, 2, 4]
    rows = [
        {"method": "none", "ratio": None, "records": _records([0.0] * 8, HIT_T)},
        {"method": "divprune", "ratio": 8.0, "records": _records(KL_D, HIT_D, shuffled)},
        {"method": "craft-selection", "ratio": 8.0,
         "records": _records(KL_S, HIT_S, shuffled[::-1])},
        {"method": "divprune", "ratio": 16.0, "records": _records(KL_D[:7], HIT_D[:7])},
        {"method": "craft-selection", "ratio": 16.0, "error": "ValueError: boom"},
        {"method": "craft-trained", "ratio": 8.0, "records": _records(KL_T, HIT_T)},
        {"method": "craft-trained", "ratio": 16.0, "records": _records(KL_T, HIT_T)},
    ]  # fmt: skip
    results = demo_report.headline_results(rows)
    demo_report.print_headline(results)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("  ")]
    assert out.splitlines()[1].startswith("HEADLINE (8 held-out corners questions")
    assert len(lines) == 2 and lines[0].startswith("  8x: ") and lines[1].startswith("  16x: ")
    want = []
    for rival, kl, hits in (("divprune", KL_D, HIT_D), ("craft-selection", KL_S, HIT_S)):
        drop, se = _plain_pair(kl, KL_T)
        gain, gain_se = _plain_pair([100.0 * h for h in HIT_T], [100.0 * h for h in hits])
        meets = drop / se >= 3 and gain >= 3
        want.append(
            f"vs {rival} KL drop {drop:+.3f} +- {se:.3f} ({drop / se:+.1f} SE), accuracy "
            f"{gain:+.1f} +- {gain_se:.1f} points: {'MEETS' if meets else 'does NOT meet'}"
        )
    assert lines[0] == "  8x: " + "; ".join(want)
    assert lines[0] == (
        "  8x: vs divprune KL drop +1.300 +- 0.125 (+10.4 SE), accuracy +37.5 +- 18.3 points: "
        "MEETS; vs craft-selection KL drop +0.225 +- 0.065 (+3.5 SE), accuracy +0.0 +- 0.0 "
        "points: does NOT meet"  # >= 3 SE of KL but no accuracy gain: the goal asks both
    )
    assert lines[1] == (
        "  16x: vs divprune not paired: the runs scored different questions (8 and 7, 1 not in "
        "both); vs craft-selection not paired: its run failed"
    )  # fmt: skip
    md = demo_report.headline_markdown(results)
    assert "| 8x | divprune | 8 | +1.300 | 0.125 | +10.4 | +37.5 | 18.3 | MEETS |" in md
    assert "| 16x | craft-selection | not paired: its run failed |" in md


def test_demo_headline_without_the_trained_module_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = [{"method": "divprune", "ratio": 8.0, "records": _records(KL_D, HIT_D)},
            {"method": "craft-trained", "ratio": 8.0, "error": "ValueError: boom"}]  # fmt: skip
    demo_report.print_headline(demo_report.headline_results(rows))
    assert "no paired result: craft-trained did not run" in capsys.readouterr().out


def _indexed(kl: list[float], correct: list[int]) -> list[dict[str, Any]]:
    """A run folder's records: ids and indexes counted from 0, as the runner numbers them."""
    return [{**r, "index": i, "id": f"moving_direction/{i}"}
            for i, r in enumerate(_records(kl, correct))]  # fmt: skip


def test_headline_rows_join_the_tables_first_questions_and_the_more_clips(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The headline pairs the corners table's first n questions (its records reused) and the
    clips beyond them: each folder counts its questions from 0, so the ids are kept apart;
    the paired figures are those over all of them; a configuration that failed in either
    part is named with the part."""
    cut, n = 5, 3  # the table ran 5 clips; the headline asks for its first 3 and 3 more

    def row(method: str, ratio: float | None, kl: list[float], hits: list[int], part: str):
        half = slice(0, cut) if part == "table" else slice(cut, cut + 3)
        return {"method": method, "ratio": ratio, "records": _indexed(kl[half], hits[half])}

    runs = {"table": [], "more": []}
    for part in runs:
        for method, kl, hits in (("none", [0.0] * 8, HIT_T), ("divprune", KL_D, HIT_D),
                                 ("uniform", KL_S, HIT_D), ("craft-selection", KL_S, HIT_S),
                                 ("craft-trained", KL_T, HIT_T)):  # fmt: skip
            runs[part].append(row(method, None if method == "none" else 8.0, kl, hits, part))
    rows = demo_report.headline_rows(runs["table"], runs["more"], n)
    assert [r["method"] for r in rows] == ["none", "divprune", "craft-selection", "craft-trained"]
    ids = [r["id"] for r in rows[1]["records"]]
    assert ids == [f"table:moving_direction/{i}" for i in range(3)] + [
        f"more:moving_direction/{i}" for i in range(3)]  # fmt: skip
    (vs_divprune, _) = demo_report.headline_results(rows)
    used = [0, 1, 2, 5, 6, 7]  # the table's first 3 questions, then the 3 more
    drop, se = _plain_pair([KL_D[i] for i in used], [KL_T[i] for i in used])
    assert vs_divprune["n"] == 6
    assert vs_divprune["kl_drop"] == pytest.approx(drop) and vs_divprune["kl_se"] == pytest.approx(
        se
    )
    # without more clips: the table's first n only
    alone = demo_report.headline_rows(runs["table"], None, n)
    assert [r["id"] for r in alone[1]["records"]] == [
        f"table:moving_direction/{i}" for i in range(3)
    ]
    runs["table"][4] = {"method": "craft-trained", "ratio": 8.0, "error": "ValueError: boom"}
    del runs["more"][3]  # craft-selection did not run on the more clips
    failed = demo_report.headline_rows(runs["table"], runs["more"], n)
    assert failed[2]["error"] == "more: not run"
    assert failed[3]["error"] == "table: ValueError: boom"


def test_demo_names_the_family_of_a_failed_configuration(
    stub_demo: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stub_demo["fail"] = {("corners", "uniform")}
    argv = ["demo", "--methods", "uniform", "random", "--ratio", "4", "-o", str(tmp_path)]
    assert cli.main(argv) == 1
    out = capsys.readouterr().out
    # 2 families x (none, uniform, random, the headline's divprune and craft-selection,
    # craft-trained) + on its more clips none, divprune, craft-selection, craft-trained; only
    # corners' uniform failed
    assert "1 of 16 configurations FAILED (corners:uniform@4.0)" in out
    assert "error" not in str(stub_demo["rows"]["squares"])


@pytest.mark.parametrize(
    ("argv", "families", "methods"),
    [
        (["--family", "corners"], ("corners",), None),
        (["--family", "squares"], ("squares",), None),
        (["--family", "both", "--methods", "all"], ("squares", "corners"), "all"),
    ],
    ids=["corners", "squares", "all-methods"],
)
def test_demo_family_and_methods_options(
    stub_demo: dict[str, Any],
    tmp_path: Path,
    argv: list[str],
    families: tuple[str, ...],
    methods: str | None,
) -> None:
    assert cli.main(["demo", "--ratio", "8", *argv, "-o", str(tmp_path)]) == 0
    assert stub_demo["families"] == families and tuple(stub_demo["rows"]) == families
    ran = {m for f, m, r in stub_demo["jobs"] if r is not None} - {"craft-trained"}
    want = {m.name for m in list_methods()} if methods == "all" else set(demo.DEMO_METHODS)
    assert ran == want


def _ladder_rows(out: str) -> dict[str, list[str]]:
    """The ladder table's cells by step label, split on the two-space column gaps."""
    rows = {}
    for line in out.splitlines():
        if line.startswith(("mean rule", "+ stage 2", "DivPrune")):
            label, _, rest = line.partition(")")
            rows[label + ")"] = [c.strip() for c in rest.split("  ") if c.strip()]
    return rows


def test_demo_prints_the_stored_ladder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import craft_world

    path = tmp_path / "ladder.json"
    path.write_text(json.dumps(SAMPLE_LADDER))
    monkeypatch.setattr(craft_world, "ladder_path", lambda: path, raising=False)
    demo_report.print_ladder(demo_report.ladder_file())
    out = capsys.readouterr().out
    assert (
        "The paper's ablation ladder, measured on 600 held-out corners questions "
        "(packages/craft-world/docs/crowd.md)" in out
    )
    assert "STORED measurements" in out and "not this run's" in out and "97.3" in out
    header = next(line for line in out.splitlines() if line.startswith("step"))
    assert header.split()[1:] == ["8x", "accuracy", "8x", "KL", "to", "unc.",
                                  "16x", "accuracy", "16x", "KL", "to", "unc."]  # fmt: skip
    rows = _ladder_rows(out)
    assert list(rows) == ["mean rule (craft-selection)", "+ stage 2 (stage2)",
                          "DivPrune (divprune)"]  # fmt: skip
    for (label, key), cells in zip(SAMPLE_LADDER["steps"], rows.values()):
        want = []
        for r in SAMPLE_LADDER["ratios"]:  # the reference: the file's figures, in points
            e = SAMPLE_LADDER["results"].get(f"{key}@{r}")
            want += ["-", "-"] if e is None else [
                f"{round(100 * e['accuracy'], 1):.1f} +- {round(100 * e['accuracy_se'], 1):.1f}",
                f"{e['kl']:.3f} +- {e['kl_se']:.3f}",
            ]  # fmt: skip
        assert cells == want, label
    assert rows["mean rule (craft-selection)"][:2] == ["86.3 +- 1.4", "1.254 +- 0.133"]


def test_demo_ladder_keys_name_the_ratio_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ratios stored as 8.0 still find the "<key>@8" entries."""
    path = tmp_path / "ladder.json"
    path.write_text(json.dumps({**SAMPLE_LADDER, "ratios": [8.0, 16.0]}))
    demo_report.print_ladder(path)
    cells = _ladder_rows(capsys.readouterr().out)["mean rule (craft-selection)"]
    assert cells == ["86.3 +- 1.4", "1.254 +- 0.133", "71.2 +- 1.8", "2.500 +- 0.200"]


@pytest.mark.parametrize("case", ["no-function", "no-file", "not-json", "no-steps"])
def test_demo_says_when_the_ladder_is_not_available(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    import craft_world

    path = tmp_path / "ladder.json"
    if case == "no-function":
        monkeypatch.delattr(craft_world, "ladder_path", raising=False)
    else:
        monkeypatch.setattr(craft_world, "ladder_path", lambda: path, raising=False)
    if case == "not-json":
        path.write_text("{not json")
    if case == "no-steps":
        path.write_text(json.dumps({k: v for k, v in SAMPLE_LADDER.items() if k != "steps"}))
    demo_report.print_ladder(demo_report.ladder_file())
    out = capsys.readouterr().out.strip()
    assert out.startswith("The measured ablation ladder is not available") and "\n" not in out
    if case == "no-steps":
        assert "'steps'" in out


@pytest.mark.parametrize("families", [("squares", "corners"), ("squares",)])
def test_demo_prints_the_ladder_after_the_corners_table(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    families: tuple[str, ...],
) -> None:
    monkeypatch.setattr(demo_report, "print_table", lambda f, *a: print(f"TABLE {f}"))
    monkeypatch.setattr(demo_report, "print_paired", lambda rows: print("PAIRED"))
    monkeypatch.setattr(demo_report, "print_ladder", lambda path: print("LADDER"))
    monkeypatch.setattr(demo_report, "plot_families", lambda rows, path: path)
    world = demo.World(None, "world", None, [demo.Family(f, 1, None, None) for f in families])
    rows = {f: [{"method": "none", "ratio": None, "error": "x"}] for f in families}
    demo._finish(world, rows, tmp_path)
    marks = [m for m in capsys.readouterr().out.split() if m.isupper() and m.isalpha()]
    want = ["TABLE", "PAIRED", "TABLE", "PAIRED", "LADDER"] if "corners" in families else [
        "TABLE", "PAIRED"]  # fmt: skip
    assert [m for m in marks if m in {"TABLE", "PAIRED", "LADDER"}] == want


def test_demo_plot_has_a_panel_per_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each panel: its family's accuracies (+- binomial SE) vs ratio, craft-trained bold, the
    uncompressed accuracy dashed."""
    from matplotlib.figure import Figure

    panels: list[dict[str, Any]] = []

    def record(fig: Any, path: Any, **kwargs: Any) -> None:
        for ax in fig.axes:
            curves = {c.get_label(): c.lines[0] for c in ax.containers}
            dashed = [
                line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"
            ]
            panels.append({"title": ax.get_title(), "curves": curves, "dashed": dashed})

    monkeypatch.setattr(Figure, "savefig", record)

    def rows(acc: float) -> list[dict[str, Any]]:
        def scores(a: float) -> dict[str, Any]:
            return {"micro_accuracy": a, "n_scored": 40}

        return [
            {"method": "none", "ratio": None, "scores": scores(acc)},
            {"method": "uniform", "ratio": 16.0, "scores": scores(acc - 20)},
            {"method": "uniform", "ratio": 8.0, "scores": scores(acc - 10)},
            {"method": "craft-trained", "ratio": 8.0, "scores": scores(acc - 1)},
            {"method": "visionzip", "ratio": 8.0, "error": "ValueError: boom"},
        ]

    demo_report.plot_families({"squares": rows(90.0), "corners": rows(60.0)}, tmp_path / "p.png")
    assert [p["title"] for p in panels] == ["squares", "corners"]
    for panel, acc in zip(panels, (90.0, 60.0)):
        assert set(panel["curves"]) == {"uniform", "craft-trained"} and panel["dashed"] == [acc]
        uniform, trained = panel["curves"]["uniform"], panel["curves"]["craft-trained"]
        assert list(uniform.get_xdata()) == [8.0, 16.0]
        assert list(uniform.get_ydata()) == [acc - 10, acc - 20]
        assert trained.get_linewidth() > uniform.get_linewidth()
