"""Readers of the data people hold: LLaVA conversations, ShareGPT / LLaMA-Factory, caption
rows; every unusable row named by file:line, never dropped silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from craft_adapters.data_files import (
    Example,
    FileRow,
    FormatError,
    dataset_path,
    detect_format,
    read_data_file,
    read_file_rows,
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
        detect_format(tmp_path / "x.json", [FileRow(1, {"clip": "a.mp4", "text": "t"})])


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


def _pretty_array(path: Path, rows: list) -> Path:
    """A JSON array as LLaMA-Factory's and LLaVA's own files are written: json.dump, indent 2."""
    path.write_text(json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
    return path


def _lf_row(video: str, question: str, answer: str, **extra: object) -> dict:
    """A row of LLaMA-Factory's default sharegpt layout (data/README.md, "Sharegpt Format")."""
    return {
        "conversations": [
            {"from": "human", "value": f"<video>{question}"},
            {"from": "gpt", "value": answer},
        ],
        "videos": [video],
        **extra,
    }


def test_llamafactory_default_sharegpt_layout_and_its_system_column(tmp_path: Path) -> None:
    rows = [
        _lf_row("clips/a.mp4", "What falls?", "A cup.", system="Answer briefly."),
        {  # a system message overrides the system column, as in LLaMA-Factory
            "conversations": [
                {"from": "system", "value": "Be exact."},
                {"from": "human", "value": "<video>Count them."},
                {"from": "gpt", "value": "Three."},
                {"from": "human", "value": "Sure?"},
                {"from": "gpt", "value": "Yes."},
            ],
            "system": "ignored: the message wins",
            "videos": ["clips/b.mp4"],
        },
        {**_lf_row("clips/c.mp4", "q", "a"), "tools": '[{"name": "search"}]'},
        {"conversations": [{"from": "human", "value": "<video>q"},
                           {"from": "function_call", "value": "{}"},
                           {"from": "observation", "value": "{}"},
                           {"from": "gpt", "value": "a"}], "videos": ["d.mp4"]},
    ]  # fmt: skip
    path = _pretty_array(tmp_path / "lf.json", rows)
    examples, problems = read_data_file(path)  # told apart from LLaVA rows by `videos`
    assert examples == [
        Example(str(tmp_path / "clips/a.mp4"), "What falls?", "A cup.", "lf", (),
                "Answer briefly."),
        Example(str(tmp_path / "clips/b.mp4"), "Count them.", "Three.", "lf",
                (("Sure?", "Yes."),), "Be exact."),
    ]  # fmt: skip
    starts = [i for i, line in enumerate(path.read_text().splitlines(), 1) if line == "  {"]
    assert [e.origin for e in examples] == [f"{path}:{starts[0]}", f"{path}:{starts[1]}"]
    assert [(p.where, p.reason) for p in problems] == [
        (f"{path}:{starts[2]}", "a 'tools' column (function calling) is not supported"),
        (f"{path}:{starts[3]}", "a 'function_call' turn (function calling) is not supported"),
    ]


def test_dataset_info_columns_and_tags_map_any_layout(tmp_path: Path) -> None:
    """The mapping as a dataset_info.json entry writes it: renamed columns and role tags."""
    row = {
        "dialog": [
            {"speaker": "User", "text": "<video>What happens?"},
            {"speaker": "Bot", "text": "It rains."},
        ],
        "clips": ["r.mp4"],
        "preamble": "You watch videos.",
    }
    path = _jsonl(tmp_path / "mine.jsonl", [row, {**row, "dialog": row["dialog"][::-1]}])
    columns = {"messages": "dialog", "videos": "clips", "system": "preamble"}
    tags = {"role_tag": "speaker", "content_tag": "text", "user_tag": "User",
            "assistant_tag": "Bot"}  # fmt: skip
    (ex,), (bad,) = read_data_file(path, "sharegpt", columns=columns, tags=tags)
    assert (ex.video, ex.prompt, ex.target, ex.system) == (
        str(tmp_path / "r.mp4"), "What happens?", "It rains.", "You watch videos.")  # fmt: skip
    assert bad.where == f"{path}:2" and "alternate" in bad.reason
    with pytest.raises(TypeError):  # a misspelt option is an error, never ignored
        read_data_file(path, "sharegpt", column=columns)


def _sharegpt4video_row(video_id: str, captions: list[str], zip_folder: str) -> dict:
    """A row of ShareGPT4Video's sharegpt4video_40k.jsonl: keyframe captions (idx 0, 1, ...)
    and the whole-video caption (idx -1), the video named by its id and its zip."""
    frames = [{"idx": str(i), "content": c} for i, c in enumerate(captions[:-1])]
    return {
        "video_id": video_id,
        "timestamp": [0.0, 2.5, 5.0][: len(frames)],
        "keyframe": list(range(len(frames))),
        "captions": [*frames, {"idx": "-1", "content": captions[-1]}],
        "zip_folder": zip_folder,
    }


def test_sharegpt4video_rows_as_released_one_whole_video_caption(tmp_path: Path) -> None:
    root = tmp_path / "videos"
    (root / "panda_videos_1").mkdir(parents=True)
    (root / "panda_videos_1" / "abc.mp4").write_bytes(b"")  # where its zip unpacks
    (root / "def.mkv").write_bytes(b"")  # another suffix, at the root
    rows = [
        _sharegpt4video_row("abc", ["A dog sits.", "It stands.", "A dog sits, then stands."],
                            "panda_videos_1.zip"),
        _sharegpt4video_row("def", ["Rain.", "Rain over a street, all along."], "x.zip"),
        _sharegpt4video_row("ghi", ["Snow.", "Snow falls on a field."], "x.zip"),
        {**_sharegpt4video_row("jkl", ["A.", "B."], "x.zip"),
         "captions": [{"idx": "0", "content": "A."}]},  # no whole-video caption
    ]  # fmt: skip
    path = _jsonl(tmp_path / "sharegpt4video_40k.jsonl", rows)
    examples, problems = read_data_file(path, video_root=str(root), caption_prompt="D.")
    assert [(e.video, e.prompt, e.target) for e in examples] == [
        (str(root / "panda_videos_1" / "abc.mp4"), "D.", "A dog sits, then stands."),
        (str(root / "def.mkv"), "D.", "Rain over a street, all along."),
        (str(root / "ghi.mp4"), "D.", "Snow falls on a field."),  # missing: --check says so
    ]
    assert [(p.where, p.reason) for p in problems] == [
        (f"{path}:4", "0 whole-video captions (idx -1); ShareGPT4Video rows have one (the "
                      "others describe keyframes)")]  # fmt: skip


@pytest.mark.parametrize("layout", ["jsonl", "array"])
def test_a_corrupt_row_is_one_bad_row_in_either_layout(layout: str, tmp_path: Path) -> None:
    rows = [_lf_row(f"v{i}.mp4", f"q{i}", f"a{i}") for i in range(4)]
    if layout == "jsonl":
        path = _jsonl(tmp_path / "d.jsonl", rows)
        lines = path.read_text().splitlines()
        lines[1] = lines[1][:40]  # cut short, as a failed write leaves it
        bad_line = 2
    else:
        path = _pretty_array(tmp_path / "d.json", rows)
        lines = path.read_text().splitlines()
        bad_line = [i for i, line in enumerate(lines, 1) if line == "  {"][1]  # the 2nd row
        lines[bad_line] = lines[bad_line].replace(":", "")  # '"conversations" [': no colon
    path.write_text("\n".join(lines) + "\n")
    examples, problems = read_data_file(path)
    assert [e.target for e in examples] == ["a0", "a2", "a3"]
    assert [p.where for p in problems] == [f"{path}:{bad_line}"]
    assert problems[0].reason.startswith("not valid JSON")


def test_an_array_whose_rows_cannot_be_told_apart_after_a_bad_one_says_so(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('[{"video": "a", "caption": "x"}, {"video": \n')  # one line, cut short
    examples, (problem,) = read_data_file(bad, "caption")
    assert len(examples) == 1 and problem.where == f"{bad}:1"
    assert "the rest of the file is left out" in problem.reason
    bad.write_text('[\n{"video": "a", "caption": "x"}\n]\n{"video": "b", "caption": "y"}\n')
    examples, (problem,) = read_data_file(bad, "caption")  # two arrays' worth: one read
    assert (
        len(examples) == 1
        and str(problem) == f"{bad}:3: text after the JSON array's ']' is not read"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "the file is empty"), ("\n \n", "the file is empty"), ("[\n]\n", "the file is empty"),
     ("not json\nat all\n", "neither a JSON array nor JSONL"),
     ('{\n  "video": "a.mp4"\n}\n', "one JSON dict, not rows")],
)  # fmt: skip
def test_a_file_without_rows_says_what_it_is(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(text)
    with pytest.raises(FormatError, match=f"{path}: {message}"):
        read_data_file(path)


def test_rows_name_every_video_usable_or_not(tmp_path: Path) -> None:
    """What the audit checks: a two-video row names both, an image-only row none."""
    rows = read_file_rows(_json_array(tmp_path / "llava.json", LLAVA))
    assert [r.videos for r in rows][:3] == [
        (str(tmp_path / "clips/a.mp4"),), (), (str(tmp_path / "a.mp4"), str(tmp_path / "b.mp4"))
    ]  # fmt: skip
    assert [r.problem is None for r in rows] == [True] + [False] * 6
