"""The per-step budget: the paper's distribution, a pure function of (seed, step)."""

from __future__ import annotations

from collections import Counter

from craft_train.budget import sample_budget
from craft_train.config import BudgetConfig


def test_distribution_matches_the_paper() -> None:
    cfg = BudgetConfig()
    draws = [sample_budget(cfg, seed=0, step=s) for s in range(4000)]
    thresholds = [d.threshold for d in draws if d.threshold is not None]
    ratios = [d.ratio for d in draws if d.ratio is not None]
    assert len(thresholds) + len(ratios) == 4000
    assert all((d.ratio is None) != (d.threshold is None) for d in draws)
    assert abs(len(thresholds) / 4000 - 0.5) < 0.04
    assert set(thresholds) == {0.75, 0.8, 0.85, 0.9, 0.95}
    assert set(ratios) == {2, 4, 8, 16, 32}
    counts = Counter(ratios)
    assert min(counts.values()) > 0.7 * len(ratios) / 5


def test_same_seed_and_step_same_budget_anywhere() -> None:
    cfg = BudgetConfig()
    a = [sample_budget(cfg, 7, s) for s in range(200)]
    # A "resumed" sampler that starts at step 120 draws exactly the tail.
    b = [sample_budget(BudgetConfig(), 7, s) for s in range(120, 200)]
    assert a[120:] == b
    assert a != [sample_budget(cfg, 8, s) for s in range(200)]


def test_kwargs_for_set_budget() -> None:
    cfg = BudgetConfig(p_threshold=1.0, min_tokens=3)
    assert sample_budget(cfg, 0, 0).kwargs() == {
        "threshold": sample_budget(cfg, 0, 0).threshold,
        "min_tokens": 3,
    }
    assert set(sample_budget(BudgetConfig(p_threshold=0.0), 0, 0).kwargs()) == {"ratio"}
