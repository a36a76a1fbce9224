"""Run options (`runtime.RunOptions`): chosen when building, loading or reconfiguring, never
saved; checkpoints of 0.2-0.6 that hold them still load, with a warning; the `fast`
precision runs the merge in float32 (rows within float32 rounding of `exact`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from core_testkit import live_weights, make_tokens
from torch.utils._python_dispatch import TorchDispatchMode

from craft_core import CraftCompressor, CraftConfig
from craft_core.runtime import LegacyConfigWarning, RunOptions


def live(precision: str = "exact", **options) -> CraftCompressor:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    config = CraftConfig(hidden_size=32, rank=8, rope_sections=(2, 1, 1), gate_hidden=16)
    return live_weights(CraftCompressor(config, precision=precision, **options), 3)


@pytest.mark.parametrize("field", ["compile", "sim_block"])
def test_config_refuses_a_run_option_and_says_where_it_went(field: str) -> None:
    value = {"compile": True, "sim_block": 64}[field]
    with pytest.raises(ValueError, match=f"{field} is not a CraftConfig field.*run option"):
        CraftConfig(hidden_size=8, **{field: value})


def test_the_removed_selection_option_is_refused_by_name() -> None:
    # 1.0 removed selection='exact' / 'recheck' (never faster where they run: CHANGELOG).
    with pytest.raises(ValueError, match=r"selection is not a CraftConfig field.*removed"):
        CraftConfig(hidden_size=8, selection="exact")
    with pytest.raises(ValueError, match="selection was removed"):
        RunOptions(selection="certified")
    with pytest.raises(ValueError, match="selection was removed"):
        CraftCompressor(CraftConfig(hidden_size=8), selection="exact")


@pytest.mark.parametrize("value", ["incremental", "full", "dense", "auto", "batched"])
def test_the_removed_pairing_option_is_refused_by_name(value: str) -> None:
    # 1.1 removed pairing='incremental' / 'full' / 'dense': one batched eager runner.
    with pytest.raises(ValueError, match="pairing was removed"):
        RunOptions(pairing=value)
    with pytest.raises(ValueError, match="pairing was removed"):
        CraftCompressor(CraftConfig(hidden_size=8), pairing=value)
    with pytest.raises(ValueError, match="pairing was removed"):
        CraftCompressor(CraftConfig(hidden_size=8), compile=True, pairing=value)
    with pytest.raises(ValueError, match="pairing was removed"):
        CraftCompressor.from_pretrained("absent-folder", pairing=value)  # before any file
    with pytest.raises(ValueError, match="pairing is not a CraftConfig field"):
        CraftConfig(hidden_size=8, pairing=value)
    module = CraftCompressor(CraftConfig(hidden_size=8), precision="fast")
    with pytest.raises(ValueError, match="pairing was removed"):
        module.configure(pairing=value)
    assert module.options == RunOptions(precision="fast")  # a refused configure changes nothing


def test_run_options_are_checked_by_name() -> None:
    with pytest.raises(ValueError, match="precision"):
        RunOptions(precision="double")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sim_block"):
        RunOptions(sim_block=True)
    with pytest.raises(ValueError, match="warp_speed"):
        CraftCompressor(CraftConfig(hidden_size=8), warp_speed=2)
    with pytest.raises(ValueError, match="threads"):
        RunOptions(threads=0)
    with pytest.raises(ValueError, match=r"compile=True.*cuda_graphs=True"):
        RunOptions(compile=True, cuda_graphs=True)


def test_old_checkpoint_with_run_options_loads_with_a_warning(tmp_path: Path) -> None:
    module = live()
    module.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert not {"compile", "pairing", "selection", "sim_block"} & set(saved)  # never saved
    # A 0.6 checkpoint: the same file with the run options of the time in it.
    old = {**saved, "compile": True, "pairing": "full", "selection": "certified", "sim_block": 7}
    (tmp_path / "config.json").write_text(json.dumps(old))
    with pytest.warns(LegacyConfigWarning, match="compile=True.*ignored.*from_pretrained") as seen:
        loaded = CraftCompressor.from_pretrained(tmp_path, precision="fast")
    # pairing, a run option of 0.6 removed in 1.1, is dropped like the others, not refused.
    assert "pairing='full'" in str(seen[0].message)
    assert loaded.config == module.config
    assert loaded.options == RunOptions(precision="fast")  # the checkpoint's choices ignored
    for name, tensor in module.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor)


def test_a_bad_run_option_fails_before_any_file_is_read(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="precision"):
        CraftCompressor.from_pretrained(tmp_path / "absent", precision="half")


def test_configure_changes_how_it_runs_not_what_it_computes() -> None:
    x, coords = make_tokens(5, 64, 32)
    module = live(sim_block=2048)
    with torch.no_grad():
        wide = module(x, coords, ratio=4.0)
        assert module.configure(sim_block=7) is module
        assert module.options.sim_block == 7 and module.options.precision == "exact"
        narrow = module(x, coords, ratio=4.0)
    assert wide.info["pairing"] == narrow.info["pairing"] == "batched"
    assert wide.info["batch"] == narrow.info["batch"] == 1
    assert torch.equal(wide.kept_index, narrow.kept_index)
    assert torch.equal(wide.assignment, narrow.assignment)
    assert torch.equal(wide.features, narrow.features)


def test_fast_precision_is_float32_within_its_rounding_of_exact() -> None:
    x, coords = make_tokens(6, 96, 32)
    with torch.no_grad():
        exact = live("exact")(x, coords, ratio=3.0)
        fast = live("fast")(x, coords, ratio=3.0)
    # The same selection on this input; rows within float32 rounding, not the same bits
    # (the option really changes the arithmetic: a float64 merge would give equal bits).
    assert torch.equal(fast.kept_index, exact.kept_index)
    assert torch.equal(fast.assignment, exact.assignment)
    torch.testing.assert_close(fast.features, exact.features, rtol=1e-5, atol=1e-5)
    assert not torch.equal(fast.features, exact.features)


def test_fast_precision_keeps_gradients() -> None:
    x, coords = make_tokens(7, 40, 32)
    module = live("fast")
    out = module(x.requires_grad_(), coords, ratio=4.0)
    out.features.sum().backward()
    assert x.grad is not None and module.merge.w_up.weight.grad is not None
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("threads", [1, None])
def test_threads_hold_for_the_call_only(threads: int | None, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    module = live(threads=threads)
    seen = []
    fuse_all = module.merge.fuse_all  # the merge of every round (batched.py's `_fuse`)

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(torch.get_num_threads())
        return fuse_all(*args, **kwargs)

    monkeypatch.setattr(module.merge, "fuse_all", spy)
    x, coords = make_tokens(8, 40, 32)
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.no_grad():
            module(x, coords, ratio=4.0)
        assert seen and set(seen) == {2 if threads is None else threads}
        assert torch.get_num_threads() == 2  # the caller's setting, restored
    finally:
        torch.set_num_threads(saved)


class _Casts(TorchDispatchMode):
    """Counts casts (`_to_copy`) of tensors of one shape."""

    def __init__(self, shape: torch.Size) -> None:
        super().__init__()
        self.shape, self.count = shape, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.ops.aten._to_copy.default and args[0].shape == self.shape:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("grad", [False, True])
def test_the_exact_merge_casts_its_weights_once_a_call_without_autograd(grad: bool) -> None:
    # W_down in float64 is a [d_h, 2D] copy: once a call, not once a round (with autograd
    # every round casts it, so that each round's gradient is rounded as before).
    compressor = live()
    x, coords = make_tokens(2, 64, 32)
    with torch.set_grad_enabled(grad), _Casts(compressor.merge.w_down.weight.shape) as casts:
        out = compressor(x, coords, ratio=4.0)
    assert out.rounds > 2
    assert casts.count == (out.rounds if grad else 1)
