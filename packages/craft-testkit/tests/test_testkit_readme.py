"""craft-testkit's README: its example runs and prints what its comment says."""

from __future__ import annotations

from pathlib import Path

import pytest

from craft_testkit.readme import python_blocks, run_block, shape_problems

README = Path(__file__).parents[1] / "README.md"


def test_readme_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (block,) = python_blocks(README)
    namespace = run_block(block, tmp_path)
    assert namespace["block"].line == 4  # type: ignore[attr-defined]
    assert capsys.readouterr().out == "EXAMPLE.md:4 42\n"
    assert not shape_problems(README)
