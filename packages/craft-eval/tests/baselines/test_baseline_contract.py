"""Every baseline against the common interface: exact budgets, invariants, determinism,
degenerate inputs, the importance proxy and the registry."""

from __future__ import annotations

import pytest
import torch
from baseline_helpers import ADAPTIVE, METHODS, budget, check_result, grid_coords, video
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from craft_eval.methods import get_method, get_method_info, list_methods

FAST = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("name", METHODS)
@FAST
@given(
    frames=st.integers(1, 5),
    height=st.integers(1, 4),
    width=st.integers(1, 4),
    ratio=st.floats(1.0, 40.0),
    seed=st.integers(0, 2**16),
)
def test_fixed_ratio_budget_is_exact(
    name: str, frames: int, height: int, width: int, ratio: float, seed: int
) -> None:
    features, coords = video(frames, height, width, dim=8, seed=seed)
    result = get_method(name)(features, coords, ratio=ratio)
    check_result(result, features, coords, budget(features.shape[0], ratio))


@pytest.mark.parametrize("name", METHODS)
def test_uneven_frames_and_shuffled_rows(name: str) -> None:
    """Frames of different sizes, rows not in raster order, t values with gaps."""
    features, coords = video(5, 3, 4, dim=12, seed=3)
    coords = coords.clone()
    coords[:, 0] *= 3
    keep = torch.ones(features.shape[0], dtype=torch.bool)
    keep[torch.arange(0, 12, 2)] = False  # frame 0 loses half its patches
    features, coords = features[keep], coords[keep]
    order = torch.randperm(features.shape[0], generator=torch.Generator().manual_seed(0))
    features, coords = features[order], coords[order]
    for ratio in (1.5, 4.0, 7.0):
        result = get_method(name)(features, coords, ratio=ratio)
        check_result(result, features, coords, budget(features.shape[0], ratio))


@pytest.mark.parametrize("name", METHODS)
def test_deterministic(name: str) -> None:
    features, coords = video(6, 4, 4, dim=16, seed=1)
    method = get_method(name)
    first = method(features, coords, ratio=5.0)
    second = method(features.clone(), coords.clone(), ratio=5.0)
    assert torch.equal(first.features, second.features)
    assert torch.equal(first.kept_index, second.kept_index)
    assert torch.equal(first.assignment, second.assignment)


@pytest.mark.parametrize("name", METHODS)
def test_ratio_one_keeps_everything(name: str) -> None:
    features, coords = video(3, 3, 3, dim=8)
    result = get_method(name)(features, coords, ratio=1.0)
    check_result(result, features, coords, features.shape[0])
    assert torch.equal(result.features, features)
    assert torch.equal(result.assignment, torch.arange(features.shape[0]))


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("ratio", [2.0, 9.0, 1000.0])
def test_identical_tokens(name: str, ratio: float) -> None:
    """All tokens alike: any subset is right, but the count and the values must hold."""
    coords = grid_coords(3, 3, 3)
    features = torch.ones(coords.shape[0], 8) * torch.linspace(0.5, 2.0, 8)
    result = get_method(name)(features, coords, ratio=ratio)
    check_result(result, features, coords, budget(features.shape[0], ratio))
    if name != "visionzip":  # VisionZip's contextual token is centre + mean: a sum
        torch.testing.assert_close(result.features, features[: result.num_kept])


@pytest.mark.parametrize("name", METHODS)
def test_one_frame_and_one_token(name: str) -> None:
    features, coords = video(1, 5, 5, dim=8, seed=2)
    check_result(get_method(name)(features, coords, ratio=3.0), features, coords, 8)
    single = get_method(name)(features[:1], coords[:1], ratio=4.0)
    check_result(single, features[:1], coords[:1], 1)
    assert torch.equal(single.features, features[:1])


@pytest.mark.parametrize("name", METHODS)
def test_dtype_is_kept(name: str) -> None:
    features, coords = video(3, 3, 3, dim=8)
    result = get_method(name)(features.to(torch.bfloat16), coords, ratio=3.0)
    check_result(result, features.to(torch.bfloat16), coords, 9)


@pytest.mark.parametrize("name", [m for m in METHODS if m not in ADAPTIVE])
def test_no_threshold_mode(name: str) -> None:
    features, coords = video(2, 2, 2, dim=4)
    with pytest.raises(ValueError, match="no threshold mode"):
        get_method(name)(features, coords, threshold=0.9)


@pytest.mark.parametrize("name", ADAPTIVE)
def test_threshold_mode_floor(name: str) -> None:
    features, coords = video(4, 3, 3, dim=8, noise=0.05)
    loose = get_method(name)(features, coords, threshold=-0.99, min_tokens=5)
    check_result(loose, features, coords, None)
    assert loose.num_kept >= 5
    strict = get_method(name)(features, coords, threshold=1.0)
    check_result(strict, features, coords, None)
    assert strict.num_kept >= loose.num_kept
    everything = get_method(name)(features, coords, threshold=0.5, min_tokens=10**6)
    check_result(everything, features, coords, features.shape[0])  # floor above N: all of N


@pytest.mark.parametrize("name", METHODS)
def test_bad_inputs(name: str) -> None:
    features, coords = video(2, 2, 2, dim=4)
    method = get_method(name)
    with pytest.raises(ValueError):
        method(features, coords)  # no budget
    with pytest.raises(ValueError):
        method(features, coords, ratio=0.5)
    with pytest.raises(ValueError):
        method(features[:0], coords[:0], ratio=2.0)
    with pytest.raises(TypeError):
        method(features, coords.float(), ratio=2.0)


@pytest.mark.parametrize("name", ["visionzip", "fastvid"])
def test_importance_proxy_is_recorded(name: str) -> None:
    features, coords = video(4, 3, 3, dim=8)
    method = get_method(name)
    assert method(features, coords, ratio=3.0).info["importance"] == "l2_norm"
    attention = torch.rand(features.shape[0], generator=torch.Generator().manual_seed(0))
    with_attention = method(features, coords, ratio=3.0, attention=attention)
    assert with_attention.info["importance"] == "attention"
    same = method(features, coords, ratio=3.0, importance=attention)
    assert torch.equal(same.kept_index, with_attention.kept_index)
    with pytest.raises(ValueError, match="importance must be"):
        method(features, coords, ratio=3.0, importance=attention[:-1])


def test_registry_lists_every_baseline() -> None:
    names = {info.name for info in list_methods()}
    assert set(METHODS) <= names
    kinds = {name: get_method_info(name).kind for name in METHODS}
    assert kinds["divprune"] == kinds["vidcom2"] == kinds["dtd"] == "prune"
    assert kinds["tome"] == kinds["llava-scissor"] == kinds["scissor-merge"] == "merge"
    assert "attention" in get_method_info("visionzip").needs
    assert "checkpoint" in get_method_info("scissor-merge").needs


def test_factory_settings_reach_the_method() -> None:
    features, coords = video(3, 4, 4, dim=8)
    zip_half = get_method("visionzip", contextual_fraction=0.5)(features, coords, ratio=4.0)
    assert zip_half.info["settings"]["contextual_fraction"] == 0.5
    vid = get_method("fastvid", d=0.25, p=2)(features, coords, ratio=4.0)
    assert vid.info["settings"]["d"] == 0.25 and vid.info["settings"]["p"] == 2


BAD_SETTINGS = [  # (method, setting, value): each refused by the one shared check
    ("fastvid", "d", 1.5),
    ("fastvid", "d", True),
    ("fastvid", "p", 0),
    ("fastvid", "segments", 0),
    ("fastvid", "knn", 2.0),
    ("flashvid", "alpha", -0.1),
    ("flashvid", "alpha", float("nan")),
    ("flashvid", "min_segments", 0),
    ("flashvid", "knn", True),
    ("holitom", "d", 2),
    ("holitom", "knn", 0),
    ("holitom", "max_window", 0),
    ("visionzip", "contextual_fraction", 1.5),
    ("vidcom2", "channel_fraction", 0.0),
    ("vidcom2", "temperature", 0),
    ("holitom-llm", "max_window", "8"),  # its first stage, named as `holitom`
    ("flashvid-llm", "llm_retention", 0.0),
    ("flashvid-llm", "layer", 0),
    ("flashvid-llm", "layer", True),
    ("holitom-llm", "llm_merged", 1.0),
]


@pytest.mark.parametrize(("name", "setting", "value"), BAD_SETTINGS)
def test_a_bad_setting_is_refused_naming_method_and_setting(
    name: str, setting: str, value: object
) -> None:
    """`craft_eval.baselines._common.check_settings`, shared by every baseline and both
    stages inside the LM: a ValueError that names the method, the setting and the span."""
    features, coords = video(3, 3, 3, dim=8, seed=0)
    named = name.removesuffix("-llm") if setting == "max_window" else name
    with pytest.raises(ValueError, match=rf"^{named}: {setting} must be (a number|an int)"):
        get_method(name, **{setting: value})(features, coords, ratio=2.0)
    get_method(name)(features, coords, ratio=2.0)  # the defaults pass
