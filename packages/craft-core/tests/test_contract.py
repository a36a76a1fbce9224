"""The compressor contract: `TokenCompressor`, `budget_of`, the budget passed unopened."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from core_testkit import live_weights, make_tokens

from craft_core import (
    Budget,
    CraftCompressor,
    CraftConfig,
    TokenBudget,
    TokenCompressor,
    budget_of,
)
from craft_core import budget as budget_module

DIM = 16


def _compressor() -> CraftCompressor:
    return live_weights(CraftCompressor(CraftConfig(hidden_size=DIM, sim_dim=8)), seed=3).eval()


class _Counter:
    """Counts `TokenBudget` validations (its checking `__post_init__`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        check = TokenBudget.__post_init__

        def counted(budget: TokenBudget) -> None:
            self.count += 1
            check(budget)

        monkeypatch.setattr(TokenBudget, "__post_init__", counted)


def test_craft_is_a_token_compressor() -> None:
    compressor = _compressor()
    assert isinstance(compressor, TokenCompressor)
    assert compressor.needs_attention is False
    # a callable without the flag is not one (craft-adapters then calls it with keywords)
    assert not isinstance(lambda features, coords, **kw: None, TokenCompressor)


@pytest.mark.parametrize(
    "budget,keywords",
    [
        (TokenBudget(ratio=4), {"ratio": 4.0}),
        (TokenBudget(threshold=0.2), {"threshold": 0.2}),
        (TokenBudget(threshold=0.2, min_tokens=9), {"threshold": 0.2, "min_tokens": 9}),
    ],
)
def test_the_budget_object_and_the_users_keywords_give_the_same_tokens(
    budget: TokenBudget, keywords: dict[str, Any]
) -> None:
    features, coords = make_tokens(5, 96, DIM)
    compressor = _compressor()
    with torch.no_grad():
        by_object = compressor(features, coords, budget)
        by_keyword = compressor(features, coords, **keywords)
        by_name = compressor(features, coords, budget=budget)
    for other in (by_keyword, by_name):
        assert torch.equal(other.kept_index, by_object.kept_index)
        assert torch.equal(other.features, by_object.features)
        assert torch.equal(other.assignment, by_object.assignment)


def test_a_passed_budget_is_not_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    features, coords = make_tokens(1, 64, DIM)
    compressor = _compressor()
    budget = TokenBudget(ratio=4)
    counter = _Counter(monkeypatch)
    with torch.no_grad():
        compressor(features, coords, budget)
        compressor.compress_many([features, features[:32]], [coords, coords[:32]], budget)
    assert counter.count == 0
    with torch.no_grad():
        compressor(features, coords, ratio=4.0)  # the user's spelling: checked once, here
        compressor.compress_many([features, features[:32]], [coords, coords[:32]], ratio=4.0)
    assert counter.count == 2
    assert budget_of(budget) is budget


def test_budget_of_refuses_mixed_or_foreign_budgets() -> None:
    with pytest.raises(ValueError, match="not both"):
        budget_of(TokenBudget(ratio=2), ratio=2)
    with pytest.raises(ValueError, match="not both"):
        budget_of(TokenBudget(threshold=0.5), min_tokens=3)
    with pytest.raises(TypeError, match=r"must be a craft_core\.TokenBudget"):
        budget_of({"ratio": 2})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exactly one budget"):
        budget_of()
    features, coords = make_tokens(2, 32, DIM)
    with pytest.raises(ValueError, match="not both"):
        _compressor()(features, coords, TokenBudget(ratio=2), ratio=2)


def test_resolve_without_clamp_refuses_a_ratio_that_leaves_nothing() -> None:
    assert TokenBudget(ratio=8).resolve(5) == Budget(floor=1)
    with pytest.raises(ValueError, match=r"ratio 8 leaves no token .* \(floor\(5 / 8\) = 0\)"):
        TokenBudget(ratio=8).resolve(5, clamp=False)
    assert TokenBudget(ratio=8).resolve(8, clamp=False) == Budget(floor=1)
    assert TokenBudget(ratio=8).resolve(17, clamp=False).floor == budget_module.target_token_count(
        17, 8
    )
    # the threshold mode has its own floor: clamp does not apply
    assert TokenBudget(threshold=0.5).resolve(5, clamp=False) == Budget(floor=1, threshold=0.5)
