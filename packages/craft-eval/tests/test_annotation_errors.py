"""Malformed benchmark annotations (issue 32): the error names the FILE, the record (index and
id) and what was expected; from the CLI it is one line (exit 2), and Python's warnings come
out in the CLI's own one-line form, never as `file.py:N: UserWarning` plus a source line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from craft_eval import cli
from craft_eval.fixtures import write_fixture
from craft_eval.runner import RunConfig, load_items

Rows = list[dict[str, Any]]


def _drop(field: str) -> Callable[[Rows], Any]:
    def edit(rows: Rows) -> Rows:
        rows[1].pop(field)
        return rows

    return edit


def _set(field: str, value: Any) -> Callable[[Rows], Any]:
    def edit(rows: Rows) -> Rows:
        rows[1][field] = value
        return rows

    return edit


# (id, benchmark, annotation file under the fixture root, edit, texts the message must hold)
CASES: list[tuple[str, str, str, Callable[[Rows], Any], list[str]]] = [
    ("mvbench-no-candidates", "mvbench", "json/moving_direction.json", _drop("candidates"),
     ["record 1", "no field 'candidates'", "its fields: answer"]),
    ("mvbench-object-not-list", "mvbench", "json/moving_direction.json", lambda rows: rows[0],
     ["is an object", "expected a list of records"]),
    ("mvbench-number-not-list", "mvbench", "json/object_existence.json", lambda rows: 3,
     ["holds a int", "expected a list of records"]),
    ("mvbench-candidates-text", "mvbench", "json/moving_direction.json",
     _set("candidates", "left right"), ["record 1", "'candidates' must be a non-empty list"]),
    ("mvbench-candidates-empty", "mvbench", "json/moving_direction.json",
     _set("candidates", []), ["record 1", "'candidates' must be a non-empty list"]),
    ("mvbench-start-text", "mvbench", "json/moving_direction.json",
     lambda rows: _set("start", "soon")(_set("end", 2.0)(rows)),
     ["record 1", "'start' must be a number, got 'soon'"]),
    ("mvbench-answer-not-candidate", "mvbench", "json/moving_direction.json",
     _set("answer", "upwards"), ["record 1", "'answer' must be one of its candidates"]),
    ("lvb-choice-out-of-range", "longvideobench", "lvb_val.json", _set("correct_choice", 7),
     ["record 1 (id ", "'correct_choice' must be an option index 0..", "got 7"]),
    ("lvb-choice-negative", "longvideobench", "lvb_val.json", _set("correct_choice", -1),
     ["record 1 (id ", "'correct_choice' must be an option index"]),
    ("lvb-no-question", "longvideobench", "lvb_val.json", _drop("question"),
     ["record 1 (id ", "no field 'question'"]),
    ("videomme-no-options", "videomme", "videomme/test-00000-of-00001.parquet",
     _drop("options"), ["record 1 (id ", "'options' must be a non-empty list", "got None"]),
    ("egoschema-option-text", "egoschema", "Subset/test-00000-of-00001.parquet",
     lambda rows: [{**r, "option": "A. one"} for r in rows],
     ["record 0 (id ", "'option' must be a non-empty list", "got 'A. one'"]),
]  # fmt: skip


def _rewrite(path: Path, edit: Callable[[Rows], Any]) -> None:
    if path.suffix == ".parquet":
        rows = pq.read_table(path).to_pylist()
        pq.write_table(pa.Table.from_pylist(edit(rows)), path)
    else:
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))


@pytest.mark.parametrize(
    ("bench", "rel", "edit", "texts"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
@pytest.mark.filterwarnings("ignore:MVBench. task files missing")
def test_a_malformed_record_names_file_record_and_expectation(
    tmp_path: Path, bench: str, rel: str, edit: Callable[[Rows], Any], texts: list[str]
) -> None:
    root = write_fixture(bench, tmp_path / bench, num_items=3, num_frames=4)
    path = root / rel
    assert path.is_file(), sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
    _rewrite(path, edit)
    with pytest.raises(ValueError) as info:
        load_items(RunConfig(bench, str(root), "m"))
    message = str(info.value)
    assert str(path) in message, message
    for text in texts:
        assert text in message, message


@pytest.mark.filterwarnings("ignore:MVBench. task files missing")
def test_control_the_untouched_fixtures_load(tmp_path: Path) -> None:
    for bench in ("mvbench", "longvideobench", "videomme", "egoschema"):
        root = write_fixture(bench, tmp_path / bench, num_items=3, num_frames=4)
        assert len(load_items(RunConfig(bench, str(root), "m"))) >= 3


def test_cli_error_names_the_file_and_warnings_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_model(args: Any) -> Any:
        raise AssertionError("a malformed annotation must be found before any model loads")

    monkeypatch.setattr(cli.common, "load_model", no_model)
    root = write_fixture("mvbench", tmp_path / "mv", num_items=3, num_frames=4)
    path = root / "json" / "moving_direction.json"
    _rewrite(path, _drop("candidates"))
    argv = ["run", "--tiny", "qwen2_5_vl", "-b", "mvbench", "--data-root", str(root)]
    assert cli.main([*argv, "-o", str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.splitlines()
    # the 17 MVBench tasks the fixture lacks: a warning in the CLI's form, one line
    warned = [line for line in lines if "task files missing" in line]
    assert len(warned) == 1 and warned[0].startswith("craft-eval: warning: MVBench:"), lines
    errors = [line for line in lines if line.startswith("craft-eval: error:")]
    assert len(errors) == 1 and str(path) in errors[0] and "record 1" in errors[0], lines
    assert len(lines) == 2, lines  # no "runner.py:NNN: UserWarning", no source line
    assert not any("Warning" in line or "Traceback" in line for line in lines), lines
