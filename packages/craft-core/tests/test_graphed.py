"""The padded round without Inductor (`cuda_graphs=True`): what a CUDA graph capture needs,
checked on a CPU (no CUDA graphs here: the loop runs its padded rounds as they are, through
the run option `allow_cpu=True`). `test_gpu.py` captures it on CUDA.

- the same tokens, owners, rounds and rows as the plain round (`algorithm.compress`), bit for
  bit, on every reference case (`exact`), and as the eager loop in `fast`;
- no host sync inside a round: no read-back or data-dependent-size op (`OpCounter`), one
  Dynamo graph with no break (`fullgraph=True`, eager backend: no Inductor), and, on the
  meta device, every shape follows from the input shapes and no host tensor enters (a
  capture may not copy from host memory);
- static shapes: two videos of other lengths in one bucket run the same ops on the same
  shapes (one graph serves both).

    uv run pytest packages/craft-core/tests/test_graphed.py -q -p no:cacheprovider
"""

from __future__ import annotations

import pytest
import torch
from core_testkit import (
    case_id,
    equals_the_plain_round,
    make_tokens,
    reference_cases,
    run_reference_case,
)
from test_same_tokens import PINNED, digests
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from craft_core import CraftCompressor, CraftConfig
from craft_core.algorithm import room
from craft_core.certify import similarity_bound
from craft_core.compiled import PaddedState, padded_round
from craft_core.merge import round_embedding
from craft_core.opcount import OpCounter
from craft_core.selection import grid_projection

GRAPHED = {"cuda_graphs": True, "allow_cpu": True}  # allow_cpu: run on this CPU (refused else)


def test_the_graphed_loop_gives_the_plain_round_and_the_pins() -> None:
    # All 216 reference cases, without autograd (with it, the eager loop runs).
    wrong = []
    for case in reference_cases():
        case = case._replace(grad=False)
        compressor, x, coords, out = run_reference_case(case, **GRAPHED)
        assert out.info["pairing"] == "graphed"
        if not equals_the_plain_round(out, compressor, x, coords, case.budget) or (
            digests(case, **GRAPHED) != PINNED[case_id(case)]
        ):
            wrong.append(case_id(case))
    assert not wrong, wrong


def test_fast_precision_gives_the_eager_tokens_and_rows_within_float32() -> None:
    config = CraftConfig(hidden_size=24, sim_dim=16)
    torch.manual_seed(0)
    eager = CraftCompressor(config, sim_block=16, precision="fast")
    graphed = CraftCompressor(config, sim_block=16, precision="fast", **GRAPHED)
    graphed.load_state_dict(eager.state_dict())
    for seed, budget in ((1, {"ratio": 4.0}), (2, {"threshold": 0.6})):
        x, coords = make_tokens(seed, 100, 24)
        with torch.no_grad():
            want, got = eager(x, coords, **budget), graphed(x, coords, **budget)
        assert torch.equal(got.kept_index, want.kept_index) and got.rounds == want.rounds
        torch.testing.assert_close(got.features, want.features, rtol=1e-5, atol=1e-6)


def round_args(compressor: CraftCompressor, n: int, seed: int = 1, device: str = "cpu") -> tuple:
    """`padded_round`'s arguments for the first round of a video of `n` tokens, ratio 4."""
    config = compressor.config
    x, coords = make_tokens(seed, n, config.hidden_size)
    weight = grid_projection(compressor.projection)
    state = PaddedState(x, coords, weight, 16)
    n_and_room = (torch.tensor(n), torch.tensor(room(n, n // 4)))
    phi = round_embedding(1, config.round_embed_dim, x.device)
    tables = tuple(t.to(device) for t in state.tables())
    scalars = (*(t.to(device) for t in n_and_room), None, phi.to(device))
    merge = compressor.to(device).merge
    return (
        merge,
        tables,
        state.active.to(device),
        scalars,
        weight.to(device),
        16,
        similarity_bound(16),
    )


def test_a_round_reads_nothing_back() -> None:
    compressor = CraftCompressor(CraftConfig(hidden_size=24, sim_dim=16))
    args = round_args(compressor, 100)
    with torch.no_grad(), OpCounter() as count:
        sizes = padded_round(*args)
    assert count.syncs == 0, count.sync_ops
    assert int(sizes[0]) > 0  # a real round: it merged
    # One Dynamo graph, no break (a read-back or a data-dependent size would break it);
    # the eager backend traces only, nothing is compiled.
    torch._dynamo.reset()
    whole = torch.compile(padded_round, backend="eager", fullgraph=True, dynamic=False)
    with torch.no_grad():
        assert torch.equal(whole(*round_args(compressor, 100)), sizes)


class HostTensors(TorchDispatchMode):
    """Records ops that take a tensor of more than one element that is not on the meta
    device: host data, which a CUDA graph capture could not copy in."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        for leaf in tree_leaves((args, kwargs or {})):
            if isinstance(leaf, torch.Tensor) and leaf.device.type != "meta" and leaf.dim() > 0:
                self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_round_runs_on_the_meta_device_without_host_data() -> None:
    # On the meta device there are no values: every shape must follow from the input shapes
    # (a nonzero, a boolean mask or an item() would raise).
    compressor = CraftCompressor(CraftConfig(hidden_size=24, sim_dim=16))
    args = round_args(compressor, 100, device="meta")
    with torch.no_grad():
        padded_round(*args)  # a first round may fill per-device caches (as a warm-up does)
        with HostTensors() as host:
            sizes = padded_round(*args)
    assert sizes.shape == (4,) and sizes.device.type == "meta"
    assert host.ops == []


class ShapeTrace(TorchDispatchMode):
    """Every op dispatched with the shapes of its tensor outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.trace: list[tuple[str, list[tuple[int, ...]]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        shapes = [tuple(t.shape) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.trace.append((str(func), shapes))
        return out


def test_videos_of_one_bucket_run_the_same_ops_on_the_same_shapes() -> None:
    compressor = CraftCompressor(CraftConfig(hidden_size=24, sim_dim=16))
    traces = []
    for n, seed in ((100, 1), (97, 2), (70, 3)):  # one bucket: 128 slots, tables of 129 rows
        args = round_args(compressor, n, seed)
        with torch.no_grad(), ShapeTrace() as shapes:
            padded_round(*args)
        traces.append(shapes.trace)
    assert len(traces[0]) > 100
    assert traces[1] == traces[0] and traces[2] == traces[0]
    other = round_args(compressor, 200)  # another bucket: other shapes
    with torch.no_grad(), ShapeTrace() as shapes:
        padded_round(*other)
    assert shapes.trace != traces[0]


def test_cuda_graphs_are_refused_on_a_cpu() -> None:
    x, coords = make_tokens(4, 40, 24)
    compressor = CraftCompressor(CraftConfig(hidden_size=24), cuda_graphs=True)
    with torch.no_grad(), pytest.raises(ValueError, match="cuda_graphs=True runs on CUDA only"):
        compressor(x, coords, ratio=4.0)
    with pytest.raises(ValueError, match="choose one"):
        CraftCompressor(CraftConfig(hidden_size=24), cuda_graphs=True, compile=True)
    for pairing in ("auto", "full", "dense", "incremental"):  # removed in 1.1: refused by name
        with pytest.raises(ValueError, match="pairing was removed"):
            CraftCompressor(CraftConfig(hidden_size=24), cuda_graphs=True, pairing=pairing)
