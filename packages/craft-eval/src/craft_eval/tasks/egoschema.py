"""EgoSchema: the 500-question public-answer subset (scored here) or the full 5,031 set
(answers held by the server: write a submission file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from craft_eval.synthetic import DirectionQuestion
from craft_eval.tasks.base import (
    LETTERS,
    Benchmark,
    Item,
    Prompt,
    find_annotation,
    read_records,
    strip_letter,
)
from craft_eval.tasks.parsing import mmmu_extract, strip_reasoning

POST_PROMPT = "Answer with the option's letter from the given choices directly."


class EgoSchema(Benchmark):
    name = "egoschema"
    title = "EgoSchema"
    fallbacks = ("random", "empty")
    fixture_file = "Subset/test-00000-of-00001.parquet"

    def load(self, root: str | Path, *, subset: str | None = None) -> list[Item]:
        """`subset`: "subset" (default, 500 public answers) or "full" (no answers)."""
        root = Path(root)
        which = subset or "subset"
        if which == "subset":
            patterns = ["Subset/*.parquet", "subset*.json", "subset*.jsonl", "subset*.parquet"]
        elif which == "full":
            patterns = ["MC/*.parquet", "full*.json", "full*.jsonl", "questions.json"]
        else:
            raise ValueError(f"EgoSchema subset must be 'subset' or 'full', got {which!r}")
        items = []
        for path in find_annotation(root, patterns, f"{self.title} ({which})"):
            for rec in read_records(path):
                answer = _answer_letter(rec.get("answer"), len(rec.options("option")), path)
                items.append(
                    Item(
                        benchmark=self.name,
                        id=str(rec["question_idx"]),
                        video=str(root / "videos" / f"{rec['video_idx']}.mp4"),
                        question=str(rec["question"]),
                        options=[strip_letter(o) for o in rec.options("option")],
                        answer=answer,
                        record=rec,
                    )
                )
        return items

    def prompt(self, item: Item, protocol: str = "lmms-eval") -> Prompt:
        self.check_protocol(protocol, None)
        options = "\n".join(str(o) for o in item.record["option"])
        return Prompt(f"{item.question}\n{options}\n{POST_PROMPT}", max_new_tokens=16)

    def parse(
        self, reply: str, item: Item, protocol: str = "lmms-eval", fallback: str | None = None
    ) -> str:
        # lmms-eval matches the option texts as distributed ("A. ..."), stripped
        texts = [str(o).strip() for o in item.record.get("option", item.options)]
        letter = mmmu_extract(strip_reasoning(reply), dict(zip(item.letters, texts)))
        return self.or_fallback(letter, item, fallback)

    def rules(self, protocol: str) -> str:
        return 'lmms-eval prompt; MMMU-style parser ("(A)", "A ", "A.", option texts)'

    def fixture_item(self, i: int, q: DirectionQuestion) -> tuple[str, dict[str, Any]]:
        uid = f"0000{i:04d}-aaaa-bbbb-cccc-{i:012d}"
        opts = [f"{LETTERS[k]}. The square moves {c}." for k, c in enumerate(q.candidates)]
        opts.append("E. The square stays still.")
        return f"videos/{uid}.mp4", {
            "question_idx": uid,
            "question": q.text,
            "video_idx": uid,
            "option": opts,
            "answer": str(q.gold),
        }


def _answer_letter(raw: Any, n_options: int, path: Path) -> str:
    """The gold letter of an answer index (0 .. n_options - 1); "" when not public."""
    if raw in (None, ""):
        return ""
    try:
        index = int(raw)
    except (TypeError, ValueError):
        index = -1
    if not 0 <= index < n_options:
        raise ValueError(
            f"{path}: field 'answer' = {raw!r} is not an option index 0..{n_options - 1}"
        )
    return LETTERS[index]


def write_submission(records: list[dict[str, Any]], path: str | Path) -> Path:
    """The submission file of the full set: `{"<question_idx>": <answer index 0-4>}`
    (unparsed replies are left out; the server counts them wrong)."""
    answers = {}
    for rec in records:
        pred = rec.get("prediction") or ""
        if rec.get("status") == "ok" and pred in LETTERS:
            answers[str(rec["id"])] = LETTERS.index(pred)
    path = Path(path)
    path.write_text(json.dumps(answers, indent=1, sort_keys=True), encoding="utf-8")
    return path
