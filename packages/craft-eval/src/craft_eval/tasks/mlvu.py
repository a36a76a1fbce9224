"""MLVU dev set, multiple choice (2,174 questions, 7 tasks; headline: M-Avg)."""

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
)
from craft_eval.tasks.parsing import mc_extract, strip_reasoning

# the task of fixture item i: FIXTURE_TASK_TYPES[i % 7]
FIXTURE_TASK_TYPES = (
    "plotQA",
    "needle",
    "ego",
    "count",
    "order",
    "anomaly_reco",
    "topic_reasoning",
)


class MLVU(Benchmark):
    name = "mlvu"
    title = "MLVU"
    breakdowns = ("task_type",)
    macro_over = "task_type"
    # lmms-eval 0.7.3 tasks/mlvu/utils.py:mlvu_aggregate_results_dev divides by these 7
    macro_groups = ("anomaly_reco", "count", "ego", "needle", "order", "plotQA", "topic_reasoning")
    fixture_file = "dev-00000-of-00001.parquet"

    def load(self, root: str | Path, *, subset: str | None = None) -> list[Item]:
        root = Path(root)
        files = find_annotation(
            root, ["dev*.parquet", "*/dev*.parquet", "test*.parquet", "*.parquet"], self.title
        )
        items = []
        for path in files:
            for index, rec in enumerate(read_records(path)):
                name = str(rec["video_name"])
                video = first_existing([root / name, root / "video" / name, root / "videos" / name])
                qid = rec.get("question_id")
                items.append(
                    Item(
                        benchmark=self.name,
                        id=str(qid) if qid not in (None, "") else f"{path.stem}/{index}",
                        video=str(video),
                        question=str(rec["question"]).split("\n")[0],
                        options=rec.options("candidates"),
                        answer=str(rec["answer"]).strip(),
                        categories={"task_type": str(rec.get("task_type", ""))},
                        record=rec,
                    )
                )
        return items

    def prompt(self, item: Item, protocol: str = "lmms-eval") -> Prompt:
        self.check_protocol(protocol, None)
        text = str(item.record["question"]) + "\nOnly give the best option.\nBest option: ("
        return Prompt(text, max_new_tokens=16)

    def parse(
        self, reply: str, item: Item, protocol: str = "lmms-eval", fallback: str | None = None
    ) -> str:
        return mc_extract(strip_reasoning(reply), "ABCD")

    def rules(self, protocol: str) -> str:
        return 'lmms-eval prompt ending "Best option: ("; multiple-choice extractor A-D'

    def fixture_item(self, i: int, q: DirectionQuestion) -> tuple[str, dict[str, Any]]:
        name = f"mlvu_{i:03d}.mp4"
        text = q.text + "\n" + "\n".join(f"({LETTERS[k]}) {c}" for k, c in enumerate(q.candidates))
        return f"video/{name}", {
            "video_name": name,
            "duration": 4.0,
            "question": text,
            "candidates": q.candidates,
            "answer": LETTERS[q.gold],
            "task_type": FIXTURE_TASK_TYPES[i % 7],
            "question_id": f"mlvu-{i}",
        }
