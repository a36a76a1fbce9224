"""`craft-eval demo --workers N`: the demo's configurations shared out between N processes.

A configuration (one method at one ratio on one family's questions) is one resumable run in
its own folder, so configurations are independent: each worker process loads the same model
(from the folder the parent loaded it from, or craft-world's shipped backbone), wraps it
once per family like the parent (`demo_jobs.Family`, its `Measure`), and runs whole
configurations through `demo_jobs.run_job`, the one code path of a single-process demo. The
parent writes the clips, collects each configuration's row in the job order and prints the
tables; a worker writes only its configurations' run folders.

The tiny world model runs a question mostly on one core (small ops), so on this project's
2-core machine 2 workers near halve the demo's wall time; each worker's torch uses
`cpu_count // N` threads so they do not fight over cores.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

__all__ = ["WorkerSpec", "default_workers", "run_parallel", "threads_per_worker"]


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to rebuild the parent's demo world without writing anything.

    Attributes:
        model_source: the checkpoint folder the parent's model was loaded from; None:
            craft-world's shipped backbone (`craft_world.load_backbone()`).
        device: the parent's torch device ("cpu", "cuda:0").
        tag, trained: as the parent's `demo_jobs.World`.
        families: per family (the headline too), `(name, data root, runs folder, MVBench
            tasks, questions, profiled)`, as the parent's (`demo_jobs.make_family`).
        threads: torch threads per worker.
    """

    model_source: str | None
    device: str
    tag: str
    trained: str | None
    families: tuple[tuple[str, str, str, str, int, bool], ...]
    threads: int


_WORLD: Any = None  # the worker's `demo_jobs.World`, built once by `_start`


def _start(spec: WorkerSpec) -> None:
    """A worker's initializer: its torch threads, the model, one `Measure` per family."""
    global _WORLD
    import torch

    from craft_eval.demo_jobs import World, make_family

    torch.set_num_threads(spec.threads)
    if spec.model_source is None:
        import craft_world

        model, processor = craft_world.load_backbone()
    else:
        from craft_eval.backend import load_pretrained

        model, processor = load_pretrained(spec.model_source, spec.device)
    model = model.to(torch.device(spec.device)).eval()
    fams = [
        make_family(name, n, model, processor, data, runs, tasks=tasks, tag=spec.tag,
                    profile=profiled)
        for name, data, runs, tasks, n, profiled in spec.families
    ]  # fmt: skip
    _WORLD = World(model, spec.tag, spec.trained, fams, processor)


def _job(family: str, method: str, ratio: float | None, profile: bool) -> dict[str, Any]:
    from craft_eval.demo_jobs import run_job

    (fam,) = [f for f in _WORLD.families if f.name == family]
    return run_job(_WORLD, fam, method, ratio, profile=profile)


def run_parallel(
    spec: WorkerSpec,
    jobs: Sequence[tuple[str, str, float | None, bool]],
    workers: int,
    on_done: Any,
) -> list[dict[str, Any]]:
    """Every `(family, method, ratio, profile)` job's row, in the order given, run by
    `workers` spawned processes; `on_done(family)` after each finishes (the progress bar). A
    worker that dies (or cannot start) makes its jobs error rows naming why, like a
    configuration that failed."""
    context = multiprocessing.get_context("spawn")  # no fork of a process torch has threaded
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_start,
                             initargs=(spec,)) as pool:  # fmt: skip
        futures: list[Future[dict[str, Any]]] = []
        for family, method, ratio, profile in jobs:
            future = pool.submit(_job, family, method, ratio, profile)
            future.add_done_callback(functools.partial(_report, on_done, family))
            futures.append(future)
        rows = []
        for (_, method, ratio, _), future in zip(jobs, futures, strict=True):
            try:
                rows.append(future.result())
            except Exception as error:  # a worker that died: this row's error, not the demo's
                rows.append({"method": method, "ratio": ratio,
                             "error": f"{type(error).__name__}: {error}"})  # fmt: skip
    return rows


def _report(on_done: Any, family: str, _: Future[dict[str, Any]]) -> None:
    on_done(family)


def threads_per_worker(workers: int) -> int:
    """Torch threads of each of `workers` processes: the cores shared out, at least 1."""
    return max(1, (os.cpu_count() or 1) // workers)


def default_workers() -> int:
    """`--workers`' default: every core, at most 4 (past that the spawn and the model load
    of each worker outweigh what it saves at the demo's size)."""
    return max(1, min(4, os.cpu_count() or 1))
