"""Readers of the data people hold: LLaVA conversations, ShareGPT / LLaMA-Factory, caption
rows; every unusable row named by file:line, never dropped silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from craft_adapters.data_files import (
    Example,
    FormatError,
    dataset_path,
    detect_format,
    read_data_file,
)
from craft_adapters.data_samples import LLAVA_ROWS as LLAVA
from craft_adapters.data_samples import write_json_array as _json_array
from craft_adapters.data_samples import write_jsonl as _jsonl


def test_llava_rows_and_every_unusable_row_by_line(tmp_path: Path) -> None:
    path = _json_array(tmp_path / "llava.json", LLAVA)
    examples, problems = read_data_file(path)
    assert examples == [
        Example(
            str(tmp_path / "clips/a.mp4"),
            "What colour is it?",
            "Red.",
            "0_30_s_academic_v0_1",
            follow_up=(("Are you sure?", "Yes, red."),),
        )
    ]
    assert examples[0].origin == f"{path}:2"
    reasons = {p.where.rsplit(":", 1)[1]: p.reason for p in problems}
    assert sorted(reasons) == ["3", "4", "5", "6", "7", "8"]  # every bad row, none dropped
    assert "image-only" in reasons["3"]
    assert "2 videos" in reasons["4"]
    assert "no assistant turn" in reasons["5"]
    assert "alternate" in reasons["6"]
    assert "2 <image>/<video> tags" in reasons["7"]
    assert "no video" in reasons["8"]


def test_sharegpt_llamafactory_rows_keep_system_and_turns(tmp_path: Path) -> None:
    rows = [
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Look: <video> what happens?"},
                {"role": "assistant", "content": "A cup falls."},
                {"role": "user", "content": "Then?"},
                {"role": "assistant", "content": "It breaks."},
            ],
            "videos": ["/abs/v.mp4"],
        },
        {"messages": [{"role": "user", "content": "<image>"}], "images": ["a.png"]},
    ]
    path = _jsonl(tmp_path / "lf.jsonl", rows)
    (ex,), (problem,) = read_data_file(path, "sharegpt", source="lf", video_fps=3.0)
    assert ex == Example("/abs/v.mp4", "Look:  what happens?", "A cup falls.", "lf",
                         (("Then?", "It breaks."),), "Be brief.", 3.0)  # fmt: skip
    assert problem.where == f"{path}:2" and "image-only" in problem.reason


@pytest.mark.parametrize(
    ("fmt", "video", "turns", "fields"),
    [("llava", "video", "conversations", "{from, value}"),
     ("sharegpt", "videos", "messages", "{role, content}")],
)  # fmt: skip
def test_chat_rows_name_a_bad_turn_list(
    fmt: str, video: str, turns: str, fields: str, tmp_path: Path
) -> None:
    clip = "a.mp4" if fmt == "llava" else ["a.mp4"]
    rows = [{video: clip, turns: "hi"}, {video: clip, turns: [["user", "hi"]]}, {video: clip}]
    examples, problems = read_data_file(_jsonl(tmp_path / "t.jsonl", rows), fmt)
    assert examples == [] and len(problems) == 3  # each row named, none dropped
    assert {p.reason for p in problems} == {f"'{turns}' must be a list of {fields} objects"}


def test_caption_rows_one_example_per_caption(tmp_path: Path) -> None:
    rows = [
        {"video_path": "v.mp4", "captions": [{"content": "A dog."}, "A brown dog."]},
        {"video": "w.mp4", "caption": "  "},
    ]
    examples, problems = read_data_file(_jsonl(tmp_path / "c.jsonl", rows), caption_prompt="D.")
    assert [(e.prompt, e.target, e.source) for e in examples] == [("D.", "A dog.", "c"),
                                                                  ("D.", "A brown dog.", "c")]  # fmt: skip
    assert [p.where.rsplit(":", 1)[1] for p in problems] == ["2"]


def test_unknown_format_names_the_file_and_the_choices(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match=r"x\.json: cannot tell the format.*llava, sharegpt"):
        detect_format(tmp_path / "x.json", {"clip": "a.mp4", "text": "t"})
    bad = tmp_path / "bad.json"
    bad.write_text('[\n{"video": "a"},\n{"video": \n')
    with pytest.raises(FormatError, match=r"bad\.json:3: not valid JSON"):
        read_data_file(bad, "caption")


def test_dataset_path_expands_variables_under_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRAFT_DATA", "/data/craft")
    assert dataset_path("${CRAFT_DATA}/x", "a/b.json") == Path("/data/craft/x/a/b.json")
    assert dataset_path("${CRAFT_DATA}", "/abs/c.json") == Path("/abs/c.json")
    assert dataset_path(None, "d.json") == Path("d.json")


def test_craft_manifest_rows_are_read_too(tmp_path: Path) -> None:
    rows = [
        {"video": "a.mp4", "question": "Q?", "answer": "A.", "source": "nextqa"},
        {"video": "b.mp4", "caption": "A cat.", "source": "webvid"},
        {"video": "c.mp4", "question": "Q?", "source": "nextqa"},
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples, problems = read_data_file(path, caption_prompt="D.")
    assert [(e.prompt, e.target, e.source) for e in examples] == [
        ("Q?", "A.", "nextqa"),
        ("D.", "A cat.", "webvid"),
    ]
    assert [p.where for p in problems] == [f"{path}:3"]
