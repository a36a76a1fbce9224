"""A README's Python examples, each run as a test: an example that rots fails CI.

    BLOCKS = python_blocks(Path(__file__).parents[1] / "README.md")

    @pytest.mark.parametrize("block", BLOCKS, ids=str)
    def test_readme_example_runs(block, tmp_path):
        run_block(block, tmp_path)

Every fenced block opened with ```python is one example, run on its own in a fresh
namespace with the working directory set to a scratch folder. A block whose first line is
`# needs: cuda` (or a module name, e.g. `# needs: vllm`) is skipped, saying why, where that is
missing; nothing else is ever skipped.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import unittest
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

__all__ = ["Block", "python_blocks", "run_block", "shape_problems"]

_NEEDS = re.compile(r"#\s*needs:\s*(.+)")


class Block(NamedTuple):
    """One ```python block of a README."""

    path: Path  # the README
    line: int  # 1-based line of the block's first code line
    code: str

    def __str__(self) -> str:  # a readable pytest id: README.md:42
        return f"{self.path.name}:{self.line}"

    def needs(self) -> list[str]:
        """What the block declares it needs (`# needs: cuda, vllm` on its first line)."""
        first = self.code.lstrip().splitlines()[0] if self.code.strip() else ""
        found = _NEEDS.fullmatch(first.strip())
        return [name.strip() for name in found.group(1).split(",")] if found else []


def python_blocks(readme: Path) -> list[Block]:
    """Every ```python block of `readme`, in order.

    Raises:
        ValueError: a block opened and never closed (the README would render wrongly too).
    """
    blocks: list[Block] = []
    code: list[str] | None = None
    start = 0
    for number, line in enumerate(readme.read_text(encoding="utf-8").splitlines(), 1):
        fence = line.strip().startswith("```")
        if code is None and fence and line.strip()[3:].strip() == "python":
            code, start = [], number + 1
        elif code is not None and fence:
            blocks.append(Block(readme, start, "\n".join(code) + "\n"))
            code = None
        elif code is not None:
            code.append(line)
    if code is not None:
        raise ValueError(f"{readme}: the ```python block at line {start - 1} is never closed")
    return blocks


def _missing(name: str) -> bool:
    if name == "cuda":
        import torch

        return not torch.cuda.is_available()
    return importlib.util.find_spec(name) is None


def run_block(block: Block, workdir: Path) -> dict[str, object]:
    """Run `block` in a fresh namespace with `workdir` as the working directory; return the
    namespace. Raises what the example raises (the test fails with the README's line)."""
    missing = [name for name in block.needs() if _missing(name)]
    if missing:
        raise unittest.SkipTest(f"{block} needs {', '.join(missing)}, missing here")
    # Blank lines before the code keep the traceback's line numbers the README's own.
    source = "\n" * (block.line - 1) + block.code
    namespace: dict[str, object] = {"__name__": "__readme__"}
    with _chdir(workdir):
        exec(compile(source, str(block.path), "exec"), namespace)
    return namespace


def shape_problems(readme: Path, max_lines: int = 200, max_width: int = 100) -> list[str]:
    """What keeps `readme` from the front door's shape, one sentence each (empty: none):
    more than `max_lines` lines, or prose lines wider than `max_width` characters (table rows
    and fenced code are exempt: a table cannot wrap, code is copied as it is)."""
    lines = readme.read_text(encoding="utf-8").splitlines()
    wide, code = [], False
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            code = not code
        elif not code and not line.startswith("|") and len(line) > max_width:
            wide.append(number)
    problems = (
        [f"{readme.name}: {len(lines)} lines, over {max_lines}"] if len(lines) > max_lines else []
    )
    if wide:
        problems.append(f"{readme.name}: lines over {max_width} characters: {wide}")
    return problems


@contextlib.contextmanager
def _chdir(where: Path) -> Iterator[None]:
    """`contextlib.chdir` (Python 3.11+), here for 3.10 too."""
    before = os.getcwd()
    os.chdir(where)
    try:
        yield
    finally:
        os.chdir(before)
