"""Selection is a pure function of (features, coords, config, budget).

The same kept tokens, assignment and rounds for every `sim_block`, alone or in a batch,
low-precision input and its float32 upcast, and CPU instruction paths (a subprocess under
`ATEN_CPU_CAPABILITY=default` / `MKL_CBWR=AVX2` must agree with this process). Inputs are
video-like with static frames and duplicated tokens, where equal similarities are common.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import torch
from core_testkit import grid_coords, live_weights, noise

from craft_core import CraftCompressor, CraftConfig
from craft_core.opcount import OpCounter


def static_video(seed: int, frames: int = 12, grid: int = 6, dim: int = 32):
    """`[frames * grid^2, dim]` tokens: drifting scenes, a third of frames static copies."""
    gen = torch.Generator().manual_seed(seed)
    per_frame = grid * grid
    rows = [noise(per_frame, dim, generator=gen)]
    for _ in range(1, frames):
        r = float(torch.rand(1, generator=gen))
        if r < 0.35:
            rows.append(rows[-1].clone())  # static frame: exact duplicates
        elif r < 0.45:
            rows.append(noise(per_frame, dim, generator=gen))  # scene cut
        else:
            rows.append(rows[-1] + 0.2 * noise(per_frame, dim, generator=gen))
    x = torch.cat(rows)
    x[5] = x[17]  # duplicates inside one frame
    return x, grid_coords(frames, grid, grid)


def trained_looking(config: CraftConfig, seed: int = 0, **options: Any) -> CraftCompressor:
    torch.manual_seed(seed)
    return live_weights(CraftCompressor(config, **options), seed)


def signature(out) -> tuple:
    return out.kept_index.tolist(), out.assignment.tolist(), out.rounds


BUDGETS = [{"ratio": 8.0}, {"ratio": 2.5}, {"threshold": 0.7}]


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("seed", range(3))
def test_selection_is_the_same_for_every_sim_block(seed: int, budget: dict) -> None:
    x, coords = static_video(seed)
    results = {}
    for block in (1, 3, 16, 2048):
        config = CraftConfig(hidden_size=32)
        with torch.no_grad():
            out = trained_looking(config, sim_block=block)(x, coords, **budget)
        results[block] = (signature(out), out.features)
    first_sig, first_rows = results[2048]
    assert first_sig[2] >= 2, "the case must take several rounds"
    for key, (sig, rows) in results.items():
        assert sig == first_sig, key
        assert torch.equal(rows, first_rows), key  # fusion is the same arithmetic too


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_input_selects_like_its_float32_upcast(dtype: torch.dtype) -> None:
    config = CraftConfig(hidden_size=32)
    compressor = trained_looking(config)
    mismatched = []
    for seed in range(30):
        x, coords = static_video(seed, frames=8, grid=5)
        low = x.to(dtype)
        budget = BUDGETS[seed % len(BUDGETS)]
        with torch.no_grad():
            out_low = compressor(low, coords, **budget)
            out_up = compressor(low.float(), coords, **budget)
        assert out_low.features.dtype == dtype
        if signature(out_low) != signature(out_up) or not torch.equal(
            out_low.features, out_up.features.to(dtype)
        ):
            mismatched.append(seed)
    assert mismatched == []


def test_module_cast_to_bf16_keeps_the_projection_in_float32() -> None:
    compressor = trained_looking(CraftConfig(hidden_size=32), sim_block=64).to(torch.bfloat16)
    assert compressor.projection.dtype == torch.float32
    x, coords = static_video(3)
    with torch.no_grad():
        out = compressor(x.bfloat16(), coords, ratio=4.0)
    assert out.num_kept == x.shape[0] // 4 and out.features.dtype == torch.bfloat16


def path_signatures() -> list:
    """Signatures of 3 videos x 2 budgets (N = 1,024, D = 64, `sim_block` 100): what a
    process on another instruction path must reproduce."""
    out = []
    for seed in range(3):
        x, coords = static_video(seed, frames=16, grid=8, dim=64)
        compressor = trained_looking(CraftConfig(hidden_size=64), sim_block=100)
        with torch.no_grad():
            for budget in ({"ratio": 6.0}, {"threshold": 0.8}):
                out.append(signature(compressor(x, coords, **budget)))
    return json.loads(json.dumps(out))  # the subprocess's JSON round trip, for equal types


SCRIPT = (
    "import json, sys; sys.path.insert(0, {tests!r}); "
    "from test_determinism import path_signatures; print(json.dumps(path_signatures()))"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "env",
    [{"ATEN_CPU_CAPABILITY": "default"}, {"MKL_CBWR": "AVX2"}],
    ids=["aten-default", "mkl-avx2"],
)
def test_instruction_paths_agree(env: dict) -> None:
    other = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(tests=os.path.dirname(__file__))],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    )
    assert json.loads(other.stdout) == path_signatures()


def test_compress_many_equals_independent_calls() -> None:
    compressor = trained_looking(CraftConfig(hidden_size=32), sim_block=50)
    videos = [static_video(seed, frames=4 + 2 * seed, grid=5) for seed in range(4)]
    with torch.no_grad():
        batch = compressor.compress_many([v[0] for v in videos], [v[1] for v in videos], ratio=3.0)
        for (x, coords), out in zip(videos, batch):
            alone = compressor(x, coords, ratio=3.0)
            assert signature(out) == signature(alone)
            assert torch.equal(out.features, alone.features)


def drifting_video(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """N = 4,096 (16 frames of 16 x 16): a scene drifting, no exact copies."""
    gen = torch.Generator().manual_seed(seed)
    x = noise(256, 64, generator=gen).repeat(16, 1) + 0.3 * noise(4096, 64, generator=gen)
    return x, grid_coords(16, 16, 16)


@pytest.mark.parametrize("budget", [{"ratio": 8.0}, {"threshold": 0.9}])
def test_the_eager_round_reads_the_host_once_alone_or_in_a_batch(budget: dict) -> None:
    # The GPU path counted on the CPU, for one video and for a batch of 8 (which leave the
    # batch at different rounds): per round ONE transfer of the round's sizes, whatever the
    # batch size. Per call: the active counts (one transfer) and, in threshold mode, the last
    # round that finds no edge; per video: its input check (max |x|, `_local_scalar_dense`).
    compressor = CraftCompressor(CraftConfig(hidden_size=64))
    videos = [drifting_video(seed) for seed in range(8)]
    x, coords = videos[0]
    with torch.no_grad():
        compressor(x, coords, **budget)  # phi(m) is computed once per round index per process
        with OpCounter() as alone:
            out = compressor(x, coords, **budget)
        with OpCounter() as batched:
            outs = compressor.compress_many(
                [v[0] for v in videos], [v[1] for v in videos], **budget
            )
    assert out.rounds >= 5 and out.info == {**out.info, "pairing": "batched", "batch": 1}
    assert all(o.info["batch"] == 8 for o in outs)
    assert len({o.rounds for o in outs}) > 1  # videos leave the batch at different rounds
    rounds = max(o.rounds for o in outs)
    per_call = 2 if "threshold" in budget else 1
    for count, calls_rounds, videos_in in ((alone, out.rounds, 1), (batched, rounds, 8)):
        assert set(count.sync_ops) <= {"tolist", "_local_scalar_dense"}, dict(count.sync_ops)
        # At most one a round, plus the per-call and per-video ones. (Run alone, the counts
        # are exact: `tolist` rounds + per_call, `_local_scalar_dense` one a video; after the
        # other tests of this file the input checks were not seen at all: not understood.)
        assert calls_rounds <= count.syncs <= calls_rounds + per_call + videos_in, dict(
            count.sync_ops
        )
    # Ops: a regression guard, not a target. Measured 280 (ratio) and 287 (threshold) ops
    # per round for one video, warm; a batch of 8 costs about 1.1x the ops of one a round
    # (the rounds are batched, not looped over videos).
    assert alone.ops <= 320 * out.rounds, alone.ops / out.rounds
    assert batched.ops / rounds <= 1.25 * alone.ops / out.rounds, (batched.ops, alone.ops)


def test_a_full_recheck_buffer_falls_back_exactly() -> None:
    # The padded loop (`compiled.py`, run on the CPU as test_compiled / test_graphed do) on a
    # static clip: almost every row is in doubt, far more than its recheck buffer holds, so
    # rounds are redone by `compiled.fallback_round`; the tokens and rows stay the eager
    # loop's.
    x, coords = static_video(2, frames=12, grid=6, dim=32)
    x = x[:36].repeat(12, 1)  # every token has 11 exact copies: 432 rows in doubt
    results = {}
    for name, options in (("eager", {}), ("padded", {"cuda_graphs": True, "allow_cpu": True})):
        torch.manual_seed(0)
        compressor = CraftCompressor(CraftConfig(hidden_size=32), sim_block=16, **options)
        with torch.no_grad():
            results[name] = compressor(x, coords, ratio=6.0)
    assert results["padded"].info["pairing"] == "graphed"
    assert results["padded"].info["fallbacks"] > 0
    assert signature(results["padded"]) == signature(results["eager"])
    assert torch.equal(results["padded"].features, results["eager"].features)


def test_op_counter_sees_syncs_and_views() -> None:
    with OpCounter() as count:
        t = torch.arange(10)
        torch.nonzero(t > 4)
        t[t > 2]
        int(t.sum())
        t.tolist()
        t.view(2, 5)
    assert count.sync_ops == {
        "nonzero": 1,
        "index(bool mask)": 1,
        "_local_scalar_dense": 1,
        "tolist": 1,
    }
    assert count.all_ops > count.ops
