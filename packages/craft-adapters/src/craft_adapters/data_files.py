"""Readers of the video SFT data people hold: rows -> `Example` (video + turns). No torch.

    examples, problems = read_data_file("llava_video_178k.json", fmt="auto")

Shared by craft-train (training on these files) and craft-eval (`craft-eval audit`: the
files against the benchmarks), which may not import each other: so the readers live here.

Formats (`fmt`, or "auto": told apart by the first row's keys):

- `llava`: LLaVA-Video-178K / LLaVA-OneVision conversation JSON or JSONL,
  `{"id", "video", "conversations": [{"from": "human", "value": "<image>\\n..."},
  {"from": "gpt", "value": "..."}, ...], "data_source"}`; many turns per video.
- `sharegpt`: ShareGPT / LLaMA-Factory, `{"messages": [{"role": "user", "content":
  "<video>..."}, {"role": "assistant", ...}], "videos": ["a.mp4"]}` (a `system` message
  becomes the system turn).
- `caption`: ShareGPT4Video-style caption rows, `{"video" | "video_path", "caption"}` or
  `"captions": [...]` (each caption one example; an entry may be `{"content": ...}`).
- `craft`: craft-train's own JSONL manifest, `{"video", "caption" | "question" + "answer",
  "source"}` (craft-train trains on it with its strict `read_manifest`: a bad row is an
  error there).

`<image>` / `<video>` in a user turn marks the video; the tag is taken out and the video goes
where the backbone's chat template puts it (first in the first user turn). A row that cannot
be used (no video, an image-only row, two videos, no assistant turn, turns out of order) is
returned as a `Problem` naming its `file:line`; the caller reports it, nothing is dropped
silently. The `--check` of the CLI lists them all.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "FORMATS",
    "Example",
    "FormatError",
    "Problem",
    "dataset_path",
    "detect_format",
    "iter_rows",
    "read_data_file",
]

FORMATS = ("llava", "sharegpt", "caption", "craft")
VIDEO_TAGS = re.compile(r"<video>|<image>")
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
          "system": "system"}  # fmt: skip


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
    """A data file that cannot be read at all (not JSON, unknown format); names the file."""


def iter_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """`(line, row)` of a JSON array file or a JSONL file (the line a row starts on).

    Raises:
        FormatError: text that is not JSON (file and line named).
    """
    text = path.read_text(encoding="utf-8")
    start = len(text) - len(text.lstrip())
    if text[start : start + 1] == "[":
        yield from _array_rows(path, text, start + 1)
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as err:
                raise FormatError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None


def _array_rows(path: Path, text: str, pos: int) -> Iterator[tuple[int, Any]]:
    """The elements of a JSON array, each with the line it starts on (counted as we go)."""
    decoder = json.JSONDecoder()
    line, counted = 1, 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        line += text.count("\n", counted, pos)
        counted = pos
        try:
            row, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            raise FormatError(f"{path}:{line}: not valid JSON ({err.msg})") from None
        yield line, row


def dataset_path(root: str | None, json_path: str) -> Path:
    """A mixture entry's file: `json_path` (`$VAR` and `~` expanded), a relative one under
    `root` (also expanded; None: the working directory)."""
    path = Path(os.path.expandvars(json_path)).expanduser()
    if path.is_absolute() or root is None:
        return path
    return Path(os.path.expandvars(root)).expanduser() / path


def detect_format(path: Path, row: Any) -> str:
    """The format of a file from its first row's keys.

    Raises:
        FormatError: the keys fit no format (the file and its keys named).
    """
    keys = set(row) if isinstance(row, dict) else set()
    if "conversations" in keys:
        return "llava"
    if "messages" in keys:
        return "sharegpt"
    if {"question", "answer"} & keys or {"caption", "source"} <= keys:
        return "craft"
    if {"caption", "captions"} & keys:
        return "caption"
    raise FormatError(
        f"{path}: cannot tell the format from the first row (keys {sorted(keys)}); set "
        f"`format:` to one of {', '.join(FORMATS)} in its data entry"
    )


def read_data_file(
    path: str | Path,
    fmt: str = "auto",
    *,
    source: str | None = None,
    video_root: str | None = None,
    video_fps: float | None = None,
    caption_prompt: str = "Describe this video in detail.",
) -> tuple[list[Example], list[Problem]]:
    """Read one data file of any format ("auto": detected from its first row).

    Args:
        source: source name of every row (default: the row's `data_source` or `source`, else
            the file's name without suffix).
        video_root: folder relative video paths start in (default: the file's folder).
        video_fps: frames per second of the videos that are frame folders.
        caption_prompt: prompt of caption rows that give no `prompt` of their own.

    Returns:
        The usable examples in file order, and the rows that cannot be used.
    """
    path = Path(path)
    root = Path(video_root) if video_root is not None else path.parent
    examples: list[Example] = []
    problems: list[Problem] = []
    for lineno, row in iter_rows(path):
        where = f"{path}:{lineno}"
        if fmt == "auto":
            fmt = detect_format(path, row)
        if not isinstance(row, dict):
            problems.append(Problem(where, "a row must be a JSON object"))
            continue
        name = source or _text(row.get("data_source")) or _text(row.get("source")) or path.stem
        read = {"llava": _llava, "sharegpt": _sharegpt, "caption": _caption, "craft": _craft}[fmt]
        for made in read(row, caption_prompt):
            if isinstance(made, str):
                problems.append(Problem(where, made))
                continue
            video, turns, system = made
            examples.append(_example(video, turns, system, name, root, video_fps, where))
    return examples, problems


_Made = tuple[str, list[tuple[str, str]], str | None]


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _one_video(row: dict[str, Any], key: str) -> tuple[str | None, str]:
    """`(path, "")`: the row's single video; `(None, reason)` when it has none or several."""
    value = row.get(key)
    if isinstance(value, list):
        if len(value) > 1:
            return None, f"{len(value)} videos in one row; one video per example is supported"
        value = value[0] if value else None
    path = _text(value)
    if path is None:
        if row.get("image") or row.get("images"):
            return None, "an image-only row (no video)"
        return None, f"no video (field {key!r} missing or empty)"
    return path, ""


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


def _chat(
    row: dict[str, Any], video_key: str, turns_key: str, role: str, text: str
) -> list[_Made | str]:
    """A row of one video and a list of `{role, text}` turn objects under `turns_key`."""
    video, why = _one_video(row, video_key)
    if video is None:
        return [why]
    turns = row.get(turns_key)
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        return [f"'{turns_key}' must be a list of {{{role}, {text}}} objects"]
    roles = [_ROLES.get(str(t.get(role)).lower(), str(t.get(role))) for t in turns]
    made = _turns([(r, t.get(text)) for r, t in zip(roles, turns)])
    return [made if isinstance(made, str) else (video, *made)]


def _llava(row: dict[str, Any], _: str) -> list[_Made | str]:
    return _chat(row, "video", "conversations", "from", "value")


def _sharegpt(row: dict[str, Any], _: str) -> list[_Made | str]:
    return _chat(row, "videos", "messages", "role", "content")


def _caption(row: dict[str, Any], caption_prompt: str) -> list[_Made | str]:
    video, why = _one_video(row, "video" if "video" in row else "video_path")
    if video is None:
        return [why]
    captions = row["captions"] if "captions" in row else [row.get("caption")]
    if not isinstance(captions, list):
        return ["'captions' must be a list"]
    texts = [_text(c.get("content") if isinstance(c, dict) else c) for c in captions]
    if not texts or any(t is None for t in texts):
        return ["a caption is missing, empty or not text"]
    prompt = _text(row.get("prompt")) or caption_prompt
    return [(video, [(prompt, t)], None) for t in texts if t is not None]


def _craft(row: dict[str, Any], caption_prompt: str) -> list[_Made | str]:
    """A craft-train manifest row, leniently (craft-train's own reader is the strict one)."""
    if "question" not in row and "answer" not in row:
        return _caption(row, caption_prompt)
    video, why = _one_video(row, "video")
    if video is None:
        return [why]
    question, answer = _text(row.get("question")), _text(row.get("answer"))
    if question is None or answer is None:
        return ["'question' and 'answer' must be non-empty text"]
    return [(video, [(question, answer)], None)]


def _example(
    video: str,
    turns: list[tuple[str, str]],
    system: str | None,
    source: str,
    root: Path,
    video_fps: float | None,
    where: str,
) -> Example:
    path = Path(video).expanduser()
    path = path if path.is_absolute() else root / path
    (prompt, target), *rest = turns
    return Example(
        str(path), prompt, target, source, tuple(rest), system, video_fps, where
    )  # fmt: skip
