"""Video-MME without subtitles (2,700 questions, 900 videos)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from craft_eval.synthetic import DirectionQuestion
from craft_eval.tasks.base import (
    LETTERS,
    Benchmark,
    Item,
    Prompt,
    find_annotation,
    first_existing,
    read_records,
    strip_letter,
)
from craft_eval.tasks.parsing import first_letter_extract, mc_extract, strip_reasoning

INSTRUCTION = (
    "Select the best answer to the following multiple-choice question based on the video. "
    "Respond with only the letter (A, B, C, or D) of the correct option."
)
# lmms-eval 0.7.3 (tasks/videomme/utils.py:videomme_doc_to_text) says "and the subtitles"
# even without subtitles, and its default post_prompt starts with a newline (a blank line)
LMMS_INSTRUCTION = INSTRUCTION.replace(
    "based on the video.", "based on the video and the subtitles."
)
POST_PROMPT = "\nAnswer with the option's letter from the given choices directly."
ORIGINAL_POST_PROMPT = "The best answer is:"


class VideoMME(Benchmark):
    name = "videomme"
    title = "Video-MME"
    protocols = ("lmms-eval", "original")
    breakdowns = ("duration", "domain", "sub_category", "task_type")
    fixture_file = "videomme/test-00000-of-00001.parquet"

    def load(self, root: str | Path, *, subset: str | None = None) -> list[Item]:
        root = Path(root)
        files = find_annotation(
            root, ["videomme/test-*.parquet", "test-*.parquet", "*.parquet"], self.title
        )
        items = []
        for path in files:
            for rec in read_records(path):
                vid = str(rec["videoID"])
                # videos in <root>/data; with --data-root at the dataset root the parquet
                # folder is <root>/videomme and the videos sit beside it in <root>/data
                video = first_existing(
                    [
                        folder / "data" / f"{vid}{ext}"
                        for folder in (root, root.parent)
                        for ext in (".mp4", ".MP4", ".mkv")
                    ]
                )
                items.append(
                    Item(
                        benchmark=self.name,
                        id=str(rec["question_id"]),
                        video=str(video),
                        question=str(rec["question"]),
                        options=[strip_letter(o) for o in rec.options("options")],
                        answer=str(rec["answer"]).strip(),
                        categories={k: str(rec.get(k, "")) for k in self.breakdowns},
                        record=rec,
                    )
                )
        return items

    def prompt(self, item: Item, protocol: str = "lmms-eval") -> Prompt:
        self.check_protocol(protocol, None)
        options = "\n".join(str(o) for o in item.record["options"])
        if protocol == "original":
            text = f"{INSTRUCTION}\n{item.question}\n{options}\n{ORIGINAL_POST_PROMPT}"
        else:
            text = f"{LMMS_INSTRUCTION}\n{item.question}\n{options}\n{POST_PROMPT}"
        return Prompt(text, max_new_tokens=16)

    def parse(
        self, reply: str, item: Item, protocol: str = "lmms-eval", fallback: str | None = None
    ) -> str:
        if protocol == "original":
            return first_letter_extract(reply, "ABCD")
        return mc_extract(strip_reasoning(reply), "ABCD")

    def rules(self, protocol: str) -> str:
        if protocol == "original":
            return 'prompt ends "The best answer is:"; first A-D after removing answer prefixes'
        return "lmms-eval prompt; multiple-choice extractor A-D (preference order, benchmarks.md)"

    def fixture_item(self, i: int, q: DirectionQuestion) -> tuple[str, dict[str, Any]]:
        vid = f"vid{i:03d}"
        return f"data/{vid}.mp4", {
            "video_id": f"{i:03d}",
            "duration": ["short", "medium", "long"][i % 3],
            "domain": ["Knowledge", "Life Record"][i % 2],
            "sub_category": ["Humanity & History", "Daily Life"][i % 2],
            "url": f"https://www.youtube.com/watch?v={vid}",
            "videoID": vid,
            "question_id": f"{i:03d}-1",
            "task_type": ["Counting Problem", "Action Recognition"][i % 2],
            "question": q.text,
            "options": [f"{LETTERS[k]}. {c.capitalize()}." for k, c in enumerate(q.candidates)],
            "answer": LETTERS[q.gold],
        }
