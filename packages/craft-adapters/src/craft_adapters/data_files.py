"""Readers of the video SFT data people hold: rows -> `Example` (video + turns). No torch.

    examples, problems = read_data_file("llava_video_178k.json", fmt="auto")

Shared by craft-train (training on these files) and craft-eval (`craft-eval audit`: the
files against the benchmarks), which may not import each other: so the readers live here.

Formats (`fmt`, or "auto": told apart by the keys of the first row that fits one):

- `llava`: LLaVA-Video-178K / LLaVA-OneVision conversation JSON or JSONL,
  `{"id", "video", "conversations": [{"from": "human", "value": "<image>\\n..."},
  {"from": "gpt", "value": "..."}, ...], "data_source"}`; many turns per video.
- `sharegpt`: LLaMA-Factory's ShareGPT layout, `{"conversations": [{"from": "human",
  "value": "<video>..."}, {"from": "gpt", ...}], "system": "...", "videos": ["a.mp4"]}`, or
  its OpenAI form `{"messages": [{"role": "user", "content": ...}, ...], "videos": [...]}`
  (a `system` message, else the `system` column, becomes the system turn). Other column
  and tag names: `columns` / `tags` as LLaMA-Factory's dataset_info.json writes them.
- `caption`: caption rows, `{"video" | "video_path", "caption"}` or `"captions": [...]`
  (each caption one example; an entry may be `{"content": ...}`); ShareGPT4Video's rows as
  released, `{"video_id", "zip_folder", "captions": [{"idx": "0", "content"}, ...,
  {"idx": "-1", "content"}]}`: one example, the whole-video caption (idx -1); the keyframe
  captions describe single frames and are not read. `video_id` is looked up under the
  video root (`<id>.mp4` and other suffixes, or a frame folder `<id>/`; also under the
  folder the row's zip unpacks to).
- `craft`: craft-train's own JSONL manifest, `{"video", "caption" | "question" + "answer",
  "source"}` (craft-train trains on it with its strict `read_manifest`: a bad row is an
  error there).

`<image>` / `<video>` in a user turn marks the video; the tag is taken out and the video goes
where the backbone's chat template puts it (first in the first user turn). A row that cannot
be used (not JSON, no video, an image-only row, two videos, no assistant turn, turns out of
order) is returned as a `Problem` naming its `file:line`, in a JSON array as in JSONL; the
caller reports it, nothing is dropped silently. The `--check` of the CLI lists them all. A
file with no row, or with no line that is JSON, is a `FormatError`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "COLUMNS",
    "FORMATS",
    "TAGS",
    "Example",
    "FileRow",
    "FormatError",
    "Problem",
    "Row",
    "dataset_path",
    "detect_format",
    "read_data_file",
    "read_file_rows",
    "read_rows",
    "row_content",
]

FORMATS = ("llava", "sharegpt", "caption", "craft")
VIDEO_TAGS = re.compile(r"<video>|<image>")
VIDEO_SUFFIXES = (".mp4", ".mkv", ".webm", ".mov", ".avi")
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
          "system": "system"}  # fmt: skip
COLUMNS = ("messages", "system", "videos", "images", "tools")
"""LLaMA-Factory dataset_info.json `columns` a video row can use (defaults: `_LF`)."""
TAGS = ("role_tag", "content_tag", "user_tag", "assistant_tag", "system_tag",
        "observation_tag", "function_tag")  # fmt: skip
"""LLaMA-Factory dataset_info.json `tags` of the sharegpt format (defaults: `_LF`)."""
_LF = {"messages": "conversations", "system": "system", "videos": "videos", "images": "images",
       "tools": "tools", "role_tag": "from", "content_tag": "value", "user_tag": "human",
       "assistant_tag": "gpt", "system_tag": "system", "observation_tag": "observation",
       "function_tag": "function_call"}  # fmt: skip
_OPENAI = {**_LF, "messages": "messages", "role_tag": "role", "content_tag": "content",
           "user_tag": "user", "assistant_tag": "assistant"}  # fmt: skip
_LLAVA = {**_LF, "videos": "video", "images": "image"}


@dataclass(frozen=True)
class Example:
    """One training example: a video, the first user prompt and its reply, and any later
    `(user, assistant)` turns about the same video (every assistant turn is trained on).

    `video` is a file, or a folder of frames extracted at `video_fps` frames per second;
    `origin` is the `file:line` it was read from.
    """

    video: str
    prompt: str
    target: str
    source: str
    follow_up: tuple[tuple[str, str], ...] = ()
    system: str | None = None
    video_fps: float | None = None
    origin: str = field(default="", compare=False)


@dataclass(frozen=True)
class Problem:
    """A row that cannot be used: where (`file:line`) and why."""

    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


class FormatError(ValueError):
    """A data file that cannot be read at all (empty, not JSON, unknown format); names it."""


class FileRow(NamedTuple):
    """One row of a data file as parsed: the line it starts on, its value, or why it is not
    JSON (`value` None then)."""

    line: int
    value: Any
    error: str | None = None


@dataclass(frozen=True)
class Row:
    """What one file row gave: every video it names (resolved, usable or not: the audit
    checks them all), its examples, and why it cannot be used (None: it can)."""

    where: str
    source: str
    videos: tuple[str, ...]
    examples: tuple[Example, ...]
    problem: str | None


def read_rows(path: Path) -> list[FileRow]:
    """Every row of a JSON array file or a JSONL file, with the line it starts on; a row
    that is not valid JSON is a `FileRow` with its `error`, the rows around it are read.

    Raises:
        FormatError: the file holds no row, no line of it is JSON, or it is one JSON object.
    """
    text = path.read_text(encoding="utf-8")
    start = len(text) - len(text.lstrip())
    if start == len(text):
        raise FormatError(f"{path}: the file is empty (no rows)")
    if text[start] == "[":
        rows = _array_rows(text, start + 1)
    else:
        rows = _jsonl_rows(path, text)
    if not rows:
        raise FormatError(f"{path}: the file is empty (a JSON array without rows)")
    return rows


def _jsonl_rows(path: Path, text: str) -> list[FileRow]:
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(FileRow(lineno, json.loads(line)))
            except json.JSONDecodeError as err:
                rows.append(FileRow(lineno, None, f"not valid JSON ({err.msg})"))
    if all(r.error is not None for r in rows):
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            raise FormatError(f"{path}: neither a JSON array nor JSONL (line {rows[0].line}: "
                              f"{rows[0].error})") from None  # fmt: skip
        raise FormatError(f"{path}: one JSON {type(whole).__name__}, not rows; a data file is a "
                          "JSON array of rows or JSONL (one row per line)")  # fmt: skip
    return rows


def _array_rows(text: str, pos: int) -> list[FileRow]:
    """The elements of a JSON array, each with the line it starts on (counted as we go).

    An element that is not valid JSON is a row with its error; reading goes on at the next
    line that starts an element at the first element's indentation (one row per line, or
    `json.dump(indent=N)`); where there is none, the rest of the file is that one bad row.
    """
    decoder = json.JSONDecoder()
    rows: list[FileRow] = []
    line, counted, indent = 1, 0, None
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        line += text.count("\n", counted, pos)
        counted = pos
        if pos >= len(text):
            return [*rows, FileRow(line, None, "the JSON array is not closed by ']' (cut short?)")]
        if text[pos] == "]":
            if text[pos + 1 :].strip():  # never read without a word
                line += text.count("\n", counted, pos)
                return [*rows, FileRow(line, None, "text after the JSON array's ']' is not read")]
            return rows
        if indent is None:  # the first element's column (rfind once: a file may be one line)
            indent = pos - (text.rfind("\n", 0, pos) + 1)
        try:
            row, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            resume = _next_element(text, pos, indent)
            if resume is None:
                why = (f"not valid JSON ({err.msg}); no row after it can be told apart: the "
                       "rest of the file is left out")  # fmt: skip
                return [*rows, FileRow(line, None, why)]
            rows.append(FileRow(line, None, f"not valid JSON ({err.msg})"))
            pos = resume
            continue
        rows.append(FileRow(line, row))


_ELEMENT = re.compile(r"\n([ \t]*)[{\[]")


def _next_element(text: str, pos: int, indent: int) -> int | None:
    """The start of the next line after `pos` holding `{` or `[` at column `indent`."""
    for match in _ELEMENT.finditer(text, pos):
        if len(match.group(1)) == indent:
            return match.end() - 1
    return None


def row_content(row: FileRow) -> str:
    """A row's content as text, independent of the file's layout and path (JSON with sorted
    keys): what `random:` sampling is seeded by."""
    if row.error is not None:
        return f"\0not JSON\0{row.error}"
    return json.dumps(row.value, sort_keys=True, ensure_ascii=False)


def dataset_path(root: str | None, json_path: str) -> Path:
    """A mixture entry's file: `json_path` (`$VAR` and `~` expanded), a relative one under
    `root` (also expanded; None: the working directory)."""
    path = Path(os.path.expandvars(json_path)).expanduser()
    if path.is_absolute() or root is None:
        return path
    return Path(os.path.expandvars(root)).expanduser() / path


def detect_format(path: Path, rows: Sequence[FileRow]) -> str:
    """The format of a file: from the keys of its first row that fits one.

    Raises:
        FormatError: no row fits a format (the file and its first row's keys named).
    """
    first: set[str] | None = None
    for row in rows:
        if row.error is not None:
            continue
        keys = set(row.value) if isinstance(row.value, dict) else set()
        first = keys if first is None else first
        if {"messages", "videos"} & keys:
            return "sharegpt"
        if "conversations" in keys:
            return "llava"
        if {"question", "answer"} & keys or {"caption", "source"} <= keys:
            return "craft"
        if {"caption", "captions"} & keys:
            return "caption"
    raise FormatError(
        f"{path}: cannot tell the format from the rows (first row's keys {sorted(first or ())})"
        f"; set `format:` to one of {', '.join(FORMATS)} in its data entry"
    )


@dataclass(frozen=True)
class _Context:
    """What every row of one file is read with."""

    root: Path
    caption_prompt: str
    layout: Mapping[str, str] | None  # sharegpt columns + tags; None: told from each row


def read_file_rows(
    path: str | Path,
    fmt: str = "auto",
    *,
    source: str | None = None,
    video_root: str | None = None,
    video_fps: float | None = None,
    caption_prompt: str = "Describe this video in detail.",
    columns: Mapping[str, str] | None = None,
    tags: Mapping[str, str] | None = None,
    select: Callable[[list[FileRow]], list[FileRow]] | None = None,
    rows: list[FileRow] | None = None,
) -> list[Row]:
    """Read one data file of any format ("auto": detected), row by row.

    Args:
        source: source name of every row (default: the row's `data_source` or `source`, else
            the file's name without suffix).
        video_root: folder relative video paths start in (default: the file's folder).
        video_fps: frames per second of the videos that are frame folders.
        caption_prompt: prompt of caption rows that give no `prompt` of their own.
        columns, tags: LLaMA-Factory's dataset_info.json mapping of a `sharegpt` file (keys
            `COLUMNS`, `TAGS`; the rest as LLaMA-Factory's defaults).
        select: which of the file's rows to read (sampling over file rows, not examples).
        rows: the file's rows, when the caller has read them (`read_rows(path)`).

    Raises:
        FormatError: the file is empty, not JSON, or its format cannot be told.
    """
    path = Path(path)
    rows = read_rows(path) if rows is None else rows
    if fmt == "auto":
        fmt = detect_format(path, rows)
    layout = {**_LF, **(columns or {}), **(tags or {})} if columns or tags else None
    ctx = _Context(Path(video_root) if video_root is not None else path.parent, caption_prompt,
                   layout)  # fmt: skip
    read = {"llava": _llava, "sharegpt": _sharegpt, "caption": _caption, "craft": _craft}[fmt]
    out = []
    for row in select(rows) if select is not None else rows:
        where = f"{path}:{row.line}"
        value = row.value if isinstance(row.value, dict) else {}
        name = source or _text(value.get("data_source")) or _text(value.get("source")) or path.stem
        if row.error is not None or not isinstance(row.value, dict):
            why = row.error or "a row must be a JSON object"
            out.append(Row(where, name, (), (), why))
            continue
        named, made = read(row.value, ctx)
        resolved = {v: _resolve(v, ctx.root) for v in named}  # once a row: Path is not cheap
        examples = tuple(_example(m, name, resolved, video_fps, where) for m in made
                         if not isinstance(m, str))  # fmt: skip
        videos = tuple(resolved.values())
        problems = [m for m in made if isinstance(m, str)]
        out.append(Row(where, name, videos, examples, problems[0] if problems else None))
    return out


def read_data_file(
    path: str | Path, fmt: str = "auto", **options: Any
) -> tuple[list[Example], list[Problem]]:
    """`read_file_rows` as the usable examples in file order and the rows that cannot be
    used (the same keyword options)."""
    rows = read_file_rows(path, fmt, **options)
    examples = [e for r in rows for e in r.examples]
    return examples, [Problem(r.where, r.problem) for r in rows if r.problem is not None]


_Made = tuple[str, list[tuple[str, str]], str | None]
_Read = tuple[list[str], list[_Made | str]]  # (every video the row names, examples or whys)


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _videos(value: Any) -> list[str]:
    """Every video path a row's video field names (a path or a list of them)."""
    values = value if isinstance(value, list) else [value]
    return [v for v in (_text(x) for x in values) if v is not None]


def _one_video(row: dict[str, Any], key: str, images: str) -> tuple[list[str], str | None]:
    """`(videos, None)`: the row names one video; `(videos, reason)`: none, several, or
    images next to it."""
    videos = _videos(row.get(key))
    if len(videos) > 1:
        return videos, f"{len(videos)} videos in one row; one video per example is supported"
    if row.get(images):
        kind = "an image-only row (no video)" if not videos else "images next to the video"
        return videos, kind + ("" if not videos else "; one video per example is supported")
    if not videos:
        return videos, f"no video (field {key!r} missing or empty)"
    return videos, None


def _turns(messages: list[tuple[str, Any]]) -> tuple[list[tuple[str, str]], str | None] | str:
    """`[(user, assistant), ...]` and the system text, or the reason the turns are unusable."""
    system = None
    if messages and messages[0][0] == "system":
        system = _text(messages[0][1])
        messages = messages[1:]
    if not any(role == "assistant" for role, _ in messages):
        return "no assistant turn"
    tags = sum(len(VIDEO_TAGS.findall(v)) for r, v in messages if isinstance(v, str))
    if tags > 1:
        return f"{tags} <image>/<video> tags; one video per example is supported"
    pairs = []
    for i in range(0, len(messages), 2):
        pair = messages[i : i + 2]
        if [r for r, _ in pair] != ["user", "assistant"]:
            roles = [r for r, _ in messages]
            return f"turns must alternate user, assistant (ending with assistant); got {roles}"
        user, reply = (VIDEO_TAGS.sub("", v).strip() if isinstance(v, str) else "" for _, v in pair)
        if not reply:
            return f"assistant turn {i // 2 + 1} is empty or not text"
        pairs.append((user, reply))
    return pairs, system


def _chat(row: dict[str, Any], lay: Mapping[str, str], roles: Mapping[str, str]) -> _Read:
    """A row of one video and a list of turn objects, in the columns and tags of `lay`;
    `roles` maps the role tags to user / assistant / system."""
    video, why = _one_video(row, lay["videos"], lay["images"])
    if why is not None:
        return video, [why]
    turns = row.get(lay["messages"])
    role, text = lay["role_tag"], lay["content_tag"]
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        return video, [f"'{lay['messages']}' must be a list of {{{role}, {text}}} objects"]
    if row.get(lay["tools"]):
        return video, [f"a '{lay['tools']}' column (function calling) is not supported"]
    names = [str(t.get(role)) for t in turns]
    tools = [n for n in names if n in (lay["observation_tag"], lay["function_tag"])]
    if tools:
        return video, [f"a {tools[0]!r} turn (function calling) is not supported"]
    named = [roles.get(n) or roles.get(n.lower()) or n for n in names]  # tags: any case
    made = _turns([(r, t.get(text)) for r, t in zip(named, turns)])
    if isinstance(made, str):
        return video, [made]
    pairs, system = made
    column = _text(row.get(lay["system"]))
    return video, [(video[0], pairs, system if system is not None else column)]


def _llava(row: dict[str, Any], _: _Context) -> _Read:
    return _chat(row, _LLAVA, _ROLES)


def _sharegpt(row: dict[str, Any], ctx: _Context) -> _Read:
    """LLaMA-Factory's sharegpt: its dataset_info.json mapping where given, else its
    defaults (`conversations`, from / value, human / gpt) or, for a row with `messages`,
    the OpenAI form (role / content, user / assistant)."""
    lay = ctx.layout or (_LF if "conversations" in row and "messages" not in row else _OPENAI)
    roles = {lay["user_tag"]: "user", lay["assistant_tag"]: "assistant",
             lay["system_tag"]: "system"}  # fmt: skip
    return _chat(row, lay, roles)


def _caption(row: dict[str, Any], ctx: _Context) -> _Read:
    if "video_id" in row and "video" not in row and "video_path" not in row:
        video_id = _text(row.get("video_id"))
        videos = [_find_video(ctx.root, video_id, row.get("zip_folder"))] if video_id else []
        why = None if videos else "no video (field 'video_id' missing or empty)"
    else:
        key = "video_path" if "video_path" in row and "video" not in row else "video"
        videos, why = _one_video(row, key, "images")
    if why is not None:
        return videos, [why]
    captions = row["captions"] if "captions" in row else [row.get("caption")]
    if not isinstance(captions, list):
        return videos, ["'captions' must be a list"]
    if any(isinstance(c, dict) and "idx" in c for c in captions):  # ShareGPT4Video
        captions = [c for c in captions if isinstance(c, dict) and str(c.get("idx")) == "-1"]
        if len(captions) != 1:
            return videos, [f"{len(captions)} whole-video captions (idx -1); ShareGPT4Video "
                            "rows have one (the others describe keyframes)"]  # fmt: skip
    texts = [_text(c.get("content") if isinstance(c, dict) else c) for c in captions]
    if not texts or any(t is None for t in texts):
        return videos, ["a caption is missing, empty or not text"]
    prompt = _text(row.get("prompt")) or ctx.caption_prompt
    return videos, [(videos[0], [(prompt, t)], None) for t in texts if t is not None]


def _find_video(root: Path, video_id: str, zip_folder: Any) -> str:
    """ShareGPT4Video's `video_id` as a path relative to `root`, the first that exists of
    `<id>.mp4`, `.mkv`, ... or a frame folder `<id>/`, in `root` or the folder the row's
    zip unpacks to; else `<id>.mp4` (then reported missing)."""
    folders = [""] + ([Path(str(zip_folder)).stem + "/"] if _text(zip_folder) else [])
    for folder in folders:
        for suffix in VIDEO_SUFFIXES:
            if (root / f"{folder}{video_id}{suffix}").is_file():
                return f"{folder}{video_id}{suffix}"
        if (root / f"{folder}{video_id}").is_dir():
            return f"{folder}{video_id}"
    return f"{video_id}.mp4"


def _craft(row: dict[str, Any], ctx: _Context) -> _Read:
    """A craft-train manifest row, leniently (craft-train's own reader is the strict one)."""
    if "question" not in row and "answer" not in row:
        return _caption(row, ctx)
    videos, why = _one_video(row, "video", "images")
    if why is not None:
        return videos, [why]
    question, answer = _text(row.get("question")), _text(row.get("answer"))
    if question is None or answer is None:
        return videos, ["'question' and 'answer' must be non-empty text"]
    return videos, [(videos[0], [(question, answer)], None)]


def _resolve(video: str, root: Path) -> str:
    """`video` under `root` unless absolute (`~` expanded), normalised as `Path` does."""
    path = os.path.expanduser(video) if video.startswith("~") else video
    return str(Path(path) if os.path.isabs(path) else root / path)  # one Path a video


def _example(
    made: _Made, source: str, resolved: Mapping[str, str], video_fps: float | None, where: str
) -> Example:
    video, turns, system = made
    (prompt, target), *rest = turns
    return Example(resolved[video], prompt, target, source, tuple(rest), system, video_fps,
                   where)  # fmt: skip
