"""Property-based tests of craft-core's public API (hypothesis): random shapes, dtypes (bool,
int, float16/32/64, bf16), devices (cpu, meta), NaN/inf, empty and one-token inputs, budgets
of every type. Each call either returns a result that holds the documented invariants
(budget respected, ascending kept_index, assignment in range and consistent, finite features
in the input dtype, original coords) or raises the documented error type; an oracle written
from the documentation says which, so a check that is missing or too eager both fail.

    uv run pytest packages/craft-core/tests/test_properties.py -q
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from craft_core import (
    CraftCompressor,
    CraftConfig,
    TokenBudget,
    default_min_tokens,
    resolve_budget,
    target_token_count,
)

D = 8
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
NOT_FLOATS = [torch.bool, torch.int32, torch.int64]
COMPRESSORS = {
    reduce: CraftCompressor(CraftConfig(hidden_size=D, reduce=reduce)).eval()
    for reduce in ("gate", "mean")
}

# Budget values of every kind, hostile ones included.
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.integers(-3, 40),
    st.booleans(),
    st.sampled_from(["8", None, [2.0]]),
)


def _budget_error(n: int, ratio: Any, threshold: Any, min_tokens: Any) -> type[Exception] | None:
    """What TokenBudget's documentation says about these values (None: accepted)."""

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if (ratio is None) == (threshold is None):
        return ValueError
    if ratio is not None:
        if not number(ratio):
            return TypeError
        if not math.isfinite(ratio) or ratio < 1 or min_tokens is not None:
            return ValueError
        return None
    if not number(threshold):
        return TypeError
    if not (-1 < threshold <= 1):
        return ValueError
    if min_tokens is not None:
        if isinstance(min_tokens, bool) or not isinstance(min_tokens, int):
            return TypeError
        if min_tokens < 1:
            return ValueError
    return None


@st.composite
def calls(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(0, 24))
    width = draw(st.sampled_from([D, D, D, D - 1]))
    dtype = draw(st.sampled_from(FLOATS + NOT_FLOATS))
    coords_dtype = draw(
        st.sampled_from([torch.long, torch.long, torch.int32, torch.float32, torch.bool])
    )
    coords_rows = draw(st.sampled_from([n, n, n, n + 1]))
    device = draw(st.sampled_from(["cpu"] * 5 + ["meta"]))
    poison = draw(st.sampled_from([None] * 4 + [math.nan, math.inf, -math.inf, 1e20]))
    # Integer-valued features with few distinct values: exact ties, as in static video.
    values = draw(st.sampled_from([2, 3, 1000]))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, values, (n, width), generator=gen).double() / values
    if poison is not None and n:
        x[draw(st.integers(0, n - 1)), 0] = poison
    coords = torch.randint(0, 4, (coords_rows, 3), generator=gen)
    if draw(st.booleans()):
        mode = {"ratio": draw(st.one_of(st.floats(0.5, 30.0), st.integers(1, 30), NUMBERS))}
    else:
        mode = {"threshold": draw(st.one_of(st.floats(-1.5, 1.5), NUMBERS))}
        if draw(st.booleans()):
            mode["min_tokens"] = draw(st.one_of(st.integers(-1, 30), NUMBERS))
    return {
        "features": x.to(dtype).to(device),
        "coords": coords.to(coords_dtype).to(device),
        "budget": mode,
        "raw": (n, width, dtype, coords_dtype, coords_rows, device, poison),
        "reduce": draw(st.sampled_from(["gate", "mean"])),
    }


def _expected_error(call: dict[str, Any]) -> type[Exception] | None:
    """The first problem in `check_tokens`' documented order, then the budget's."""
    n, width, dtype, coords_dtype, coords_rows, device, poison = call["raw"]
    checks = [
        (dtype in NOT_FLOATS, TypeError),
        (n == 0 or width != D, ValueError),
        (coords_dtype in (torch.float32, torch.bool), TypeError),
        (coords_rows != n or device == "meta", ValueError),
        (poison is not None, ValueError),  # NaN, inf, or 1e20 (> 1e15; inf in float16)
    ]
    for failed, error in checks:
        if failed:
            return error
    b = call["budget"]
    return _budget_error(n, b.get("ratio"), b.get("threshold"), b.get("min_tokens"))


def _check_result(out: Any, features: torch.Tensor, coords: torch.Tensor, budget: dict) -> None:
    n = features.shape[0]
    k = out.num_kept
    kept, assign = out.kept_index, out.assignment
    assert kept.dtype == torch.long and assign.dtype == torch.long
    assert kept.shape == (k,) and assign.shape == (n,)
    assert 1 <= k <= n
    assert bool((kept[1:] > kept[:-1]).all()), "kept_index must be strictly ascending"
    assert int(kept.min()) >= 0 and int(kept.max()) < n
    assert int(assign.min()) >= 0 and int(assign.max()) < k
    assert torch.equal(assign[kept], torch.arange(k)), "a kept token stays in its own row"
    assert out.features.shape == (k, D) and out.features.dtype == features.dtype
    assert bool(torch.isfinite(out.features.float()).all())
    assert torch.equal(out.coords, coords.long()[kept])
    if "ratio" in budget:
        assert k == max(1, math.floor(n / float(budget["ratio"]))), "ratio mode: exact count"
    else:
        floor = budget.get("min_tokens") or max(1, n // 128)
        assert k >= min(floor, n)


@SETTINGS
@given(calls())
def test_compressor_returns_valid_result_or_documented_error(call: dict[str, Any]) -> None:
    compressor = COMPRESSORS[call["reduce"]]
    expected = _expected_error(call)
    features, coords = call["features"], call["coords"]
    if expected is not None:
        with pytest.raises(expected):
            compressor(features, coords, **call["budget"])
        return
    out = compressor(features, coords, **call["budget"])
    _check_result(out, features, coords, call["budget"])


@st.composite
def edges(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 12))
    ids = draw(st.permutations(range(n)))
    num = draw(st.integers(0, n // 2))
    targets = torch.tensor([ids[draw(st.integers(0, max(0, n - num - 1)))] for _ in range(num)])
    sources = torch.tensor(ids[n - num :], dtype=torch.long)
    targets = targets.long().reshape(-1)
    similarity = torch.rand(num, generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
    hostile = draw(
        st.sampled_from(
            [None] * 6
            + ["float-index", "bool-index", "nan-sim", "inf-sim", "int-sim", "meta-sim"]
            + ["out-of-range", "round-bool", "round-zero", "source-twice", "short-sim"]
        )
    )
    round_index: Any = draw(st.integers(1, 50))
    error: type[Exception] | None = None
    if hostile == "float-index":
        targets, error = targets.float(), TypeError
    elif hostile == "bool-index":
        sources, error = sources.bool(), TypeError
    elif hostile == "int-sim":
        similarity, error = (similarity * 10).long(), TypeError
    elif hostile == "round-bool":
        round_index, error = True, TypeError
    elif hostile == "round-zero":
        round_index, error = 0, ValueError
    elif hostile == "meta-sim":
        similarity, error = similarity.to("meta"), ValueError
    elif hostile == "short-sim":
        similarity, error = torch.rand(num + 1), ValueError
    elif num and hostile in ("nan-sim", "inf-sim"):
        similarity[draw(st.integers(0, num - 1))] = math.nan if hostile == "nan-sim" else math.inf
        error = ValueError
    elif num and hostile == "out-of-range":
        sources = sources.clone()
        sources[0], error = n + draw(st.integers(0, 5)), ValueError
    elif num > 1 and hostile == "source-twice":
        sources = sources.clone()
        sources[1], error = sources[0], ValueError
    gen = torch.Generator().manual_seed(draw(st.integers(0, 99)))
    dtype = draw(st.sampled_from(FLOATS))
    return {
        "args": (
            torch.rand(n, D, generator=gen).to(dtype),
            torch.randint(0, 4, (n, 3), generator=gen),
            targets,
            sources,
            similarity,
            round_index,
        ),
        "error": error,
    }


@SETTINGS
@given(edges())
def test_fuse_groups_fuses_targets_only_or_raises(case: dict[str, Any]) -> None:
    compressor = COMPRESSORS["gate"]
    features, _, targets, *_ = case["args"]
    if case["error"] is not None:
        with pytest.raises(case["error"]):
            compressor.fuse_groups(*case["args"])
        return
    out = compressor.fuse_groups(*case["args"])
    assert out.shape == features.shape and out.dtype == features.dtype
    assert bool(torch.isfinite(out.float()).all())
    untouched = torch.ones(features.shape[0], dtype=torch.bool)
    untouched[targets] = False
    assert torch.equal(out[untouched], features[untouched])


@SETTINGS
@given(st.one_of(st.integers(-3, 10_000), NUMBERS), NUMBERS, NUMBERS, NUMBERS)
def test_budget_helpers_agree_with_their_documentation(
    n: Any, ratio: Any, threshold: Any, min_tokens: Any
) -> None:
    n_ok = isinstance(n, int) and not isinstance(n, bool)
    expected = _budget_error(1, ratio, threshold, min_tokens)
    if not n_ok:
        expected = expected or TypeError
    elif n < 1:
        expected = expected or ValueError
    if expected is not None:
        with pytest.raises((TypeError, ValueError)):
            resolve_budget(n, ratio=ratio, threshold=threshold, min_tokens=min_tokens)
        return
    budget = resolve_budget(n, ratio=ratio, threshold=threshold, min_tokens=min_tokens)
    if ratio is not None:
        assert budget.floor == target_token_count(n, ratio) == max(1, int(n // float(ratio)))
        assert budget.threshold is None and 1 <= budget.floor <= n
    else:
        assert budget.threshold == float(threshold)
        assert budget.floor == (min_tokens if min_tokens is not None else default_min_tokens(n))
    again = TokenBudget(ratio=ratio, threshold=threshold, min_tokens=min_tokens)
    assert TokenBudget(**again.kwargs()) == again


INT_FIELDS = ["hidden_size", "sim_dim", "rank", "gate_hidden", "round_embed_dim"]
FLOAT_FIELDS = ["temperature", "rope_theta", "layer_norm_eps"]
ODD_VALUES = st.one_of(
    st.integers(-2, 600),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["8", "1e-3", "x", None]),
)


@SETTINGS
@given(st.sampled_from(INT_FIELDS + FLOAT_FIELDS + ["seed"]), ODD_VALUES)
def test_config_fields_never_coerce_meaning(field: str, value: Any) -> None:
    """An int field takes only ints (never a bool, float or string); a float field takes
    finite numbers and numeric strings, never a bool. Accepted values round-trip through JSON."""
    fields: dict[str, Any] = {"hidden_size": 8, field: value}
    if field == "rank" and isinstance(value, int) and not isinstance(value, bool) and value > 0:
        fields["rope_sections"] = (value // 2, 0, 0)
    try:
        config = CraftConfig(**fields)
    except ValueError:
        if field in [*INT_FIELDS, "seed"]:
            ok = isinstance(value, int) and not isinstance(value, bool)
            assert not ok or value < (0 if field == "seed" else 1) or _shape_rule(field, value)
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            assert not ok or not math.isfinite(value) or value <= 0 or value == value + 1
        return
    stored = getattr(config, field)
    if field in [*INT_FIELDS, "seed"]:
        assert type(stored) is int and not isinstance(value, (bool, float, str)) and stored == value
    else:
        assert type(stored) is float and not isinstance(value, bool) and math.isfinite(stored)
        assert stored == float(value)
    assert CraftConfig.model_validate_json(config.model_dump_json()) == config


def _shape_rule(field: str, value: int) -> bool:
    """The documented shape rules: even rank / round_embed_dim, sim_dim <= 512."""
    return (field in ("rank", "round_embed_dim") and value % 2 == 1) or (
        field == "sim_dim" and value > 512
    )
