"""Sanity-floor methods: random and uniform (evenly strided) token subsets."""

from __future__ import annotations

from typing import Any

import torch

from craft_core import CompressionResult
from craft_eval.methods.base import Method, Request, fixed_budget, prune_result
from craft_eval.methods.registry import register_method


class _Pruner(Method):
    """A fixed-ratio pruning method: `pick(n, keep)` chooses the `keep` indices of `n`."""

    name = ""

    def pick(self, n: int, keep: int) -> torch.Tensor:
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        return {"method": self.name}

    def compress(self, request: Request, **extras: Any) -> CompressionResult:
        features = request.features
        keep = fixed_budget(features, request.coords, request.budget, method=self.name)
        kept = self.pick(int(features.shape[0]), keep)
        return prune_result(features, request.coords, kept, info=self.info())


class RandomCompressor(_Pruner):
    """Keep a uniformly random subset of exactly the budget's size.

    The generator is re-seeded from `seed` on every call, so a video gets the same subset
    whatever ran before it (results do not depend on evaluation order or sharding).
    """

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)

    def pick(self, n: int, keep: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed)
        return torch.randperm(n, generator=generator)[:keep]

    def info(self) -> dict[str, Any]:
        return {"method": "random", "seed": self.seed}


class UniformCompressor(_Pruner):
    """Keep an evenly strided subset: indices `floor((i + 0.5) * N / k)`, i = 0..k-1."""

    name = "uniform"

    def pick(self, n: int, keep: int) -> torch.Tensor:
        kept = ((torch.arange(keep, dtype=torch.float64) + 0.5) * n / keep).floor().long()
        return kept.clamp(max=n - 1)


@register_method(
    "random",
    kind="prune",
    needs=(),
    saliency="none",
    description="Random subset of the budget's size (seeded).",
)
def build_random(seed: int = 0, **_: Any) -> RandomCompressor:
    return RandomCompressor(seed=seed)


@register_method(
    "uniform",
    kind="prune",
    needs=(),
    saliency="none",
    description="Evenly strided subset over the raster order.",
)
def build_uniform(**_: Any) -> UniformCompressor:
    return UniformCompressor()
