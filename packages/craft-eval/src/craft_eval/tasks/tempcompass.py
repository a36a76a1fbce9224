"""TempCompass, multiple-choice split (1,580 questions, 5 temporal dimensions)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from craft_eval.synthetic import DirectionQuestion
from craft_eval.tasks.base import LETTERS, Benchmark, Item, Prompt, find_annotation, read_records
from craft_eval.tasks.parsing import strip_reasoning, tempcompass_extract


class TempCompass(Benchmark):
    name = "tempcompass"
    title = "TempCompass"
    breakdowns = ("dim",)
    fixture_file = "multi-choice/test-00000-of-00001.parquet"

    def load(self, root: str | Path, *, subset: str | None = None) -> list[Item]:
        root = Path(root)
        files = find_annotation(
            root,
            ["multi-choice/*.parquet", "multi_choice*.json", "multi-choice*.json", "*.parquet"],
            self.title,
        )
        items = []
        seen: Counter[str] = Counter()
        for path in files:
            for rec in read_records(path):
                vid = str(rec["video_id"])
                lines = str(rec["question"]).split("\n")
                options = [
                    m.group(2) for m in (re.match(r"^([A-J])\. ?(.*)$", x) for x in lines[1:]) if m
                ]
                key = f"{vid}/{rec.get('dim', '')}"
                items.append(
                    Item(
                        benchmark=self.name,
                        id=f"{key}/{seen[key]}",
                        video=str(root / "videos" / f"{vid}.mp4"),
                        question=lines[0],
                        options=options,
                        answer=str(rec["answer"]).strip()[:1],
                        categories={"dim": str(rec.get("dim", ""))},
                        record=rec,
                    )
                )
                seen[key] += 1
        return items

    def prompt(self, item: Item, protocol: str = "lmms-eval") -> Prompt:
        self.check_protocol(protocol, None)
        return Prompt(
            str(item.record["question"]) + "\nPlease directly give the best option:",
            # lmms-eval's TempCompass sets no generation_kwargs: the model class's default
            # (128 for lmms-eval's Qwen2.5-VL and Qwen3-VL classes) applies
            max_new_tokens=128,
        )

    def parse(
        self, reply: str, item: Item, protocol: str = "lmms-eval", fallback: str | None = None
    ) -> str:
        letter = tempcompass_extract(strip_reasoning(reply), str(item.record["answer"]))
        return letter or ""  # lmms-eval asks an LLM judge here; offline: scored wrong

    def rules(self, protocol: str) -> str:
        return (
            "lmms-eval rules: reply == answer, or one of A-D, or starts with 'X.'/'X)' (X in "
            "A-D); otherwise 0 where lmms-eval would ask an LLM judge (offline)"
        )

    def fixture_item(self, i: int, q: DirectionQuestion) -> tuple[str, dict[str, Any]]:
        vid = f"{1034419625 + i}" + ("_reverse" if i % 3 == 2 else "")
        lines = [f"{LETTERS[k]}. {c}" for k, c in enumerate(q.candidates)]
        return f"videos/{vid}.mp4", {
            "video_id": vid,
            "dim": ["action", "speed", "direction", "order", "attribute_change"][i % 5],
            "question": q.text + "\n" + "\n".join(lines),
            "answer": lines[q.gold],
        }
