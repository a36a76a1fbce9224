"""What every benchmark provides: items, prompts, answer parsing and scoring rules."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from craft_eval.synthetic import DirectionQuestion, direction_question, write_json, write_parquet
from craft_eval.tasks.parsing import random_fallback

LETTERS = "ABCDEFGHIJ"
REFERENCE = "lmms-eval 0.7.3"


@dataclass
class Item:
    """One question of a benchmark, read from the data as distributed.

    Attributes:
        benchmark: benchmark name ("videomme", ...).
        id: unique within the benchmark (the dataset's own question id where it has one).
        video: path of the video file (absolute; may not exist: the run records an error).
        question: the question text as distributed.
        options: the option texts WITHOUT their letters, in order (A, B, ...).
        answer: the gold letter; "" when the answer is not public (EgoSchema full set).
        categories: breakdown fields (e.g. {"duration": "short", "domain": ...}).
        segment: (start, end) seconds for benchmarks that ask about part of a clip.
        record: the raw record (JSON-safe), which the prompt builders read.
    """

    benchmark: str
    id: str
    video: str
    question: str
    options: list[str]
    answer: str
    categories: dict[str, str] = field(default_factory=dict)
    segment: tuple[float, float] | None = None
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def letters(self) -> str:
        return LETTERS[: len(self.options)]


@dataclass(frozen=True)
class Prompt:
    """What the model is asked: user text (after the video), optional system prompt, and a
    forced start of the assistant's reply (MVBench's original "Best option:(")."""

    text: str
    max_new_tokens: int
    system: str | None = None
    assistant_prefix: str = ""


class Benchmark:
    """Base class of the six benchmarks.

    Subclasses set the class attributes and implement `load`, `prompt` and `parse`.
    `protocols`: the protocol names offered, the first being the default
    (always "lmms-eval", the reference). `fallbacks`: for parsers whose reference picks a
    random letter on an unparseable reply: ("random", "empty"), default "random".
    """

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    protocols: ClassVar[tuple[str, ...]] = ("lmms-eval",)
    fallbacks: ClassVar[tuple[str, ...]] = ()
    breakdowns: ClassVar[tuple[str, ...]] = ()
    macro_over: ClassVar[str | None] = None
    """Category whose per-group accuracies are averaged for the headline number (MVBench's
    tasks, MLVU's M-Avg); None: plain accuracy over all items."""
    macro_groups: ClassVar[tuple[str, ...]] = ()
    """When set, the headline divides by exactly these groups (absent ones count 0), as
    lmms-eval's MLVU aggregation does."""
    fixture_file: ClassVar[str] = ""
    """Where `write_fixture` writes the annotation rows, under the root (.json: JSON)."""
    skip_empty_replies: ClassVar[bool] = False
    """lmms-eval's MVBench aggregation leaves items with an empty reply (after reasoning
    tags are stripped) out of the denominator."""

    def load(self, root: str | Path, *, subset: str | None = None) -> list[Item]:
        raise NotImplementedError

    def prompt(self, item: Item, protocol: str = "lmms-eval") -> Prompt:
        raise NotImplementedError

    def parse(
        self, reply: str, item: Item, protocol: str = "lmms-eval", fallback: str | None = None
    ) -> str:
        raise NotImplementedError

    def is_correct(self, prediction: str, item: Item) -> bool | None:
        """Letter equality; None when the gold answer is not public."""
        if not item.answer:
            return None
        return prediction.upper() == item.answer.upper()

    def check_protocol(self, protocol: str, fallback: str | None) -> None:
        if protocol not in self.protocols:
            raise ValueError(
                f"{self.name}: unknown protocol {protocol!r}; offered: {', '.join(self.protocols)}"
            )
        if fallback is not None and fallback not in self.fallbacks:
            offered = ", ".join(self.fallbacks) or "none (this parser never guesses)"
            raise ValueError(f"{self.name}: unknown fallback {fallback!r}; offered: {offered}")

    def describe_protocol(
        self, protocol: str = "lmms-eval", fallback: str | None = None
    ) -> dict[str, Any]:
        """What goes into every result file: which prompt/parser/scoring rules ran."""
        self.check_protocol(protocol, fallback)
        info: dict[str, Any] = {
            "benchmark": self.name,
            "protocol": protocol,
            "reference": REFERENCE if protocol == "lmms-eval" else f"original {self.title} code",
            "rules": self.rules(protocol),
        }
        if self.fallbacks:
            chosen = fallback or self.fallbacks[0]
            info["fallback"] = chosen
            info["fallback_rule"] = (
                "unparseable reply -> random letter seeded by (0, item id), as lmms-eval"
                if chosen == "random"
                else 'unparseable reply -> "" (scored wrong, deterministic)'
            )
        info["headline"] = (
            f"mean of per-{self.macro_over} accuracies" if self.macro_over else "accuracy"
        )
        return info

    def or_fallback(self, letter: str | None, item: Item, fallback: str | None) -> str:
        """The parsed `letter`, else this parser's fallback (`fallbacks`; the first by
        default): "random" is lmms-eval's seeded random letter, "empty" scores it wrong."""
        if letter is not None:
            return letter
        if (fallback or self.fallbacks[0]) == "random":
            return random_fallback(item.id, item.letters)
        return ""

    def write_fixture(self, root: Path, video: Callable[[Path, int], str], num_items: int) -> None:
        """A tiny dataset in this benchmark's distributed layout (`craft_eval.fixtures`): item
        `i` asks `direction_question(i)` of clip `i`; `fixture_item` says where its clip goes
        and what its annotation row holds; the rows go to `fixture_file` (JSON or parquet)."""
        rows = []
        for i in range(num_items):
            clip, row = self.fixture_item(i, direction_question(i))
            video(root / clip, i)
            rows.append(row)
        write = write_json if self.fixture_file.endswith(".json") else write_parquet
        write(root / self.fixture_file, rows)

    def fixture_item(self, i: int, q: DirectionQuestion) -> tuple[str, dict[str, Any]]:
        """Fixture item `i`, asking `q`: its clip's path under the root and its annotation row."""
        raise NotImplementedError(f"no fixture writer for {self.name!r}")

    def rules(self, protocol: str) -> str:
        """One line naming the prompt and parser of `protocol` (for result files)."""
        return ""


class AnnotationError(ValueError):
    """An annotation file or record is malformed; the message names the file, the record (its
    index and id) and what was expected."""


_ID_FIELDS = ("question_id", "id", "question_idx", "uid", "_key")


class Record(dict):  # type: ignore[type-arg]
    """One record of an annotation file: a plain dict (JSON-safe, as stored in `Item.record`)
    whose missing fields and badly typed values raise `AnnotationError` naming where it is."""

    where = "an annotation record"  # set by read_records: "annotation file F, record I (id X)"

    def __missing__(self, key: str) -> Any:
        fields = ", ".join(sorted(str(k) for k in self)) or "none"
        raise AnnotationError(f"{self.where} has no field {key!r} (its fields: {fields})")

    def options(self, key: str) -> list[str]:
        """Field `key` as option texts: a non-empty list of strings or numbers."""
        value = self[key]
        if (
            not isinstance(value, list)
            or not value
            or any(isinstance(v, (dict, list)) for v in value)
        ):
            raise self.bad(key, "a non-empty list of option texts")
        return [str(v) for v in value]

    def number(self, key: str) -> float:
        """Field `key` as a finite number (seconds, ...)."""
        value = self[key]
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise self.bad(key, "a number") from None
        if isinstance(value, bool) or not math.isfinite(number):
            raise self.bad(key, "a finite number")
        return number

    def choice(self, key: str, options: list[str]) -> str:
        """Field `key`, an option index 0 .. len(options) - 1, as its letter."""
        value = self[key]
        try:
            index = int(value) if not isinstance(value, (bool, float)) else -1
        except (TypeError, ValueError):
            index = -1
        if not 0 <= index < len(options):
            raise self.bad(key, f"an option index 0..{len(options) - 1}")
        return LETTERS[index]

    def bad(self, key: str, expected: str) -> AnnotationError:
        """The error for field `key` not holding `expected`."""
        got = repr(self[key])
        got = got if len(got) <= 60 else got[:57] + "..."
        return AnnotationError(f"{self.where}: field {key!r} must be {expected}, got {got}")


def read_records(path: Path) -> list[Record]:
    """Rows of a .json (list, {"data": [...]}, or {id: record}) / .jsonl / .parquet file.

    Raises:
        ValueError: the file cannot be parsed, or is not a list of objects (`AnnotationError`);
            the message names it.
    """
    try:
        rows = _read_records(path)
    except AnnotationError:
        raise
    except (OSError, ValueError, UnicodeDecodeError) as error:  # pyarrow's errors are ValueErrors
        raise ValueError(f"annotation file {path} cannot be read: {error}") from None
    bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
    if bad is not None:
        raise AnnotationError(f"annotation file {path}: record {bad} is not an object")
    records = []
    for index, row in enumerate(rows):
        record = Record(row)
        ident = next((row[k] for k in _ID_FIELDS if row.get(k) not in (None, "")), None)
        record.where = f"annotation file {path}, record {index}" + (
            f" (id {ident!r})" if ident is not None else ""
        )
        records.append(record)
    return records


def _read_records(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return [_plain(r) for r in pq.read_table(path).to_pylist()]
    if suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, dict):
        for key in ("data", "questions", "records"):
            if isinstance(data.get(key), list):
                return list(data[key])
        if not all(isinstance(v, dict) for v in data.values()):
            keys = ", ".join(list(map(str, data))[:6])
            raise AnnotationError(
                f"annotation file {path} is an object (keys: {keys}); expected a list of "
                'records, {"data": [records]}, or {id: record}'
            )
        return [dict(v, _key=k) for k, v in data.items()]
    if not isinstance(data, list):
        raise AnnotationError(
            f"annotation file {path} holds a {type(data).__name__}; expected a list of records"
        )
    return data


def _plain(value: Any) -> Any:
    """numpy / pyarrow scalars and arrays -> plain Python (JSON-safe)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def find_annotation(root: Path, patterns: list[str], what: str) -> list[Path]:
    """Annotation files under `root` matching the first pattern that matches anything."""
    for pattern in patterns:
        found = sorted(p for p in root.glob(pattern) if p.is_file())
        if found:
            return found
    tried = ", ".join(patterns)
    raise FileNotFoundError(f"{what}: no annotation file under {root} (looked for {tried})")


def first_existing(candidates: list[Path]) -> Path:
    """The first candidate that exists, else the first candidate (the run records the error)."""
    for path in candidates:
        if path.exists():
            return path
    return candidates[0]


def strip_letter(option: str) -> str:
    """ "A. Candles." -> "Candles."; "(B) text" -> "text"; other strings unchanged."""
    import re

    match = re.match(r"^\s*\(?([A-J])[\.\):]\s*(.*)$", option, flags=re.S)
    return match.group(2) if match else option
