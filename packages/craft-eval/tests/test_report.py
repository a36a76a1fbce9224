"""Reports: results table with retention, the accuracy-vs-compression plot, merge maps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from evalhelpers import ScriptedBackend

from craft_core import TokenBudget
from craft_eval.cli import main
from craft_eval.fixtures import synthetic_frames, write_fixture
from craft_eval.report import (
    PANEL_GAP,
    collect_runs,
    merge_map_image,
    render_merge_map,
    results_table,
    save_merge_data,
    write_report,
)
from craft_eval.runner import RunConfig, run_benchmark
from craft_eval.scoring import retention


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("report")
    roots = {
        "videomme": write_fixture(
            "videomme", base / "data" / "videomme", num_items=4, num_frames=2
        ),
        "tempcompass": write_fixture(
            "tempcompass", base / "data" / "tc", num_items=4, num_frames=2
        ),
    }
    for bench, root in roots.items():
        for method, ratio in [("none", None), ("uniform", 4.0), ("uniform", 8.0)]:
            budget = None if ratio is None else TokenBudget(ratio=ratio)
            config = RunConfig(
                benchmark=bench, data_root=str(root), model="m", method=method, budget=budget
            )
            run_benchmark(
                config, ScriptedBackend(), base / "runs" / config.run_name(), progress=False
            )
    return base / "runs"


def test_table_has_every_run_and_retention(runs: Path) -> None:
    summaries = collect_runs(runs)
    assert len(summaries) == 6
    table = results_table(summaries)
    lines = table.splitlines()
    assert lines[0] == "| method | tempcompass | videomme | avg | Comp. | retention |"
    assert lines[2].startswith("| uncompressed |")
    assert any(line.startswith("| uniform @ 8x |") for line in lines)
    assert "| 100.0% |" in lines[2]  # the base run retains itself
    assert "lmms-eval 0.7.3" in table
    assert retention(30.0, 60.0) == 50.0 and retention(None, 60.0) is None


def test_write_report_and_cli(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frames = synthetic_frames(4, (32, 32))
    coords = np.stack(
        np.meshgrid(np.arange(2), np.arange(4), np.arange(4), indexing="ij"), -1
    ).reshape(-1, 3)
    assignment = np.arange(32) // 4
    save_merge_data(
        runs / "videomme" / "uniform-r8" / "merge_map_0.npz",
        frames,
        coords,
        assignment,
        np.arange(0, 32, 4),
        "t",
    )
    out = write_report(runs, tmp_path / "rep")
    assert out["plot"].stat().st_size > 1000 and out["markdown"].exists()
    assert len(out["merge_maps"]) == 1 and out["merge_maps"][0].stat().st_size > 1000
    assert main(["report", str(runs), "--out", str(tmp_path / "rep2")]) == 0
    printed = capsys.readouterr().out
    assert "| uniform @ 4x |" in printed and "accuracy_vs_compression.png" in printed


def test_merge_map_png(tmp_path: Path) -> None:
    frames = synthetic_frames(8, (48, 64))
    t, h, w = 4, 3, 4
    coords = np.stack(
        np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij"), -1
    ).reshape(-1, 3)
    assignment = np.arange(t * h * w) % 6
    path = render_merge_map(frames, coords, assignment, np.arange(6), tmp_path / "m.png", title="x")
    assert path.stat().st_size > 1000


def test_merge_map_pixels() -> None:
    """Merged patches tinted with their output token's colour (the same colour across
    frames), a lone patch left as it was, a white dot at a representative only; one panel per
    temporal position, gaps between them."""
    frames = np.full((2, 32, 32, 3), 128, dtype=np.uint8)  # flat grey: any tint shows
    coords = np.stack(np.meshgrid(np.arange(2), np.arange(2), np.arange(2), indexing="ij"),
                      -1).reshape(-1, 3)  # fmt: skip
    # tokens 0 (t0, top-left) and 4 (t1, top-left) merge into row 0; the rest stay alone
    assignment = np.array([0, 1, 2, 3, 0, 4, 5, 6])
    image, panels = merge_map_image(frames, coords, assignment, np.array([0, 1, 2, 3, 5, 6, 7]))
    assert panels == [0, 1]
    side = 32 * (256 // 32)  # small frames enlarged by a whole factor
    assert image.shape == (side, 2 * side + PANEL_GAP, 3)
    grey = 128 / 255
    corner = (slice(2, side // 8), slice(2, side // 8))  # token 0's patch, clear of its dot
    first, second = image[:, :side], image[:, side + PANEL_GAP :]
    tint = first[corner].reshape(-1, 3)
    assert np.ptp(tint, axis=0).max() < 1e-6 and np.abs(tint[0] - grey).max() > 0.05
    np.testing.assert_array_equal(second[corner].reshape(-1, 3)[0], tint[0])  # same token
    lone = first[side // 2 + 2 : side // 2 + 40, side // 2 + 2 : side // 2 + 40]  # token 3
    np.testing.assert_allclose(lone, grey, atol=1e-6)
    np.testing.assert_allclose(image[:, side : side + PANEL_GAP], 1.0)
    centre = side // 4
    assert (first[centre, centre] == 1.0).all()  # token 0 is a representative
    assert not (second[centre, centre] == 1.0).all()  # token 4 is not: no dot


def test_methods_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in ("craft", "craft-selection", "craft-prune", "random", "uniform"):
        assert f"\n{name} " in out


def test_retention_is_per_model(runs: Path, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "two"
    shutil.copytree(runs, root / "a")
    data = write_fixture("videomme", tmp_path / "d", num_items=2, num_frames=2)
    config = RunConfig(benchmark="videomme", data_root=str(data), model="other", method="none")
    run_benchmark(config, ScriptedBackend(), root / "b" / config.run_name(), progress=False)
    table = results_table(collect_runs(root))
    assert "| other: uncompressed |" in table and "| m: uniform @ 8x |" in table
    rows = {line.split(" | ")[0][2:]: line for line in table.splitlines() if line.startswith("| ")}
    assert rows["other: uncompressed"].endswith("| 100.0% |")  # against its own base run
    assert rows["m: uncompressed"].endswith("| 100.0% |")
