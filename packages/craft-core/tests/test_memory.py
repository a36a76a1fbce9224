"""Memory: the N x N similarity matrix is never built.

At N = 65,536 a float32 N x N matrix is 17 GB; the blockwise pass needs about
sim_block x N floats. Peak resident memory is read in a fresh process (ru_maxrss is a
process-wide high-water mark) relative to what the process held just before compressing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, resource, torch
    from craft_core import CraftCompressor, CraftConfig
    torch.set_num_threads(2)
    n, dim, block = 65536, 8, 512
    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(512, dim, generator=gen)
    x = centres[torch.randint(0, 512, (n,), generator=gen)] + 0.2 * torch.randn(n, dim, generator=gen)
    coords = torch.randint(0, 64, (n, 3), generator=gen)
    compressor = CraftCompressor(CraftConfig(hidden_size=dim, sim_dim=16, reduce="target"),
                                 sim_block=block)
    with torch.no_grad():
        compressor(x[:4096], coords[:4096], ratio=2.0)  # warm up allocator and kernels
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        out = compressor(x, coords, ratio=2.0)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"extra": after - before, "kept": out.num_kept, "block": block, "n": n}))
    """
)


@pytest.mark.slow
def test_peak_memory_is_linear_in_n_times_block() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, check=True
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    n, block = report["n"], report["block"]
    assert report["kept"] == n // 2
    block_bytes = n * block * 4  # one block of float32 similarities: 128 MiB
    full_matrix = n * n * 4  # 16 GiB
    # A few live copies of one block (scores, masks, top-k work) plus O(N) state.
    assert report["extra"] < 6 * block_bytes, report
    assert report["extra"] < full_matrix / 20, report
