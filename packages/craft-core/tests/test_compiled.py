"""The compiled loop (`compile=True`): the eager loop's tokens and rows, bit for bit, with at
most one graph per size bucket and none for a second video of the same length. It is offered
on CUDA only (slower than eager on a CPU); these tests run it on the CPU with the run
option `allow_cpu=True`.

The default run checks a representative subset of the pinned cases (the gate with position
weights at N = 33 and 64, both budget modes: one bucket, two graphs); `nox -s core_paths`
does not run it again (the loop is CUDA-only for users). `nox -s exhaustive`
runs all 216 pinned cases compiled (about 18 graphs: 21 minutes of compile on 2 cores).

    uv run pytest packages/craft-core/tests/test_compiled.py -q -p no:cacheprovider
"""

from __future__ import annotations

import pytest
import torch
from core_testkit import case_id, make_tokens, reference_cases, reference_gate
from test_same_tokens import PINNED, digests

from craft_core import CraftCompressor, CraftConfig
from craft_core.compiled import SPARE, bucket

COMPILED = {"compile": True, "allow_cpu": True}  # allow_cpu: run on this CPU (refused else)


def graphs() -> int:
    """Graphs Dynamo has compiled in this process so far."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def mismatches(cases: list) -> list[str]:
    """Keys of the pinned cases whose compiled run differs from the pin (tokens or rows)."""
    wrong = []
    for case in cases:
        key = case_id(case)
        if digests(case._replace(grad=False), **COMPILED) != PINNED[key]:
            wrong.append(key)
    return wrong


def test_compiled_loop_matches_the_pins() -> None:
    cases = [
        case
        for case in reference_cases()
        # One copy (sim_block 16: 4 blocks in the 64-slot bucket, few graphs to compile).
        if case.config.reduce == "gate" and case.n in (33, 64) and case.options["sim_block"] == 16
    ]
    assert len(cases) == 6  # both sizes, ratio 4 and 1.7, threshold 0.6
    assert not mismatches(cases)


def mean_config() -> CraftConfig:
    return CraftConfig(hidden_size=24, sim_dim=16, reduce="mean")


def eager_and_compiled(
    x: torch.Tensor, coords: torch.Tensor, budget: dict, config: CraftConfig | None = None
) -> tuple:
    config = config or mean_config()
    eager = CraftCompressor(config, sim_block=16)
    compiled = CraftCompressor(config, sim_block=16, **COMPILED)
    compiled.load_state_dict(eager.state_dict())  # the same weights (each init draws its own)
    with torch.no_grad():
        return eager(x, coords, **budget), compiled(x, coords, **budget)


def assert_same(want, got) -> None:  # type: ignore[no-untyped-def]
    assert got.info["pairing"] == "compiled"
    assert torch.equal(got.kept_index, want.kept_index)
    assert torch.equal(got.assignment, want.assignment)
    assert torch.equal(got.features, want.features)
    assert got.rounds == want.rounds


def test_a_second_video_of_the_same_length_compiles_nothing() -> None:
    x, coords = make_tokens(1, 100, 24)
    before = graphs()
    want, got = eager_and_compiled(x, coords, {"ratio": 4.0})
    assert_same(want, got)
    # One graph per bucket the active set passed through (128, then 64): at most log2(N).
    assert 0 < graphs() - before <= len({bucket(100), bucket(got.kept_index.numel())})
    before = graphs()
    x, coords = make_tokens(2, 100, 24)  # other tokens, the same length
    want, got = eager_and_compiled(x, coords, {"ratio": 4.0})
    assert_same(want, got)
    assert graphs() == before
    x, coords = make_tokens(2, 97, 24)  # another length in the same buckets (128, then 64)
    want, got = eager_and_compiled(x, coords, {"ratio": 4.0})
    assert_same(want, got)
    assert graphs() == before


def test_a_round_with_more_rows_in_doubt_than_the_buffer_is_redone_exactly() -> None:
    # 80 exact copies of one token: every copy is in doubt (its listed candidates tie).
    x, coords = make_tokens(3, 100, 24)
    x[10:90] = x[5]
    want, got = eager_and_compiled(x, coords, {"ratio": 4.0})
    assert got.info["fallbacks"] >= 1 and SPARE < 80
    assert_same(want, got)


def test_training_stays_eager_and_gradients_flow() -> None:
    config = CraftConfig(hidden_size=24, sim_dim=16)
    x, coords = make_tokens(4, 40, 24)
    compressor = CraftCompressor(config, sim_block=16, **COMPILED)
    out = compressor(x.requires_grad_(), coords, ratio=4.0)
    assert out.info["pairing"] != "compiled"
    out.features.sum().backward()
    assert x.grad is not None and compressor.merge.w_up.weight.grad is not None


def test_fast_precision_compiled_gives_the_eager_tokens_and_rows_within_float32() -> None:
    # `fast`: the merge in float32, compiled (Inductor fuses it: last bits may differ from
    # eager's), so rows are compared within float32 rounding (atol 1e-5 on rows of size ~1:
    # tens of ulps, after 4 rounds of float32 gates; measured 2.4e-6); the tokens: eager's.
    config = CraftConfig(hidden_size=24, sim_dim=16)  # the gate: float32 arithmetic matters
    torch.manual_seed(0)
    eager = reference_gate(CraftCompressor(config, sim_block=16, precision="fast"), 0)
    compiled = CraftCompressor(config, sim_block=16, precision="fast", **COMPILED)
    compiled.load_state_dict(eager.state_dict())
    exact = CraftCompressor(config, sim_block=16)
    exact.load_state_dict(eager.state_dict())
    x, coords = make_tokens(7, 60, 24)  # one bucket (64 slots): one graph
    with torch.no_grad():
        want, got = eager(x, coords, ratio=4.0), compiled(x, coords, ratio=4.0)
        rows_exact = exact(x, coords, ratio=4.0).features
    assert got.info["pairing"] == "compiled"
    assert torch.equal(got.kept_index, want.kept_index) and got.rounds == want.rounds
    assert torch.equal(got.assignment, want.assignment)
    torch.testing.assert_close(got.features, want.features, rtol=1e-5, atol=1e-5)
    assert not torch.equal(want.features, rows_exact)  # fast really is another arithmetic
    assert not torch.equal(got.features, rows_exact)  # and the compiled loop runs it
    torch.testing.assert_close(got.features, rows_exact, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pairing", ["auto", "full", "dense", "incremental"])
def test_compile_refuses_any_pairing_by_name(pairing: str) -> None:
    # 1.1 removed the pairing option: every value is refused by name, with compile too.
    with pytest.raises(ValueError, match="pairing was removed"):
        CraftCompressor(CraftConfig(hidden_size=24), compile=True, pairing=pairing)


def test_compile_is_a_strict_bool() -> None:
    with pytest.raises(ValueError, match="compile"):
        CraftCompressor(CraftConfig(hidden_size=24), compile="yes")


def test_compile_is_not_offered_on_a_cpu() -> None:
    x, coords = make_tokens(4, 40, 24)
    compressor = CraftCompressor(CraftConfig(hidden_size=24), compile=True)
    with torch.no_grad(), pytest.raises(ValueError, match=r"CUDA only.*allow_cpu=True"):
        compressor(x, coords, ratio=4.0)
    compressor.configure(compile=False)
    with torch.no_grad():
        assert compressor(x, coords, ratio=4.0).info["pairing"] != "compiled"


def test_allow_cpu_is_a_strict_bool_that_needs_a_padded_loop() -> None:
    config = CraftConfig(hidden_size=24)
    with pytest.raises(ValueError, match="allow_cpu"):
        CraftCompressor(config, compile=True, allow_cpu="yes")
    for options in ({}, {"precision": "fast"}):  # nothing for it to allow
        with pytest.raises(ValueError, match="allow_cpu=True lets compile=True"):
            CraftCompressor(config, allow_cpu=True, **options)
    compressor = CraftCompressor(config, cuda_graphs=True, allow_cpu=True)
    with pytest.raises(ValueError, match="changes nothing"):
        compressor.configure(cuda_graphs=False)
    assert compressor.options.cuda_graphs  # a refused configure changes nothing
    compressor.configure(cuda_graphs=False, allow_cpu=False)
    assert not compressor.options.padded()


def test_the_compiled_loop_leaves_dynamo_settings_as_it_found_them() -> None:
    # 0.6 raised Dynamo's process-wide recompile limit on the first compiled call.
    limit = torch._dynamo.config.recompile_limit
    x, coords = make_tokens(1, 100, 24)
    want, got = eager_and_compiled(x, coords, {"ratio": 4.0})
    assert_same(want, got)
    assert torch._dynamo.config.recompile_limit == limit


@pytest.mark.exhaustive  # 21 min of Inductor compile at load 6 here: not in `uv run nox`
def test_every_pinned_case_compiled() -> None:
    assert not mismatches(reference_cases())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_loop_on_cuda_replays_graphs_and_gives_the_cpu_tokens() -> None:
    # Each compiled round is recorded as a CUDA graph (`GraphedRounds`) and replayed: a
    # video met before replays every round. Tokens equal the CPU's on every call (the second
    # video replays the first one's graphs on its own data where their buckets meet).
    config = mean_config()
    torch.manual_seed(0)
    cpu = reference_gate(CraftCompressor(config, sim_block=16), 0)
    eager = CraftCompressor(config, sim_block=16).cuda()
    gpu = CraftCompressor(config, sim_block=16, **COMPILED).cuda()
    for module in (eager, gpu):
        module.load_state_dict(cpu.state_dict())
    with torch.no_grad():
        for seed, replayed_all in ((5, False), (6, None), (5, True)):
            x, coords = make_tokens(seed, 1000, 24)
            want = cpu(x, coords, ratio=8.0)
            same_device = eager(x.cuda(), coords.cuda(), ratio=8.0)
            got = gpu(x.cuda(), coords.cuda(), ratio=8.0)
            assert got.info["fallbacks"] == 0
            if replayed_all is not None:
                assert (got.info["graph_replays"] == got.rounds) == replayed_all
            assert torch.equal(got.kept_index.cpu(), want.kept_index)
            assert torch.equal(got.assignment.cpu(), want.assignment)
            # Rows: not bit for bit. Measured on an H100 (torch 2.11): 277 of 3,000 values
            # off by at most 3.6e-7 (Triton's float64 differs from ATen's by up to 1e-13).
            torch.testing.assert_close(got.features, same_device.features, rtol=1e-5, atol=1e-6)


def test_reused_tables_hold_nothing_of_the_last_video() -> None:
    # On CUDA, `GraphedRounds` hands every video of a bucket the same tables (a graph replays
    # fixed addresses). A state built on tables full of another video's values must equal
    # one built on fresh tables, padding included.
    from craft_core.compiled import PaddedState, empty_tables
    from craft_core.selection import grid_projection

    config = mean_config()
    weight = grid_projection(CraftCompressor(config).projection)
    x, coords = make_tokens(5, 100, 24)
    fresh = PaddedState(x, coords, weight, 16)
    used = tuple(t.fill_(7) for t in empty_tables(bucket(100) + 1, 24, weight.shape[1], "cpu"))
    reused = PaddedState(x, coords, weight, 16, used)
    for mine, theirs in zip(reused.tables(), fresh.tables()):
        assert mine.data_ptr() in {t.data_ptr() for t in used}
        assert torch.equal(mine, theirs)
    assert torch.equal(reused.active, fresh.active)
