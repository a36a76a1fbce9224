"""The root README's Python examples run (craft-adapters' test environment holds what they
import: craft-core, craft-adapters, transformers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from craft_testkit.readme import Block, python_blocks, run_block, shape_problems

ROOT_README = Path(__file__).parents[3] / "README.md"


@pytest.mark.parametrize("block", python_blocks(ROOT_README), ids=str)
def test_root_readme_example_runs(block: Block, tmp_path: Path) -> None:
    namespace = run_block(block, tmp_path)
    report = namespace["craft"].last_compression  # type: ignore[attr-defined]
    assert report.tokens_after == report.tokens_before // 4  # what the example prints


def test_root_readme_is_read_in_five_minutes() -> None:
    """At most 1,500 words; no prose line over 100 characters (tables and code exempt)."""
    words = len(ROOT_README.read_text(encoding="utf-8").split())
    assert words <= 1500, f"README.md: {words} words, over 1,500"
    assert not shape_problems(ROOT_README, max_lines=10**6)
