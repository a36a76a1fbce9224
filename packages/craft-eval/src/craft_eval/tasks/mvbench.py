"""MVBench: 19 tasks x 200 questions (episodic_reasoning skipped: it ships frame folders)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from craft_eval.synthetic import VideoWriter, clip_of, direction_question, write_json
from craft_eval.tasks.base import LETTERS, Benchmark, Item, Prompt, first_existing, read_records
from craft_eval.tasks.parsing import mvbench_extract, mvbench_original_extract, strip_reasoning

VIDEO_FOLDERS = {
    "object_interaction": "star/Charades_segment",
    "action_sequence": "star/Charades_segment",
    "action_prediction": "star/Charades_segment",
    "action_localization": "sta/sta_video_segment",
    "moving_count": "clevrer/video_validation",
    "moving_direction": "clevrer/video_validation",
    "moving_attribute": "clevrer/video_validation",
    "object_existence": "clevrer/video_validation",
    "counterfactual_inference": "clevrer/video_validation",
    "fine_grained_pose": "nturgbd_convert",
    "character_order": "perception/videos",
    "object_shuffle": "perception/videos",
    "state_change": "perception/videos",
    "action_count": "perception/videos",
    "egocentric_navigation": "vlnqa",
    "fine_grained_action": "Moments_in_Time_Raw/videos",
    "scene_transition": "scene_qa/video",
    "action_antonym": "ssv2_video_mp4",
    "unexpected_action": "FunQA_test/test",
}
TASKS = tuple(VIDEO_FOLDERS)
SKIPPED = {"episodic_reasoning": "tvqa/video_fps3_hq_segment (frame folders at 3 fps)"}

ORIGINAL_SYSTEM = (
    "Carefully watch the video and pay attention to the cause and sequence of events, the "
    "detail and movement of objects, and the action and pose of persons. Based on your "
    "observations, select the best option that accurately addresses the question.\n"
)


class MVBench(Benchmark):
    name = "mvbench"
    title = "MVBench"
    protocols = ("lmms-eval", "original")
    breakdowns = ("task",)
    macro_over = "task"
    skip_empty_replies = True  # lmms-eval 0.7.3 tasks/mvbench/utils.py:mvbench_aggregate_results

    def load(self, root: str | Path, *, subset: str | None = None) -> list[Item]:
        """`subset`: comma-separated task names (default: all 19 present under json/)."""
        root = Path(root)
        tasks = TASKS if subset is None else tuple(t.strip() for t in subset.split(","))
        unknown = [t for t in tasks if t not in VIDEO_FOLDERS]
        if unknown:
            raise ValueError(f"MVBench: unknown or skipped task(s) {unknown}; tasks: {TASKS}")
        missing = [t for t in tasks if not (root / "json" / f"{t}.json").exists()]
        if len(missing) == len(tasks):
            raise FileNotFoundError(f"MVBench: no json/<task>.json under {root}")
        if missing:
            warnings.warn(f"MVBench: task files missing under {root}/json: {missing}", stacklevel=2)
        items = []
        for task in tasks:
            path = root / "json" / f"{task}.json"
            if not path.exists():
                continue
            for index, rec in enumerate(read_records(path)):
                candidates = rec.options("candidates")
                answer = str(rec["answer"])
                if answer not in candidates:
                    raise rec.bad("answer", f"one of its candidates {candidates}")
                segment = None
                if rec.get("start") is not None and rec.get("end") is not None:
                    segment = (rec.number("start"), rec.number("end"))
                folder = VIDEO_FOLDERS[task]
                video = first_existing(
                    [root / "video" / folder / rec["video"], root / folder / rec["video"]]
                )
                items.append(
                    Item(
                        benchmark=self.name,
                        id=f"{task}/{index}",
                        video=str(video),
                        question=str(rec["question"]),
                        options=candidates,
                        answer=LETTERS[candidates.index(answer)],
                        categories={"task": task},
                        segment=segment,
                        record=rec,
                    )
                )
        return items

    def prompt(self, item: Item, protocol: str = "lmms-eval") -> Prompt:
        self.check_protocol(protocol, None)
        lines = "\n".join(f"({LETTERS[i]}) {c}" for i, c in enumerate(item.options))
        if protocol == "original":
            return Prompt(
                f"Question: {item.question}\nOptions:\n{lines}\nOnly give the best option.",
                max_new_tokens=16,
                system=ORIGINAL_SYSTEM,
                assistant_prefix="Best option:(",
            )
        return Prompt(
            f"Question:{item.question}\nOption:\n{lines}\nOnly give the best option.\n",
            max_new_tokens=16,
        )

    def parse(
        self, reply: str, item: Item, protocol: str = "lmms-eval", fallback: str | None = None
    ) -> str:
        if protocol == "original":
            return mvbench_original_extract(reply, item.letters)
        return mvbench_extract(strip_reasoning(reply))

    def rules(self, protocol: str) -> str:
        if protocol == "original":
            return (
                'system prompt + reply forced to start "Best option:("; first word names the option'
            )
        return 'lmms-eval prompt; "A. text" form, else first standalone a-e word (any case)'

    def write_fixture(self, root: Path, video: VideoWriter, num_items: int) -> None:
        tasks = ["moving_direction", "object_existence"]
        for t, task in enumerate(tasks):
            task_rows: list[dict[str, Any]] = []
            for j in range(num_items):
                i = t * num_items + j
                name = f"{task}_{j:03d}.mp4"
                video(root / "video" / "clevrer" / "video_validation" / name, i)
                if task == "moving_direction":
                    q, cands, gold = direction_question(i)
                    cands = [f"The square moves {c}." for c in cands]
                else:
                    colour = clip_of(i)["colour"]
                    q = f"Is there a {colour} square in the video?"
                    cands = ["yes", "no"] if i % 2 == 0 else ["no", "yes"]
                    gold = cands.index("yes")
                task_rows.append(
                    {"video": name, "question": q, "candidates": cands, "answer": cands[gold]}
                )
            write_json(root / "json" / f"{task}.json", task_rows)
