"""LongVideoBench, validation split without subtitles (1,337 questions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from craft_eval.synthetic import DirectionQuestion
from craft_eval.tasks.base import LETTERS, Benchmark, Item, Prompt, find_annotation, read_records
from craft_eval.tasks.parsing import lvb_extract, strip_reasoning

POST_PROMPT = "Answer with the option's letter from the given choices directly.\n"  # sic


class LongVideoBench(Benchmark):
    name = "longvideobench"
    title = "LongVideoBench"
    fallbacks = ("random", "empty")
    breakdowns = ("duration_group", "question_category")
    fixture_file = "lvb_val.json"

    def load(self, root: str | Path, *, subset: str | None = None) -> list[Item]:
        root = Path(root)
        files = find_annotation(
            root,
            ["lvb_val.json", "validation-*.parquet", "*/validation-*.parquet"],
            self.title,
        )
        items = []
        for path in files:
            for rec in read_records(path):
                if "candidates" in rec and rec["candidates"] is not None:
                    options = rec.options("candidates")
                else:  # parquet form: option0..option4, "N/A" for absent ones
                    options = [
                        str(rec[f"option{i}"])
                        for i in range(5)
                        if rec.get(f"option{i}") not in (None, "N/A")
                    ]
                items.append(
                    Item(
                        benchmark=self.name,
                        id=str(rec["id"]),
                        video=str(root / "videos" / str(rec["video_path"])),
                        question=str(rec["question"]),
                        options=options,
                        answer=rec.choice("correct_choice", options),
                        categories={k: str(rec.get(k, "")) for k in self.breakdowns},
                        record=rec,
                    )
                )
        return items

    def prompt(self, item: Item, protocol: str = "lmms-eval") -> Prompt:
        self.check_protocol(protocol, None)
        lines = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(item.options))
        return Prompt(f"{item.question}\n{lines}\n{POST_PROMPT}", max_new_tokens=32)

    def parse(
        self, reply: str, item: Item, protocol: str = "lmms-eval", fallback: str | None = None
    ) -> str:
        return self.or_fallback(lvb_extract(strip_reasoning(reply)), item, fallback)

    def rules(self, protocol: str) -> str:
        return "lmms-eval prompt; answer prefixes removed, first A-E character"

    def fixture_item(self, i: int, q: DirectionQuestion) -> tuple[str, dict[str, Any]]:
        vid = f"lvb{i:03d}"
        return f"videos/{vid}.mp4", {
            "video_id": vid,
            "id": f"{vid}_0",
            "question": q.text,
            "candidates": [f"It moves {c}." for c in q.candidates] + ["It does not move."],
            "correct_choice": q.gold,
            "question_category": ["TAA", "S2E", "E3E"][i % 3],
            "duration_group": [15, 60, 600, 3600][i % 4],
            "duration": 4.0,
            "video_path": f"{vid}.mp4",
            "subtitle_path": f"{vid}_en.json",
        }
