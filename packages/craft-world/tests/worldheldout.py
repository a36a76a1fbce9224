"""The held-out first-token measures of the world learning test (`test_world_learning.py`):
per held-out clip, the first answer token of the uncompressed backbone against the same
backbone with each merge module at each ratio, computed in two forked processes (one core
each)."""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

EVAL_BATCH = 32  # held-out clips a forward

Measure = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""`(full [B, V], short [B, V])` float64 log-probs of the first answer token -> `[B]`."""


def kl(full: torch.Tensor, short: torch.Tensor) -> torch.Tensor:
    """KL(uncompressed || compressed) of the first answer token, nats."""
    return (full.exp() * (full - short)).sum(-1)


def agree(full: torch.Tensor, short: torch.Tensor) -> torch.Tensor:
    """1.0 where the compressed model's first token (argmax) is the uncompressed one's."""
    return (short.argmax(-1) == full.argmax(-1)).double()


def pool() -> ProcessPoolExecutor:
    return ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork"))


def paired(before: list[float], after: list[float]) -> tuple[float, float]:
    """Mean of (before - after) and its standard error over the same clips."""
    d = [b - a for b, a in zip(before, after, strict=True)]
    mean = sum(d) / len(d)
    var = sum((x - mean) ** 2 for x in d) / (len(d) - 1)
    return mean, math.sqrt(var / len(d))


def first_token_measures(
    modules: dict[str, Path],
    heldout: Path,
    ratios: Sequence[float],
    measures: dict[str, Measure],
    part: int = 0,
    parts: int = 1,
) -> dict[tuple[str, str, float], list[float]]:
    """`(measure, module, ratio) -> per-clip values` over the held-out clips `i` with
    `i % parts == part` (`heldout`: a qa.jsonl manifest), each module a run folder holding
    `craft/`. Clips go EVAL_BATCH at a time through the model (prompts of one length share a
    batch: no padding, and the answer's first token sits `tail` positions from the end in
    every row); the uncompressed model runs once per batch. Every list is in one order."""
    from craft_core import CraftCompressor, TokenBudget
    from craft_train.config import load_config
    from craft_train.data import VideoTextDataset, collate
    from craft_train.inputs import make_encoder
    from craft_train.model import build_model
    from craft_train.trainer import load_examples
    from craft_world.recipe import STAGE2, craft_train_config

    first = next(iter(modules.values()))
    cfg = load_config(data=craft_train_config(heldout, heldout.parent / "unused", stage=2,
                                              init_from=first, **STAGE2))  # fmt: skip
    bundle = build_model(cfg)
    states = {
        n: CraftCompressor.from_pretrained(d / "craft").state_dict() for n, d in modules.items()
    }
    data = VideoTextDataset(load_examples(cfg), make_encoder(cfg, bundle.processor))
    by_length: dict[int, list[dict[str, Any]]] = {}
    for i in range(part, len(data), parts):
        item = data[i]
        by_length.setdefault(int(item["input_ids"].shape[-1]), []).append(item)
    out: dict[tuple[str, str, float], list[float]] = {
        (m, n, r): [] for m in measures for n in modules for r in ratios
    }
    with torch.no_grad():
        for _, items in sorted(by_length.items()):
            for start in range(0, len(items), EVAL_BATCH):
                batch = collate(items[start : start + EVAL_BATCH], bundle.pad_token_id)
                batch.pop("skipped_videos")
                labels = batch.pop("labels")
                # the answer's first token is predicted `tail` positions from the end, in the
                # compressed sequence as in the full one (only video tokens are removed)
                tails = {labels.shape[1] - int((row != -100).nonzero()[0]) + 1 for row in labels}
                assert len(tails) == 1, tails
                tail = tails.pop()
                full = bundle.backbone(**batch).logits[:, -tail].double().log_softmax(-1)
                for name, state in states.items():
                    bundle.compressor.load_state_dict(state)
                    for ratio in ratios:
                        bundle.set_budget(TokenBudget(ratio=ratio))
                        short = bundle.model(**batch).logits[:, -tail].double().log_softmax(-1)
                        for measure, value in measures.items():
                            out[measure, name, ratio].extend(value(full, short).tolist())
    return out


def in_two_processes(
    modules: dict[str, Path],
    heldout: Path,
    ratios: Sequence[float],
    measures: dict[str, Measure],
    done: Callable[[int], None] | None = None,
) -> dict[tuple[str, str, float], list[float]]:
    """`first_token_measures` of the even and the odd clips in two forked processes, joined
    back into one list per key (the pairing over clips only needs the same order in every
    list); `done(part)` runs in each process after its half (e.g. to print its CPU time)."""
    with pool() as workers:
        halves = list(workers.map(_half, [(modules, heldout, ratios, measures, p, done)
                                          for p in (0, 1)]))  # fmt: skip
    return {key: halves[0][key] + halves[1][key] for key in halves[0]}


def _half(args: tuple[Any, ...]) -> dict[tuple[str, str, float], list[float]]:
    modules, heldout, ratios, measures, part, done = args
    out = first_token_measures(modules, heldout, ratios, measures, part, 2)
    if done is not None:
        done(part)
    return out
