"""craft-world's README: every Python example runs (the shipped backbone, clips written to a
temporary folder, nothing downloaded), what it prints holds, and the README keeps the front
door's shape (<= 200 lines, no line over 100 characters outside tables and code)."""

from __future__ import annotations

from pathlib import Path

import pytest

from craft_testkit.readme import Block, python_blocks, run_block, shape_problems

README = Path(__file__).parents[1] / "README.md"
BLOCKS = python_blocks(README)


def test_the_readme_has_its_example() -> None:
    assert len(BLOCKS) == 1  # the packaging check's example: the backbone and 20 clips


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_world_readme_example_runs(block: Block, tmp_path: Path) -> None:
    namespace = run_block(block, tmp_path)
    model, questions = namespace["model"], namespace["questions"]
    assert model.config.model_type == "qwen2_5_vl"  # type: ignore[attr-defined]
    assert sum(p.numel() for p in model.parameters()) == 839_936  # type: ignore[attr-defined]
    assert len(questions) == 20 and questions[0]["question"].startswith("Is there a")  # type: ignore[arg-type,index]


def test_readme_shape() -> None:
    assert not shape_problems(README)  # <= 200 lines, none over 100 characters in prose
