"""Compressors measured against the uncompressed model on MVBench-format questions: each
method at each budget is one resumable run of the runner with `scoring.FirstTokenScorer`.

    bench = Measure(model, processor, data_root, runs_dir, subset="object_existence,moving_count")
    eight = TokenBudget(ratio=8)                              # parsed once, passed as is
    base = bench.run("none")                                  # the uncompressed model
    a = bench.run("uniform", eight)                           # a MethodRun
    b = bench.run("trained", eight, method="craft", checkpoint="path/to/craft")
    a.scores["first_token_kl_mean"], a.scores["first_token_kl_se"]   # nats
    drop, se = paired_records(a.records, b.records, "first_token_kl")

The model is wrapped once per method and budget (`HFBackend`); the uncompressed one once, as
the "none" run and as the scorer's reference. Each clip is decoded and processed once for all
of them (`InputCache`). `craft-eval demo` and craft-eval's
`scripts/world_table.py` measure the miniature world (`craft_world.make_clips`) through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from craft_core import TokenBudget
from craft_eval.backend import HFBackend
from craft_eval.input_cache import InputCache
from craft_eval.runner import RunConfig, run_benchmark, run_records
from craft_eval.scoring import FirstTokenScorer

__all__ = ["Measure", "MethodRun"]


@dataclass
class MethodRun:
    """One finished run: its backend (the wrapped model), summary scores and item records."""

    backend: HFBackend
    scores: dict[str, Any]
    records: list[dict[str, Any]]


class Measure:
    """Runs methods on the questions under `data_root` (MVBench layout) into `runs`.

    Args:
        model, processor: the VLM (unwrapped) and its processor.
        data_root: MVBench-format questions and clips (e.g. `craft_world.make_clips`).
        runs: folder of the runs: `runs/mvbench/<label>[-r<ratio>]` (resumed when there).
        subset: the MVBench tasks to ask.
        max_frames: frames per clip (the world's clips: 8).
        tag: the model's name in each run's config.
    """

    def __init__(
        self,
        model: Any,
        processor: Any,
        data_root: str | Path,
        runs: str | Path,
        *,
        subset: str = "object_existence,moving_count",
        max_frames: int = 8,
        tag: str = "world",
    ) -> None:
        self.model, self.processor = model, processor
        self.data_root, self.runs = Path(data_root), Path(runs)
        self.subset, self.max_frames, self.tag = subset, max_frames, tag
        # every method reads the same clips: decoded and processed once, by the first to ask
        self.inputs = InputCache()
        self.reference = HFBackend(model, processor, max_frames=max_frames, input_cache=self.inputs)
        self.scorer = FirstTokenScorer(self.reference, processor.tokenizer)

    def run(
        self,
        label: str,
        budget: TokenBudget | None = None,
        *,
        method: str | None = None,
        checkpoint: str | None = None,
        merge_maps: int = 0,
        method_kwargs: dict[str, Any] | None = None,
    ) -> MethodRun:
        """Run `method` (default: `label`, a registered name; "none": uncompressed) at
        `budget` with CRAFT's `checkpoint` where given (other options: `method_kwargs`),
        recorded under `label`; the first `merge_maps` questions' merge maps are saved in
        the run folder."""
        config = RunConfig(
            benchmark="mvbench",
            data_root=str(self.data_root),
            model=self.tag,
            method=label,
            checkpoint=checkpoint,
            subset=self.subset,
            max_frames=self.max_frames,
            budget=budget,
        )
        run_dir = self.runs / config.run_name()
        options = {**({"checkpoint": checkpoint} if checkpoint else {}), **(method_kwargs or {})}
        backend = self.reference
        if label != "none":
            backend = HFBackend(
                self.model,
                self.processor,
                method=method or label,
                budget=budget,
                max_frames=self.max_frames,
                method_kwargs=options or None,
                merge_map_dir=run_dir,
                merge_maps=merge_maps,
                input_cache=self.inputs,
            )
        summary = run_benchmark(config, backend, run_dir, progress=False, scorers=[self.scorer])
        assert summary is not None  # one process: rank 0
        return MethodRun(backend, summary["scores"], run_records(run_dir))
