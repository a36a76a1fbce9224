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
from craft_core.certify import certified_partners
from craft_core.selection import full_partners, grid_projection, row_keys

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
@pytest.mark.parametrize("pairing", ["full", "incremental"])
@pytest.mark.parametrize("budget", [{"ratio": 8.0}, {"threshold": 0.9}])
def test_cuda_selects_exactly_the_cpu_tokens(pairing: str, budget: dict) -> None:
    x, coords = video(16, 16, 256)
    torch.manual_seed(0)
    compressor = CraftCompressor(CraftConfig(hidden_size=256), pairing=pairing)
    with torch.no_grad():
        cpu = compressor(x, coords, **budget)
        gpu = compressor.to("cuda")(x.cuda(), coords.cuda(), **budget)
    assert gpu.kept_index.cpu().tolist() == cpu.kept_index.tolist()
    assert gpu.assignment.cpu().tolist() == cpu.assignment.tolist()
    assert gpu.rounds == cpu.rounds
    torch.testing.assert_close(gpu.features.cpu(), cpu.features, rtol=1e-4, atol=1e-4)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pairing", ["full", "incremental"])
def test_cuda_certified_equals_the_plain_round_on_the_cpu(pairing: str, dtype: torch.dtype) -> None:
    # Static frames (exact duplicates) force rechecks on the GPU path too. The reference is
    # the plain round (`algorithm.compress`: every similarity an exact float64 product) on
    # the CPU: the same tokens, and rows within float32 rounding (exact on the same device).
    from craft_core import resolve_budget
    from craft_core.algorithm import compress

    x, coords = video(24, 12, 256, seed=3)
    x = x.to(dtype)
    torch.manual_seed(0)
    cpu = CraftCompressor(CraftConfig(hidden_size=256), pairing=pairing)
    gpu = CraftCompressor(CraftConfig(hidden_size=256), pairing=pairing).to("cuda")
    gpu.load_state_dict(cpu.state_dict())
    with torch.no_grad():
        certified = gpu(x.cuda(), coords.cuda(), ratio=6.0)
    if pairing == "full":  # the incremental pairing decides these rows without a recheck
        assert sum(certified.info["rows_rechecked"]) > 0
    kept, owner, rows, rounds = compress(cpu, x, coords, resolve_budget(x.shape[0], ratio=6.0))
    assert certified.kept_index.cpu().tolist() == kept
    assert [kept[i] for i in certified.assignment.cpu().tolist()] == owner
    assert certified.rounds == rounds
    torch.testing.assert_close(certified.features.cpu().float(), rows.float(), rtol=1e-5, atol=1e-6)
    print(
        f"\n{pairing} {dtype}: rows decided fast {sum(certified.info['rows_fast'])}, "
        f"rechecked {sum(certified.info['rows_rechecked'])}"
    )


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
        exact_pass = _median_ms(lambda: full_partners(row_keys(x, weight, 2048)[0], 2048))
        certified_pass = _median_ms(lambda: certified_partners(row_keys(x, weight, 2048)[0], 2048))
        embed = torch.nn.functional.normalize(x.float() @ compressor.projection, dim=1).bfloat16()
        cublas = _median_ms(lambda: [embed[s : s + 2048] @ embed.T for s in range(0, len(x), 2048)])
    assert out.num_kept == x.shape[0] // 8
    print(
        f"\nN={x.shape[0]} D={dim} bf16: compression {whole:.2f} ms, rounds {out.rounds}, "
        f"one exact pairing pass {exact_pass:.2f} ms, one certified pass {certified_pass:.2f} ms, "
        f"one bf16 cuBLAS pass {cublas:.2f} ms, ratio to cuBLAS {whole / cublas:.1f}, "
        f"rows rechecked {sum(out.info['rows_rechecked'])} of "
        f"{sum(out.info['rows_fast']) + sum(out.info['rows_rechecked'])}, "
        f"peak extra memory {peak_mb:.0f} MiB"
    )


@needs_cuda
def test_a_round_replays_as_a_cuda_graph() -> None:
    # The fixed-shape round (pairing + selection, no host sync) captured once and replayed
    # on new data gives what eager gives on that data. NOT run yet: no GPU in development.
    from craft_core.certify import similarity_bound
    from craft_core.pairing import fixed_round

    x, _ = video(16, 16, 64)
    weight = grid_projection(CraftCompressor(CraftConfig(hidden_size=64)).projection).cuda()
    embed, norms = row_keys(x.cuda(), weight)
    active = torch.arange(0, embed.shape[0], 2, device="cuda")
    args = (embed.clone(), active, norms.clone(), 100, None, 2048, similarity_bound(128), 64)
    fixed_round(*args)  # warm-up on a side stream, as CUDA graphs require
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fixed_round(*args)
    other, other_norms = row_keys(x.flip(0).cuda(), weight)
    args[0].copy_(other)
    args[2].copy_(other_norms)
    graph.replay()
    want = fixed_round(*args)
    assert torch.equal(captured[5], want[5])  # sizes
    edges, targets = want[5][:2].tolist()
    for field in range(4):
        assert torch.equal(captured[field][:edges], want[field][:edges])
    assert torch.equal(captured[4][:targets], want[4][:targets])
