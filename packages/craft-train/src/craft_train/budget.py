"""The compression budget of each optimizer step (paper, Appendix B).

At every optimizer step one budget is drawn and used for every micro-batch of that step on
every rank: with probability `p_threshold` a similarity threshold, otherwise a fixed ratio.
The draw is a pure function of `(seed, step)`, so ranks agree without communicating and a
resumed run draws exactly the sequence an uninterrupted one would. The budget is craft-core's
`TokenBudget`, the one budget value every package passes along: one per value listed in the
config, checked when the config is read (`BudgetConfig.ratio_budgets`), drawn here as it is.
"""

from __future__ import annotations

import random

from craft_core import TokenBudget
from craft_train.config import BudgetConfig

__all__ = ["sample_budget"]


def sample_budget(config: BudgetConfig, seed: int, step: int) -> TokenBudget:
    """The budget of optimizer step `step` (0-based) of a run seeded with `seed`.

    A fresh generator per call, keyed by `(seed, step)` through a string (Python's string
    seeding hashes with SHA-512, identical across processes and machines, unlike `hash()`).
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    rng = random.Random(f"craft-budget/{seed}/{step}")
    if rng.random() < config.p_threshold:
        return rng.choice(config.threshold_budgets)
    return rng.choice(config.ratio_budgets)
