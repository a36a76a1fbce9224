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


def live_weights(compressor: CraftCompressor, seed: int, scale: float = 0.2) -> CraftCompressor:
    """Give every merge parameter path-independent, non-trivial values (a live gate)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in compressor.merge.parameters():
            param.copy_(scale * noise(*param.shape, generator=gen))
    return compressor
