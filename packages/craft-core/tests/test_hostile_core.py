"""Hostile input to craft-core: a clear error naming what is wrong, never a silent NaN."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from craft_core import (
    Budget,
    CraftCompressor,
    CraftConfig,
    GatedMerge,
    TokenBudget,
    default_min_tokens,
    resolve_budget,
    target_token_count,
)


def tokens(n: int = 40, dim: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.rand(n, dim, generator=gen), torch.randint(0, 4, (n, 3), generator=gen)


@pytest.mark.parametrize("value", [1e20, -3e16, float("inf"), float("nan")])
def test_huge_or_non_finite_features_are_refused(value: float) -> None:
    x, coords = tokens()
    x[3, 2] = value
    with pytest.raises(ValueError, match=r"magnitude|NaN or inf"):
        CraftCompressor(CraftConfig(hidden_size=16))(x, coords, ratio=4.0)


def test_large_but_accepted_features_give_finite_output() -> None:
    x, coords = tokens()
    compressor = CraftCompressor(CraftConfig(hidden_size=16))
    out = compressor(x * 1e14, coords, ratio=4.0)
    assert torch.isfinite(out.features).all()


def test_checkpoint_with_nan_weights_is_refused(tmp_path) -> None:
    CraftCompressor(CraftConfig(hidden_size=16)).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["merge.w_q.weight"][0, 0] = float("nan")
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"NaN or inf values in \['merge.w_q.weight'\]"):
        CraftCompressor.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "name,content,match",
    [
        ("model.safetensors", b"not a safetensors file", "model.safetensors is not a readable"),
        ("config.json", b"{broken", "config.json is not a valid CRAFT config"),
        ("config.json", b'{"hidden_size": -3}', "config.json is not a valid CRAFT config"),
    ],
)
def test_corrupt_checkpoint_files_name_the_file(tmp_path, name, content, match) -> None:
    CraftCompressor(CraftConfig(hidden_size=16)).save_pretrained(tmp_path)
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=match):
        CraftCompressor.from_pretrained(tmp_path)


# -- every public entry point, table-driven (issue 25) ---------------------------------------------
# Classes: bool-as-int, float-as-index, string-as-number, NaN/inf, empty and one-token input,
# the meta device, inconsistent shapes, wrong dtypes (bool, int, complex). Each row: a call on
# the public API and the error it must raise (type + words naming the argument).

_X, _C = tokens(12, 8)
_T, _S, _SIM = torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([0.5, 0.25])


def _compressor() -> CraftCompressor:
    return CraftCompressor(CraftConfig(hidden_size=8))


def _fuse(**change: object) -> object:
    args: dict[str, object] = {
        "features": _X,
        "coords": _C,
        "targets": _T,
        "sources": _S,
        "similarity": _SIM,
        "round_index": 1,
    }
    args.update(change)
    return _compressor().fuse_groups(**args)  # type: ignore[arg-type]


def _call(x: torch.Tensor = _X, c: torch.Tensor = _C, **budget: object) -> object:
    return _compressor()(x, c, **(budget or {"ratio": 4.0}))  # type: ignore[arg-type]


ENTRY_CASES: list[tuple[str, object, type[Exception], str]] = [
    # CraftConfig: strict ints, no bool / NaN / inf floats
    ("config-hidden-bool", lambda: CraftConfig(hidden_size=True), ValueError, "hidden_size"),
    ("config-hidden-str", lambda: CraftConfig(hidden_size="8"), ValueError, "hidden_size"),
    ("config-hidden-float", lambda: CraftConfig(hidden_size=8.0), ValueError, "hidden_size"),
    ("config-seed-bool", lambda: CraftConfig(hidden_size=8, seed=False), ValueError, "seed"),
    ("config-rank-float", lambda: CraftConfig(hidden_size=8, rank=128.0), ValueError, "rank"),
    (
        "config-sections-bool",
        lambda: CraftConfig(hidden_size=8, rope_sections=(True, 24, 39)),
        ValueError,
        "rope_sections",
    ),
    (
        "config-temperature-bool",
        lambda: CraftConfig(hidden_size=8, temperature=True),
        ValueError,
        "temperature",
    ),
    (
        "config-temperature-inf",
        lambda: CraftConfig(hidden_size=8, temperature=float("inf")),
        ValueError,
        "temperature",
    ),
    (
        "config-theta-nan",
        lambda: CraftConfig(hidden_size=8, rope_theta=float("nan")),
        ValueError,
        "rope_theta",
    ),
    ("compressor-not-config", lambda: CraftCompressor({"hidden_size": 8}), TypeError, "config"),
    ("merge-not-config", lambda: GatedMerge(8), TypeError, "config"),
    # budget helpers
    ("target-count-bool", lambda: target_token_count(True, 2.0), TypeError, "num_tokens"),
    ("target-count-float", lambda: target_token_count(10.0, 2.0), TypeError, "num_tokens"),
    ("target-count-zero", lambda: target_token_count(0, 2.0), ValueError, "num_tokens"),
    ("target-ratio-nan", lambda: target_token_count(10, float("nan")), ValueError, "ratio"),
    ("target-ratio-below-1", lambda: target_token_count(10, 0.5), ValueError, "ratio"),
    ("target-ratio-bool", lambda: target_token_count(10, True), TypeError, "ratio"),
    ("default-min-bool", lambda: default_min_tokens(True), TypeError, "num_tokens"),
    ("default-min-negative", lambda: default_min_tokens(-3), ValueError, "num_tokens"),
    ("resolve-count-bool", lambda: resolve_budget(True, ratio=2.0), TypeError, "num_tokens"),
    ("resolve-ratio-bool", lambda: resolve_budget(10, ratio=True), TypeError, "ratio"),
    ("resolve-ratio-str", lambda: resolve_budget(10, ratio="8"), TypeError, "ratio"),
    ("resolve-threshold-nan", lambda: resolve_budget(10, threshold=math.nan), ValueError, "thr"),
    (
        "resolve-min-float",
        lambda: resolve_budget(10, threshold=0.5, min_tokens=2.0),
        TypeError,
        "min_tokens",
    ),
    ("token-budget-both", lambda: TokenBudget(ratio=2.0, threshold=0.5), ValueError, "exactly one"),
    ("token-budget-resolve-0", lambda: TokenBudget(ratio=2.0).resolve(0), ValueError, "num_tokens"),
    ("budget-floor-bool", lambda: Budget(floor=True), TypeError, "floor"),
    ("budget-floor-zero", lambda: Budget(floor=0), ValueError, "floor"),
    ("budget-threshold-nan", lambda: Budget(floor=2, threshold=math.nan), ValueError, "thr"),
    ("budget-threshold-2", lambda: Budget(floor=2, threshold=2.0), ValueError, "threshold"),
    # check_tokens / forward: dtypes, shapes, devices, empty input
    ("features-bool", lambda: _call(_X > 0.5), TypeError, "floating"),
    ("features-int", lambda: _call((_X * 10).long()), TypeError, "floating"),
    ("features-complex", lambda: _call(_X.to(torch.complex64)), TypeError, "floating"),
    ("features-1d", lambda: _call(_X[0]), ValueError, r"\[N, D\]"),
    ("features-empty", lambda: _call(_X[:0], _C[:0]), ValueError, "empty"),
    ("features-wrong-width", lambda: _call(_X[:, :4]), ValueError, "hidden_size"),
    ("features-meta", lambda: _call(_X.to("meta"), _C.to("meta")), ValueError, "meta"),
    ("features-list", lambda: _call(_X.tolist()), TypeError, "features"),
    ("coords-float", lambda: _call(c=_C.float()), TypeError, "coords"),
    ("coords-bool", lambda: _call(c=_C > 1), TypeError, "coords"),
    ("coords-wrong-rows", lambda: _call(c=_C[:5]), ValueError, "coords"),
    ("coords-2-columns", lambda: _call(c=_C[:, :2]), ValueError, "coords"),
    ("coords-meta", lambda: _call(c=_C.to("meta")), ValueError, "coords is on meta"),
    ("forward-ratio-bool", lambda: _call(ratio=True), TypeError, "ratio"),
    ("forward-no-budget", lambda: _compressor()(_X, _C), ValueError, "exactly one"),
    ("forward-min-tokens-0", lambda: _call(threshold=0.5, min_tokens=0), ValueError, "min_tokens"),
    (
        "batch-lengths-differ",
        lambda: _compressor().compress_many([_X, _X], [_C], ratio=2.0),
        ValueError,
        "coords holds",
    ),
    # fuse_groups: index dtypes, non-finite similarity, round_index, shapes, devices
    ("fuse-targets-float", lambda: _fuse(targets=_T.float()), TypeError, "targets"),
    ("fuse-sources-bool", lambda: _fuse(sources=torch.tensor([True, False])), TypeError, "sources"),
    ("fuse-targets-2d", lambda: _fuse(targets=_T[None]), ValueError, "targets"),
    ("fuse-targets-list", lambda: _fuse(targets=[0, 1]), TypeError, "targets"),
    (
        "fuse-similarity-nan",
        lambda: _fuse(similarity=torch.tensor([math.nan, 0.1])),
        ValueError,
        "similarity",
    ),
    (
        "fuse-similarity-inf",
        lambda: _fuse(similarity=torch.tensor([0.1, -math.inf])),
        ValueError,
        "similarity",
    ),
    (
        "fuse-similarity-int",
        lambda: _fuse(similarity=torch.tensor([1, 0])),
        TypeError,
        "similarity",
    ),
    ("fuse-similarity-meta", lambda: _fuse(similarity=_SIM.to("meta")), ValueError, "meta"),
    ("fuse-round-bool", lambda: _fuse(round_index=True), TypeError, "round_index"),
    ("fuse-round-float", lambda: _fuse(round_index=1.0), TypeError, "round_index"),
    ("fuse-round-zero", lambda: _fuse(round_index=0), ValueError, "round_index"),
    (
        "fuse-round-zero-no-edges",
        lambda: _fuse(targets=_T[:0], sources=_S[:0], similarity=_SIM[:0], round_index=0),
        ValueError,
        "round_index",
    ),
    (
        "fuse-lengths-differ",
        lambda: _fuse(sources=torch.tensor([2, 3, 4])),
        ValueError,
        "equal length",
    ),
    (
        "fuse-index-out-of-range",
        lambda: _fuse(sources=torch.tensor([2, 12])),
        ValueError,
        "sources must index",
    ),
    (
        "fuse-index-negative",
        lambda: _fuse(targets=torch.tensor([-1, 1])),
        ValueError,
        "targets must index",
    ),
    ("fuse-source-twice", lambda: _fuse(sources=torch.tensor([2, 2])), ValueError, "at most once"),
    ("fuse-source-is-target", lambda: _fuse(sources=torch.tensor([1, 3])), ValueError, "both"),
    # from_pretrained
    (
        "pretrained-hidden-bool",
        lambda: CraftCompressor.from_pretrained("/nonexistent", hidden_size=True),
        TypeError,
        "hidden_size",
    ),
]


@pytest.mark.parametrize(
    ("call", "error", "text"), [c[1:] for c in ENTRY_CASES], ids=[c[0] for c in ENTRY_CASES]
)
def test_public_entry_points_refuse_bad_values(call, error, text) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=text):
        call()


GOOD_CASES: list[tuple[str, object]] = [
    ("one-token", lambda: _call(_X[:1], _C[:1])),
    ("two-tokens-ratio-2", lambda: _call(_X[:2], _C[:2], ratio=2.0)),
    ("bf16-features", lambda: _call(_X.bfloat16())),
    ("float64-features", lambda: _call(_X.double())),
    ("int32-coords", lambda: _call(c=_C.int())),
    ("numpy-int-config", lambda: CraftConfig(hidden_size=np.int64(8))),
    ("yaml-string-eps", lambda: CraftConfig(hidden_size=8, layer_norm_eps="1e-6")),
    ("json-list-sections", lambda: CraftConfig(hidden_size=8, rope_sections=[16, 24, 24])),
    ("fuse-int32-indices", lambda: _fuse(targets=_T.int(), sources=_S.int())),
    ("fuse-no-edges", lambda: _fuse(targets=_T[:0], sources=_S[:0], similarity=_SIM[:0])),
    ("ratio-int", lambda: _call(ratio=3)),
]


@pytest.mark.parametrize("call", [c[1] for c in GOOD_CASES], ids=[c[0] for c in GOOD_CASES])
def test_valid_edge_values_still_work(call) -> None:  # type: ignore[no-untyped-def]
    out = call()
    features = getattr(out, "features", out)
    if isinstance(features, torch.Tensor):
        assert bool(torch.isfinite(features.float()).all())
