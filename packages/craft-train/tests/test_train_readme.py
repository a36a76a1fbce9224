"""craft-train's README examples run, as a user pastes them (a scratch working directory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from craft_testkit.readme import Block, python_blocks, run_block, shape_problems

README = Path(__file__).parents[1] / "README.md"


@pytest.mark.slow  # a two-step training run of the tiny VLM (about 10 s of CPU)
@pytest.mark.parametrize("block", python_blocks(README), ids=str)
def test_readme_example_runs(block: Block, tmp_path: Path) -> None:
    run_block(block, tmp_path)


def test_readme_has_the_front_doors_shape() -> None:
    assert not shape_problems(README)  # <= 200 lines, none over 100 characters in prose
