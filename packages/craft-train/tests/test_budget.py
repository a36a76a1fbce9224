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


def test_each_listed_budget_is_checked_once_when_the_config_is_read(monkeypatch, tmp_path) -> None:
    """The config's ratios / thresholds become craft-core TokenBudgets when it is read (one
    check each); the per-step draws hand those objects on (no check per step)."""
    from test_config import _minimal

    from craft_core import TokenBudget
    from craft_train.config import load_config

    count = [0]
    check = TokenBudget.__post_init__

    def counted(budget) -> None:
        count[0] += 1
        check(budget)

    monkeypatch.setattr(TokenBudget, "__post_init__", counted)
    overrides = ["budget.ratios=[2, 8]", "budget.thresholds=[0.9]"]
    cfg = load_config(data=_minimal(tmp_path), overrides=overrides).budget
    assert count == [3]
    draws = [sample_budget(cfg, seed=1, step=s) for s in range(50)]
    assert count == [3]
    assert {d.ratio for d in draws} - {None} == {2.0, 8.0}
    assert {d.threshold for d in draws} - {None} == {0.9}
    assert all(any(d is b for b in cfg.ratio_budgets + cfg.threshold_budgets) for d in draws)


def test_a_refused_budget_names_the_field() -> None:
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"ratios\n.*ratio must be a finite number >= 1"):
        BudgetConfig(ratios=[2, 0.5])
    with pytest.raises(ValidationError, match=r"thresholds\n.*threshold must lie in \(-1, 1\]"):
        BudgetConfig(thresholds=[0.9, 1.5])
