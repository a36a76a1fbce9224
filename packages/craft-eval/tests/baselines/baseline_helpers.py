"""Synthetic videos and the invariants every baseline result must satisfy."""

from __future__ import annotations

import torch

from craft_core import CompressionResult, target_token_count

METHODS = (
    "tome",
    "divprune",
    "visionzip",
    "vidcom2",
    "fastvid",
    "flashvid",
    "holitom",
    "llava-scissor",
    "dtd",
    "scissor-merge",
)
ADAPTIVE = ("llava-scissor", "dtd", "scissor-merge")


def grid_coords(frames: int, height: int, width: int) -> torch.Tensor:
    """`[T*H*W, 3]` raster-order (t, h, w)."""
    t, h, w = torch.meshgrid(
        torch.arange(frames), torch.arange(height), torch.arange(width), indexing="ij"
    )
    return torch.stack([t.flatten(), h.flatten(), w.flatten()], dim=1)


def video(
    frames: int = 4,
    height: int = 4,
    width: int = 4,
    dim: int = 16,
    seed: int = 0,
    noise: float = 0.3,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A video-like clip: each frame is the previous one plus noise (temporal redundancy)."""
    g = torch.Generator().manual_seed(seed)
    frame = torch.randn(height * width, dim, generator=g)
    rows = []
    for _ in range(frames):
        rows.append(frame)
        frame = frame + noise * torch.randn(height * width, dim, generator=g)
    return torch.cat(rows), grid_coords(frames, height, width)


def check_result(
    result: CompressionResult, features: torch.Tensor, coords: torch.Tensor, kept: int | None
) -> None:
    """Shapes, dtypes and the kept_index / assignment invariants of one result."""
    n, d = features.shape
    k = result.num_kept
    if kept is not None:
        assert k == kept
    assert 1 <= k <= n
    assert result.features.shape == (k, d)
    assert result.features.dtype == features.dtype
    assert bool(torch.isfinite(result.features.float()).all())
    assert result.kept_index.dtype == torch.long
    assert bool((result.kept_index.diff() > 0).all())
    assert torch.equal(result.coords, coords[result.kept_index].long())
    assert result.assignment.shape == (n,)
    assert result.assignment.dtype == torch.long
    assert int(result.assignment.min()) >= 0 and int(result.assignment.max()) < k
    assert torch.equal(result.assignment[result.kept_index], torch.arange(k))
    assert isinstance(result.info.get("method"), str)
    assert "importance" in result.info


def budget(n: int, ratio: float) -> int:
    return target_token_count(n, ratio)
