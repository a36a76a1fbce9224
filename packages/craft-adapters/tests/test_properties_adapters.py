"""Property-based tests of craft-adapters' public API (hypothesis): frame sampling with
hostile numbers, `build_inputs` with odd frames and rates, what a custom compressor may
return to `wrap` (dtypes bool/int/float/bf16, out-of-range or unsorted indices, NaN rows,
empty output), and processor outputs whose grid disagrees with the pixels. Each call either
holds the documented invariants or raises the documented error (TypeError / ValueError);
an oracle from the documentation says which.

    uv run pytest packages/craft-adapters/tests/test_properties_adapters.py -q
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from adapters_testkit import make_frames
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from craft_adapters import build_inputs, sample_indices, wrap

SETTINGS = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
ODD = st.one_of(
    st.integers(-3, 200),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.booleans(),
    st.sampled_from([None, "2"]),
)


def _int_error(value: Any, minimum: int) -> type[Exception] | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return TypeError
    return ValueError if value < minimum else None


def _rate_error(value: Any) -> type[Exception] | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return TypeError
    return None if math.isfinite(value) and value > 0 else ValueError


@SETTINGS
@given(ODD, ODD, ODD, ODD)
def test_sample_indices_in_range_or_documented_error(
    num_frames: Any, native_fps: Any, fps: Any, max_frames: Any
) -> None:
    expected = (
        _int_error(num_frames, 1)
        or _rate_error(fps)
        or _int_error(max_frames, 1)
        or _rate_error(native_fps)
    )
    if expected is not None:
        with pytest.raises(expected):
            sample_indices(num_frames, native_fps, fps, max_frames)
        return
    idx, rate = sample_indices(num_frames, native_fps, fps, max_frames)
    assert idx.dtype == np.int64 and 1 <= idx.size <= max_frames
    assert idx.min() >= 0 and idx.max() < num_frames
    assert bool((np.diff(idx) >= 0).all()) and math.isfinite(rate) and rate > 0
    n = max(1, round(num_frames / native_fps * fps))
    if n <= max_frames:  # no cap: the asked rate, `n` frames
        assert rate == float(fps) and idx.size == n


# -- wrap + a custom compressor that returns anything ---------------------------------------------


@st.composite
def results(draw: st.DrawFn) -> dict[str, Any]:
    """A compressor output for `n` rows: valid, or broken in one documented way."""
    n = draw(st.integers(1, 8))  # the real n is known only at call time: scaled below
    fault = draw(
        st.sampled_from(
            [None] * 5
            + ["kept-float", "kept-bool", "assign-float", "assign-bool", "kept-unsorted"]
            + ["kept-duplicate", "kept-out", "assign-out", "assign-negative", "assign-short"]
            + ["assign-swap", "features-nan", "features-inf", "features-int", "features-width"]
            + ["features-rows", "kept-empty", "kept-2d", "features-bf16"]
        )
    )
    return {"k": n, "fault": fault, "seed": draw(st.integers(0, 2**16))}


_ERRORS: dict[str, type[Exception]] = {
    "kept-float": TypeError,
    "kept-bool": TypeError,
    "assign-float": TypeError,
    "assign-bool": TypeError,
    "features-int": TypeError,
}


class _Scripted:
    """Keeps `k` random rows, assigns every other row to a random kept one, then breaks the
    result as `fault` says."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    def __call__(self, features: torch.Tensor, coords: torch.Tensor, **_: Any) -> Any:
        n, d = features.shape
        gen = torch.Generator().manual_seed(self.spec["seed"])
        k = min(self.spec["k"], n)
        kept = torch.sort(torch.randperm(n, generator=gen)[:k]).values
        assign = torch.randint(0, k, (n,), generator=gen)
        assign[kept] = torch.arange(k)
        out = features[kept] + 0.01 * torch.randn(k, d, generator=gen).to(features.dtype)
        fault = self.spec["fault"]
        if fault == "kept-float":
            kept = kept.float()
        elif fault == "kept-bool":
            kept = torch.zeros(k, dtype=torch.bool)
        elif fault == "assign-float":
            assign = assign.float()
        elif fault == "assign-bool":
            assign = assign > 0
        elif fault == "kept-unsorted" and k > 1:
            kept = kept.flip(0)
        elif fault == "kept-duplicate" and k > 1:
            kept = kept.clone()
            kept[1] = kept[0]
        elif fault == "kept-out":
            kept = kept.clone()
            kept[-1] = n
        elif fault == "assign-out":
            assign = assign.clone()
            assign[0] = k
        elif fault == "assign-negative":
            assign = assign.clone()
            assign[-1] = -1
        elif fault == "assign-short":
            assign = assign[:-1]
        elif fault == "assign-swap" and k > 1:
            assign = assign.clone()
            assign[kept[0]], assign[kept[1]] = 1, 0
        elif fault in ("features-nan", "features-inf"):
            out = out.clone()
            out[-1, 0] = math.nan if fault == "features-nan" else math.inf
        elif fault == "features-int":
            out = out.long()
        elif fault == "features-width":
            out = torch.cat([out, out[:, :1]], 1)
        elif fault == "features-rows":
            out = torch.cat([out, out[:1]])
        elif fault == "kept-empty":
            kept, out = kept[:0], out[:0]
        elif fault == "kept-2d":
            kept = kept[None]
        elif fault == "features-bf16":
            out = out.bfloat16()  # valid: cast to the model's dtype
        return SimpleNamespace(features=out, coords=coords, kept_index=kept, assignment=assign)


def _fault_applies(fault: str | None, k: int) -> bool:
    return fault not in (None, "features-bf16") and not (
        fault in ("kept-unsorted", "kept-duplicate", "assign-swap") and k < 2
    )


@pytest.fixture(scope="module")
def qwen(tiny_models: dict[str, tuple[Any, Any]]) -> tuple[Any, dict[str, Any]]:
    model, processor = tiny_models["qwen2_5_vl"]
    return model, dict(build_inputs(processor, make_frames(4), 2.0, "What?"))


@SETTINGS
@given(results())
def test_wrap_takes_only_a_consistent_compressor_output(
    qwen: tuple[Any, dict[str, Any]], spec: dict[str, Any]
) -> None:
    model, inputs = qwen
    wrapped = wrap(model, _Scripted(spec), ratio=2.0)
    if _fault_applies(spec["fault"], spec["k"]):
        with pytest.raises(_ERRORS.get(spec["fault"], ValueError)):
            wrapped(**inputs)
        return
    with torch.no_grad():
        out = wrapped(**inputs)
    report = wrapped.last_compression
    assert report is not None and report.videos[0].tokens_after == spec["k"]
    assert bool(torch.isfinite(out.logits).all())
    assert (
        out.logits.shape[1]
        == inputs["input_ids"].shape[1] - report.videos[0].tokens_before + spec["k"]
    )


# -- processor outputs whose grid disagrees with the pixels ---------------------------------------


@SETTINGS
@given(
    st.sampled_from(["t", "h", "w"]),
    st.integers(-2, 3),
    st.sampled_from(["long", "int32", "float", "bool"]),
    st.sampled_from([None, "drop-rows", "meta", "int", "3d"]),
)
def test_inconsistent_grids_are_named_not_an_index_error(
    qwen: tuple[Any, dict[str, Any]], axis: str, delta: int, grid_dtype: str, pixels: str | None
) -> None:
    model, inputs = qwen
    grid = inputs["video_grid_thw"].clone()
    grid[0, "thw".index(axis)] += 2 * delta  # h, w stay multiples of the 2 x 2 merge
    values = inputs["pixel_values_videos"]
    if pixels == "drop-rows":
        values = values[: values.shape[0] // 2]
    elif pixels == "meta":
        values = values.to("meta")
    elif pixels == "int":
        values = values.long()
    elif pixels == "3d":
        values = values[None]
    changed = {
        **inputs,
        "video_grid_thw": grid.to(getattr(torch, grid_dtype)),
        "pixel_values_videos": values,
    }
    wrapped = wrap(model, _Scripted({"k": 2, "fault": None, "seed": 0}), ratio=2.0)
    if delta == 0 and grid_dtype in ("long", "int32") and pixels is None:
        with torch.no_grad():
            assert bool(torch.isfinite(wrapped(**changed).logits).all())
        return
    # The documented order: a meta tensor is named first, then the grid's dtype, the pixels'.
    expected = TypeError if grid_dtype in ("float", "bool") or pixels == "int" else ValueError
    if pixels == "meta":
        expected = ValueError
    with pytest.raises(expected) as info:
        wrapped(**changed)
    assert "video_grid_thw" in str(info.value) or "pixel_values_videos" in str(info.value)


# -- build_inputs ----------------------------------------------------------------------------------


@SETTINGS
@given(
    ODD,
    st.sampled_from(["ok", "empty", "float", "gray", "bool", "no-frames", "1-frame"]),
)
def test_build_inputs_checks_rate_and_frames(
    tiny_models: dict[str, tuple[Any, Any]], fps: Any, frames_kind: str
) -> None:
    _, processor = tiny_models["qwen2_5_vl"]
    frames: Any = make_frames(2)
    if frames_kind == "empty":
        frames = frames[:, :0]
    elif frames_kind == "float":
        frames = frames.astype(np.float32)
    elif frames_kind == "gray":
        frames = frames[..., 0]
    elif frames_kind == "bool":
        frames = frames > 100
    elif frames_kind == "no-frames":
        frames = frames[:0]
    elif frames_kind == "1-frame":
        frames = frames[:1]
    bad_frames = frames_kind not in ("ok", "1-frame")
    expected = ValueError if bad_frames else _rate_error(fps)
    if expected is not None:
        with pytest.raises(expected):
            build_inputs(processor, frames, fps, "What?")
        return
    out = build_inputs(processor, frames, fps, "What?")
    grid = out["video_grid_thw"]
    assert int(grid.prod(dim=1).sum()) == out["pixel_values_videos"].shape[0]
