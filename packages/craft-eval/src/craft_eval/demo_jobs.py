"""One configuration of `craft-eval demo`: what it runs on (`World`, `Family`) and the run
itself (`run_job`), shared by the demo in one process (`craft_eval.demo`) and its worker
processes (`craft_eval.demo_pool`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from craft_eval.demo_report import TRAINED

__all__ = ["DEMO_FRAMES", "Family", "World", "make_family", "run_job"]

DEMO_FRAMES = 8  # the world's clips: 8 frames at 2 fps


@dataclass
class Family:
    """One family's questions and runs."""

    name: str
    n_items: int  # questions
    measure: Any  # craft_eval.measure.Measure: its runs, the uncompressed model wrapped once
    first: Any  # the first question (its efficiency profile); None: the headline's (none)


@dataclass
class World:
    """What every configuration of one demo run shares."""

    model: Any
    tag: str
    trained: str | None  # the shipped trained module, or None
    families: list[Family]
    processor: Any = None
    source: str | None = None  # the model's folder (None: craft-world's shipped backbone)


def make_family(
    name: str, n_items: int, model: Any, processor: Any, data: Any, runs: Any, *,
    tasks: str, tag: str, profile: bool = True,
) -> Family:  # fmt: skip
    """A family over the MVBench-format questions under `data` (`tasks`): its `Measure`
    (runs under `runs`, the uncompressed model wrapped once as the KL reference) and, with
    `profile`, its first question (the efficiency profile's)."""
    from craft_eval.measure import Measure
    from craft_eval.tasks import get_benchmark

    measure = Measure(model, processor, data, runs, subset=tasks, max_frames=DEMO_FRAMES, tag=tag)
    first = get_benchmark("mvbench").load(data, subset=tasks)[0] if profile else None
    return Family(name, n_items, measure, first)


def run_job(
    world: World, fam: Family, method: str, ratio: float | None, *, profile: bool = True
) -> dict[str, Any]:
    """One configuration on one family: the benchmark run with the first-token scorer
    (resumable records; the trained module is CRAFT from the shipped checkpoint), then with
    `profile` the efficiency profile of the family's first question and one merge map. A
    failure is this row's error, never the demo's: the other methods' results still print."""
    from craft_core import TokenBudget
    from craft_eval.in_model import scaled_stage_options
    from craft_eval.tasks import get_benchmark

    trained = method == TRAINED
    budget = None if ratio is None else TokenBudget(ratio=ratio)  # the demo's --ratio, once
    try:
        done = fam.measure.run(
            method, budget, method="craft" if trained else method,
            checkpoint=world.trained if trained else None, merge_maps=int(profile),
            method_kwargs=None if trained else scaled_stage_options(method, world.model),
        )  # fmt: skip
        prof: dict[str, Any] = {}
        if profile:
            prompt = get_benchmark("mvbench").prompt(fam.first)
            prof = done.backend.profile(fam.first, prompt, repeats=3)
    except Exception as error:  # one method failing must not hide the others' results
        return {"method": method, "ratio": ratio, "error": f"{type(error).__name__}: {error}"}
    return {"method": method, "ratio": ratio, "scores": done.scores, "records": done.records,
            **prof}  # fmt: skip
