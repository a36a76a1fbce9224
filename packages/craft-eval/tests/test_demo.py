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
        fams = [demo._Family(f, demo.FAMILY_QUESTIONS[f] * args[4], None, None) for f in families]
        return demo._World(None, "world", "trained-module", fams)

    def job(w: Any, fam: Any, method: str, ratio: float | None) -> dict[str, Any]:
        seen["jobs"].append((fam.name, method, ratio))
        if (fam.name, method) in seen["fail"]:
            return {"method": method, "ratio": ratio, "error": "ValueError: boom"}
        return {"method": method, "ratio": ratio, "scores": {}}

    monkeypatch.setattr("craft_eval.backend.adapters_status", lambda: (True, ""))
    monkeypatch.setattr(demo, "_world", world)
    monkeypatch.setattr(demo, "_run_job", job)
    monkeypatch.setattr(demo, "_finish", lambda w, rows, out: seen.update(rows=rows))
    return seen


def test_demo_runs_both_families_with_the_default_methods_and_ratios(
    stub_demo: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["demo", "-o", str(tmp_path)]) == 0
    defaults = ["divprune", "visionzip", "fastvid", "uniform", "craft-selection", "craft-prune",
                "craft", "flashvid", "holitom", "flashvid-llm", "holitom-llm"]  # fmt: skip
    expected = [("none", None)] + [(m, r) for r in (8.0, 16.0) for m in defaults]
    expected += [("craft-trained", 8.0), ("craft-trained", 16.0)]
    assert stub_demo["jobs"] == [(f, m, r) for f in ("squares", "corners") for m, r in expected]
    assert list(stub_demo["rows"]) == ["squares", "corners"]
    assert [(r["method"], r["ratio"]) for r in stub_demo["rows"]["corners"]] == expected
    assert "squares 80, corners 40" in capsys.readouterr().out  # 40 clips: 2 and 1 a clip


def test_demo_names_the_family_of_a_failed_configuration(
    stub_demo: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stub_demo["fail"] = {("corners", "uniform")}
    argv = ["demo", "--methods", "uniform", "random", "--ratio", "4", "-o", str(tmp_path)]
    assert cli.main(argv) == 1
    out = capsys.readouterr().out
    # 2 families x (none, uniform, random, craft-trained); only corners' uniform failed
    assert "1 of 8 configurations FAILED (corners:uniform@4.0)" in out
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
    world = demo._World(None, "world", None, [demo._Family(f, 1, None, None) for f in families])
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
