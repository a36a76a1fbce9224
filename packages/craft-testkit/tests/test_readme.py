"""`craft_testkit.readme`: blocks found where a reader sees them, run alone, failures pointing
at the README's line, and this package's own README example run."""

from __future__ import annotations

import traceback
import unittest
from pathlib import Path

import pytest

from craft_testkit.readme import Block, python_blocks, run_block, shape_problems

README = Path(__file__).parents[1] / "README.md"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "README.md"
    path.write_text(text)
    return path


def test_blocks_are_the_python_fences_only(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "# t\n```python\nx = 1\n```\n```bash\nls\n```\n\n```python\ny = 2\nz = 3\n```\n",
    )
    blocks = python_blocks(path)
    assert [(b.line, b.code) for b in blocks] == [(3, "x = 1\n"), (10, "y = 2\nz = 3\n")]
    assert str(blocks[1]) == "README.md:10"


def test_an_unclosed_block_is_refused_with_its_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="line 2 is never closed"):
        python_blocks(_write(tmp_path, "# t\n```python\nx = 1\n"))


def test_a_failing_example_fails_at_its_readme_line(tmp_path: Path) -> None:
    (block,) = python_blocks(
        _write(tmp_path, "# t\n\n```python\nok = 1\nraise KeyError(ok)\n```\n")
    )
    with pytest.raises(KeyError) as caught:
        run_block(block, tmp_path)
    last = traceback.extract_tb(caught.value.__traceback__)[-1]
    assert (last.filename, last.lineno) == (str(tmp_path / "README.md"), 5)


def test_each_block_runs_alone_in_the_scratch_folder(tmp_path: Path) -> None:
    path = _write(
        tmp_path, "```python\nopen('made', 'w').write('x')\na = 1\n```\n```python\na\n```\n"
    )
    work = tmp_path / "work"
    work.mkdir()
    first, second = python_blocks(path)
    assert run_block(first, work)["a"] == 1 and (work / "made").exists()
    with pytest.raises(NameError):  # no state leaks from one example to the next
        run_block(second, work)


def test_a_declared_need_that_is_missing_skips_saying_what(tmp_path: Path) -> None:
    block = Block(tmp_path / "README.md", 1, "# needs: no_such_module_here\nraise SystemExit\n")
    assert block.needs() == ["no_such_module_here"]
    with pytest.raises(unittest.SkipTest, match="needs no_such_module_here"):
        run_block(block, tmp_path)
    present = Block(tmp_path / "README.md", 1, "# needs: json\nvalue = 7\n")
    assert run_block(present, tmp_path)["value"] == 7


@pytest.mark.parametrize("block", python_blocks(README), ids=str)
def test_readme_example_runs(block: Block, tmp_path: Path) -> None:
    run_block(block, tmp_path)


def test_shape_problems_names_long_readmes_and_wide_prose(tmp_path: Path) -> None:
    fence = "`" * 3
    wide = "x" * 101
    readme = tmp_path / "README.md"
    readme.write_text(f"# ok\n\n| {wide} |\n\n{fence}python\n{wide} = 1\n{fence}\n")
    assert shape_problems(readme) == []  # a table row and code may be wide
    readme.write_text(f"# ok\n\n{wide}\n" + "line\n" * 198)
    assert shape_problems(readme) == [
        "README.md: 201 lines, over 200",
        "README.md: lines over 100 characters: [3]",
    ]
    assert shape_problems(readme, max_lines=201, max_width=101) == []
