"""The compression budget of each optimizer step (paper, Appendix B).

At every optimizer step one budget is drawn and used for every micro-batch of that step on
every rank: with probability `p_threshold` a similarity threshold, otherwise a fixed ratio.
The draw is a pure function of `(seed, step)`, so ranks agree without communicating and a
resumed run draws exactly the sequence an uninterrupted one would.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from craft_train.config import BudgetConfig

__all__ = ["StepBudget", "sample_budget"]


@dataclass(frozen=True)
class StepBudget:
    """One step's budget: exactly one of `ratio` / `threshold` is set."""

    ratio: float | None = None
    threshold: float | None = None
    min_tokens: int | None = None

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `set_budget(...)` / `CraftCompressor(...)`."""
        if self.ratio is not None:
            return {"ratio": self.ratio}
        out: dict[str, Any] = {"threshold": self.threshold}
        if self.min_tokens is not None:
            out["min_tokens"] = self.min_tokens
        return out

    def describe(self) -> str:
        """`ratio=8` or `threshold=0.85` (for logs)."""
        return (
            f"ratio={self.ratio:g}" if self.ratio is not None else f"threshold={self.threshold:g}"
        )


def sample_budget(config: BudgetConfig, seed: int, step: int) -> StepBudget:
    """The budget of optimizer step `step` (0-based) of a run seeded with `seed`.

    A fresh generator per call, keyed by `(seed, step)` through a string (Python's string
    seeding hashes with SHA-512, identical across processes and machines, unlike `hash()`).
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    rng = random.Random(f"craft-budget/{seed}/{step}")
    if rng.random() < config.p_threshold:
        return StepBudget(threshold=rng.choice(config.thresholds), min_tokens=config.min_tokens)
    return StepBudget(ratio=rng.choice(config.ratios))
