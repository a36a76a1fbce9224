"""Helpers shared by craft-core's tests: path-independent noise, grid coords, live weights.

Imported by the test modules (`from core_testkit import noise`); pytest puts this folder on
`sys.path`. Nothing here is a test.
"""

from __future__ import annotations

import torch

from craft_core import CraftCompressor


def noise(*shape: int, generator: torch.Generator) -> torch.Tensor:
    """Zero-mean noise of about unit scale that is the same bits on every CPU path.

    (`torch.randn` is not: its vectorised Box-Muller rounds differently with AVX2/AVX-512.)
    """
    return (torch.rand(4, *shape, generator=generator) - 0.5).sum(0) * 1.7


def grid_coords(frames: int, height: int, width: int) -> torch.Tensor:
    """Raster-order `(t, h, w)` of every token of a `frames x height x width` clip: `[F*H*W, 3]`."""
    t, h, w = torch.meshgrid(
        torch.arange(frames), torch.arange(height), torch.arange(width), indexing="ij"
    )
    return torch.stack([t.flatten(), h.flatten(), w.flatten()], dim=1)


def make_tokens(seed: int, n: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Frames of 4 tokens from a few clusters, with static (copied) frames and duplicates."""
    gen = torch.Generator().manual_seed(seed)
    centres = noise(max(1, n // 8), dim, generator=gen)
    pick = torch.randint(0, centres.shape[0], (n,), generator=gen)
    x = centres[pick] + 0.4 * noise(n, dim, generator=gen)
    frames = n // 4
    for f in range(1, frames):
        if torch.rand(1, generator=gen).item() < 0.35:  # a static frame repeats the last one
            x[4 * f : 4 * f + 4] = x[4 * f - 4 : 4 * f]
    if n >= 6:
        x[n - 1] = x[1]
        x[n - 2] = x[1]
    positions = torch.arange(n)
    coords = torch.stack([positions // 4, (positions // 2) % 2, positions % 2], dim=1)
    return x, coords


SIZES = [2, 3, 5, 8, 12, 17, 20, 24, 33, 40, 48, 56, 64, 77, 90, 100]
BUDGETS = [{"ratio": 4.0}, {"ratio": 1.7}, {"threshold": 0.6}]


def live_weights(compressor: CraftCompressor, seed: int, scale: float = 0.2) -> CraftCompressor:
    """Give every merge parameter path-independent, non-trivial values (a live gate)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in compressor.merge.parameters():
            param.copy_(scale * noise(*param.shape, generator=gen))
    return compressor
