"""On CUDA: the same tokens as on the CPU, and the time and memory of real sizes.

Run with `nox -s gpu_tests` on a machine with a GPU; every test skips without CUDA. The
timings are printed (pytest -s) for the README, not asserted: tests check behaviour.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from core_testkit import grid_coords

from craft_core import CraftCompressor, CraftConfig
from craft_core.algorithm import pair
from craft_core.certify import certified_partners
from craft_core.selection import grid_projection, row_keys

pytestmark = pytest.mark.gpu

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def video(frames: int, grid: int, dim: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Scenes of drifting patches with static frames (exact duplicates), bits fixed by seed."""
    gen = torch.Generator().manual_seed(seed)
    per_frame = grid * grid
    base = (torch.rand(per_frame, dim, generator=gen) - 0.5) * 3
    rows = []
    for t in range(frames):
        if t % 8 == 0:
            base = (torch.rand(per_frame, dim, generator=gen) - 0.5) * 3
        elif t % 3:
            base = base + 0.2 * (torch.rand(per_frame, dim, generator=gen) - 0.5)
        rows.append(base)  # every third frame repeats the last one exactly
    return torch.cat(rows), grid_coords(frames, grid, grid)


@needs_cuda
@pytest.mark.parametrize("budget", [{"ratio": 8.0}, {"threshold": 0.9}])
def test_cuda_selects_exactly_the_cpu_tokens(budget: dict) -> None:
    x, coords = video(16, 16, 256)
    torch.manual_seed(0)
    compressor = CraftCompressor(CraftConfig(hidden_size=256))
    with torch.no_grad():
        cpu = compressor(x, coords, **budget)
        gpu = compressor.to("cuda")(x.cuda(), coords.cuda(), **budget)
    assert gpu.info["pairing"] == cpu.info["pairing"] == "batched"
    assert gpu.kept_index.cpu().tolist() == cpu.kept_index.tolist()
    assert gpu.assignment.cpu().tolist() == cpu.assignment.tolist()
    assert gpu.rounds == cpu.rounds
    torch.testing.assert_close(gpu.features.cpu(), cpu.features, rtol=1e-4, atol=1e-4)


@needs_cuda
@pytest.mark.parametrize("budget", [{"ratio": 8.0}, {"threshold": 0.9}])
def test_a_cuda_batch_selects_exactly_the_cpu_tokens_of_each_video(budget: dict) -> None:
    # Videos of several lengths in one compress_many call on CUDA: each one the CPU's tokens
    # alone (and its rows within float32 rounding of them).
    videos = [video(frames, 12, 256, seed=frames) for frames in (4, 9, 16, 7)]
    torch.manual_seed(0)
    compressor = CraftCompressor(CraftConfig(hidden_size=256))
    with torch.no_grad():
        alone = [compressor(x, coords, **budget) for x, coords in videos]
        gpu = compressor.to("cuda").compress_many(
            [x.cuda() for x, _ in videos], [c.cuda() for _, c in videos], **budget
        )
    for got, want in zip(gpu, alone):
        assert got.info["batch"] == len(videos)
        assert got.kept_index.cpu().tolist() == want.kept_index.tolist()
        assert got.assignment.cpu().tolist() == want.assignment.tolist()
        assert got.rounds == want.rounds
        torch.testing.assert_close(got.features.cpu(), want.features, rtol=1e-4, atol=1e-4)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_eager_round_equals_the_plain_round_on_the_cpu(dtype: torch.dtype) -> None:
    # Static frames (exact duplicates: ties everywhere). The reference is the plain round
    # (`algorithm.compress`: every similarity an exact float64 product) on the CPU: the
    # same tokens, and rows within float32 rounding (exact on the same device).
    from craft_core import resolve_budget
    from craft_core.algorithm import compress

    x, coords = video(24, 12, 256, seed=3)
    x = x.to(dtype)
    torch.manual_seed(0)
    cpu = CraftCompressor(CraftConfig(hidden_size=256))
    gpu = CraftCompressor(CraftConfig(hidden_size=256)).to("cuda")
    gpu.load_state_dict(cpu.state_dict())
    with torch.no_grad():
        got = gpu(x.cuda(), coords.cuda(), ratio=6.0)
    assert got.info["pairing"] == "batched"
    kept, owner, rows, rounds = compress(cpu, x, coords, resolve_budget(x.shape[0], ratio=6.0))
    assert got.kept_index.cpu().tolist() == kept
    assert [kept[i] for i in got.assignment.cpu().tolist()] == owner
    assert got.rounds == rounds
    torch.testing.assert_close(got.features.cpu().float(), rows.float(), rtol=1e-5, atol=1e-6)


def _median_ms(fn, repeats: int = 5) -> float:  # type: ignore[no-untyped-def]
    fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


@needs_cuda
@pytest.mark.parametrize("dim", [2560, 3584])
@pytest.mark.parametrize("frames", [16, 64, 256])  # N = 4,096 / 16,384 / 65,536
def test_real_size_bf16_timing_and_memory(frames: int, dim: int) -> None:
    x, coords = video(frames, 16, dim)
    x, coords = x.to("cuda", torch.bfloat16), coords.cuda()
    compressor = CraftCompressor(CraftConfig(hidden_size=dim)).to("cuda", torch.bfloat16)
    weight = grid_projection(compressor.projection)
    with torch.no_grad():
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = compressor(x, coords, ratio=8.0)
        peak_mb = (torch.cuda.max_memory_allocated() - before) / 2**20
        whole = _median_ms(lambda: compressor(x, coords, ratio=8.0), 3 if frames >= 256 else 5)
        exact_pass = _median_ms(lambda: pair(row_keys(x, weight, 2048)[0], 2048))
        certified_pass = _median_ms(lambda: certified_partners(row_keys(x, weight, 2048)[0], 2048))
        embed = torch.nn.functional.normalize(x.float() @ compressor.projection, dim=1).bfloat16()
        cublas = _median_ms(lambda: [embed[s : s + 2048] @ embed.T for s in range(0, len(x), 2048)])
    assert out.num_kept == x.shape[0] // 8
    print(
        f"\nN={x.shape[0]} D={dim} bf16: compression {whole:.2f} ms, rounds {out.rounds}, "
        f"one exact pairing pass {exact_pass:.2f} ms, one certified pass {certified_pass:.2f} ms, "
        f"one bf16 cuBLAS pass {cublas:.2f} ms, ratio to cuBLAS {whole / cublas:.1f}, "
        f"peak extra memory {peak_mb:.0f} MiB"
    )


def _graphed_trio(dim: int, precision: str = "exact") -> tuple[CraftCompressor, ...]:
    """A CPU compressor, an eager CUDA one and a `cuda_graphs=True` CUDA one, same weights."""
    torch.manual_seed(0)
    config = CraftConfig(hidden_size=dim)
    cpu = CraftCompressor(config, precision=precision)
    eager = CraftCompressor(config, precision=precision).cuda()
    graphed = CraftCompressor(config, precision=precision, cuda_graphs=True).cuda()
    for module in (eager, graphed):
        module.load_state_dict(cpu.state_dict())
    return cpu, eager, graphed


@needs_cuda
def test_graphed_rounds_capture_in_milliseconds_and_give_the_eager_rows() -> None:
    # The padded round's own kernels captured as CUDA graphs (no Inductor): the CPU's
    # tokens, the eager CUDA rows bit for bit (`exact`: the same ATen float64 kernels), a
    # capture in milliseconds, and a video met before replays every round.
    x, coords = video(16, 16, 256)  # N = 4,096: buckets 4,096 down to 512
    cpu, eager, graphed = _graphed_trio(256)
    xc, cc = x.cuda(), coords.cuda()
    with torch.no_grad():
        want_cpu = cpu(x, coords, ratio=8.0)
        want = eager(xc, cc, ratio=8.0)
        torch.cuda.synchronize()
        start = time.perf_counter()
        first = graphed(xc, cc, ratio=8.0)
        torch.cuda.synchronize()
        first_s = time.perf_counter() - start
        (runner,) = graphed._runners.values()
        captures = list(runner.capture_seconds)
        again = graphed(xc, cc, ratio=8.0)
        eager_ms = _median_ms(lambda: eager(xc, cc, ratio=8.0))
        graphed_ms = _median_ms(lambda: graphed(xc, cc, ratio=8.0))
    for got in (first, again):
        assert got.info["pairing"] == "graphed" and got.info["fallbacks"] == 0
        assert got.kept_index.cpu().tolist() == want_cpu.kept_index.tolist()
        assert got.assignment.cpu().tolist() == want_cpu.assignment.tolist()
        assert got.rounds == want_cpu.rounds
        assert torch.equal(got.features, want.features)
    assert again.info["graph_replays"] == again.rounds
    assert captures and max(captures) < 0.5  # milliseconds, not Inductor's ~100 s
    print(
        f"\ncuda_graphs N=4096 D=256: {len(captures)} captures, "
        f"{1e3 * sum(captures):.1f} ms in all (max {1e3 * max(captures):.1f} ms); "
        f"first call {first_s:.2f} s; warm {graphed_ms:.2f} ms vs eager {eager_ms:.2f} ms"
    )


@needs_cuda
def test_graphed_rounds_in_fast_precision_give_the_eager_tokens() -> None:
    x, coords = video(16, 16, 256, seed=1)
    _, eager, graphed = _graphed_trio(256, "fast")
    with torch.no_grad():
        want = eager(x.cuda(), coords.cuda(), ratio=8.0)
        got = graphed(x.cuda(), coords.cuda(), ratio=8.0)
    assert got.info["pairing"] == "graphed"
    assert torch.equal(got.kept_index, want.kept_index) and got.rounds == want.rounds
    torch.testing.assert_close(got.features, want.features, rtol=1e-5, atol=1e-6)
