"""`TokenBudget`: the one budget value every package passes along (validated once)."""

from __future__ import annotations

import math

import pytest

from craft_core import Budget, TokenBudget, resolve_budget


def _slow_floor(n: int, ratio: float) -> int:
    # the definition, spelled out: the largest k >= 1 with k * ratio <= n
    k = 1
    while (k + 1) * ratio <= n:
        k += 1
    return k


@pytest.mark.parametrize("n", [1, 2, 7, 64, 100, 1000, 4097])
@pytest.mark.parametrize("ratio", [1, 1.5, 2, 3, 8, 32.5, 10_000])
def test_ratio_floor_matches_the_definition(n: int, ratio: float) -> None:
    assert TokenBudget(ratio=ratio).resolve(n) == Budget(floor=_slow_floor(n, ratio))


def test_threshold_floor_and_default() -> None:
    assert TokenBudget(threshold=0.9).resolve(1000) == Budget(floor=7, threshold=0.9)
    assert TokenBudget(threshold=0.9).resolve(50) == Budget(floor=1, threshold=0.9)
    assert TokenBudget(threshold=1, min_tokens=5).resolve(3) == Budget(floor=5, threshold=1.0)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({}, ValueError, "exactly one budget"),
        ({"ratio": 2, "threshold": 0.5}, ValueError, "exactly one budget"),
        ({"ratio": 0.5}, ValueError, "ratio must be a finite number >= 1"),
        ({"ratio": math.inf}, ValueError, "ratio must be a finite number >= 1"),
        ({"ratio": math.nan}, ValueError, "ratio must be a finite number >= 1"),
        ({"ratio": True}, TypeError, "ratio must be a number"),
        ({"ratio": "8"}, TypeError, "ratio must be a number"),
        ({"ratio": 8, "min_tokens": 3}, ValueError, "threshold mode only"),
        ({"threshold": -1}, ValueError, r"threshold must lie in \(-1, 1\]"),
        ({"threshold": 1.01}, ValueError, r"threshold must lie in \(-1, 1\]"),
        ({"threshold": math.nan}, ValueError, r"threshold must lie in \(-1, 1\]"),
        ({"threshold": 0.5, "min_tokens": 0}, ValueError, "min_tokens must be >= 1"),
        ({"threshold": 0.5, "min_tokens": 2.0}, TypeError, "min_tokens must be an int"),
    ],
)
def test_bad_budgets_are_refused_when_built(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        TokenBudget(**kwargs)
    with pytest.raises(error, match=match):  # the functional form applies the same rules
        resolve_budget(100, **kwargs)


def test_value_semantics() -> None:
    budget = TokenBudget(ratio=8)
    assert budget == TokenBudget(ratio=8.0) and hash(budget) == hash(TokenBudget(ratio=8.0))
    assert budget.kwargs() == {"ratio": 8.0} and budget.mode == "ratio"
    with pytest.raises(AttributeError):
        budget.ratio = 4.0  # type: ignore[misc]
    adaptive = TokenBudget(threshold=0.85, min_tokens=4)
    assert adaptive.kwargs() == {"threshold": 0.85, "min_tokens": 4}
    assert adaptive.describe() == "threshold=0.85,min_tokens=4"


def test_parse_from_text_names_the_argument() -> None:
    assert TokenBudget.parse("8", "", None) == TokenBudget(ratio=8)
    assert TokenBudget.parse(None, "0.9", "4") == TokenBudget(threshold=0.9, min_tokens=4)
    names = ("--ratio", "--threshold", "--min-tokens")
    with pytest.raises(ValueError, match="--ratio='eight' is not a number"):
        TokenBudget.parse("eight", None, None, names=names)
    with pytest.raises(ValueError, match=r"--threshold must lie in \(-1, 1\]"):
        TokenBudget.parse(None, "-1", None, names=names)
    with pytest.raises(ValueError, match=r"--min-tokens='2\.5' is not a number"):
        TokenBudget.parse(None, "0.5", "2.5", names=names)


def test_parse_names_min_tokens_with_a_ratio() -> None:
    names = ("--ratio", "--threshold", "--min-tokens")
    with pytest.raises(ValueError, match="--min-tokens applies to the threshold mode only"):
        TokenBudget.parse(4.0, None, 3, names=names)
