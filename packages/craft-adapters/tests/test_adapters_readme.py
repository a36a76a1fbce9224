"""craft-adapters' README: every Python example runs (CPU, tiny models, nothing downloaded),
and what the examples show holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from craft_testkit.readme import Block, python_blocks, run_block, shape_problems

README = Path(__file__).parents[1] / "README.md"
BLOCKS = python_blocks(README)


def test_the_readme_has_its_examples() -> None:
    assert len(BLOCKS) == 2  # the quick start and the session / payload example


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_adapters_readme_example_runs(block: Block, tmp_path: Path) -> None:
    namespace = run_block(block, tmp_path)
    craft = namespace["craft"]
    report = craft.last_compression  # type: ignore[attr-defined]
    assert report is not None and report.tokens_after == report.tokens_before // 4  # ratio 4
    if "loaded" in namespace:  # the session and the payload on disk
        answers = namespace["answers"]
        assert len(answers) == 2 and all(a.shape[0] == 1 for a in answers)  # type: ignore[attr-defined]
        loaded, video = namespace["loaded"], namespace["video"]
        assert (tmp_path / "clip.craft.safetensors").is_file()
        assert loaded.features.shape[0] == report.tokens_after  # type: ignore[attr-defined]
        assert loaded.grid == video.grid  # type: ignore[attr-defined]


def test_readme_shape() -> None:
    assert not shape_problems(README)  # <= 200 lines, none over 100 characters in prose
