"""craft-eval's README: every Python example runs (CPU, tiny models, nothing downloaded),
and the figures the examples print hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from craft_testkit.readme import Block, python_blocks, run_block, shape_problems

README = Path(__file__).parents[1] / "README.md"
BLOCKS = python_blocks(README)


def test_the_readme_has_its_examples() -> None:
    assert len(BLOCKS) == 2  # a benchmark run, the methods with the FLOPs figure


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_eval_readme_example_runs(
    block: Block, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = run_block(block, tmp_path)
    printed = capsys.readouterr().out
    if "summary" in namespace:  # the benchmark run on a tiny model
        scores = namespace["scores"]
        assert scores["n_scored"] == 4 and scores["n_errors"] == 0  # type: ignore[index]
        assert scores["comp_ratio"] == 4.5  # type: ignore[index]  # 9 tokens -> floor(9 / 4)
        run = tmp_path / "runs/tiny/videomme/divprune-r4"
        assert json.loads((run / "summary.json").read_text())["scores"] == scores
        assert len((run / "records.jsonl").read_text().splitlines()) >= 4
        assert "4 items; comp. ratio 4.5" in printed  # what the README's comment says
    else:  # every method keeps exactly floor(N / ratio); the FLOPs figure of the table
        assert printed.count("256 -> 32 tokens") == 5, printed  # the comment: 256 -> 32
        assert namespace["out"].features.shape[0] == 256 // 8  # type: ignore[attr-defined]
        assert "8192 88.6%" in printed
        assert namespace["n"] == 8192
        reduction = namespace["flops_reduction"](  # type: ignore[operator]
            namespace["arch"]["text_config"],  # type: ignore[index]
            8192 + 128,
            1024 + 128,
        )
        assert f"{reduction:.1%}" == "88.6%"  # the README's table, Qwen2.5-VL-7B at 8x
        assert "88.6%" in README.read_text(encoding="utf-8")


def test_readme_shape() -> None:
    assert not shape_problems(README)  # <= 200 lines, none over 100 characters in prose
