"""The CRAFT family: CRAFT itself, selection-only CRAFT and target-pruning CRAFT.

All three run `craft_core.CraftCompressor`; they differ in the config's ablation switches
(algorithm.md, "Ablation switches"):

| name | weighting | reduce | learnable parts used |
| --- | --- | --- | --- |
| craft | position | gate | all (from a checkpoint, or fresh: G = 0.5) |
| craft-selection | uniform | mean | none (training-free) |
| craft-prune | position | target | none: G = 0 keeps every target's own row |

Without `hidden_size` the compressor is built on the first call from the width of the
features it receives (only sensible for the training-free variants and for a fresh `craft`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from craft_eval.methods.base import Method, Request
from craft_eval.methods.registry import register_method

if TYPE_CHECKING:
    from craft_core import CompressionResult, TokenBudget


class CraftMethod(Method):
    """A `TokenCompressor` around a `craft_core.CraftCompressor`, built now or lazily.

    Args:
        checkpoint: a folder written by `CraftCompressor.save_pretrained`; wins over the rest.
        hidden_size: D; None builds on the first call from the features' width.
        overrides: further `CraftConfig` fields (weighting, reduce, seed, ...) and run
            options (`craft_core.runtime.RunOptions`: precision, compile, ...).
        device: where the module lives; None follows the features of the first call.
    """

    def __init__(
        self,
        *,
        name: str,
        checkpoint: str | Path | None = None,
        hidden_size: int | None = None,
        device: str | torch.device | None = None,
        **overrides: Any,
    ) -> None:
        self.name = name
        self.checkpoint = None if checkpoint is None else str(checkpoint)
        from craft_core.runtime import RunOptions

        # Run options go to the compressor, the rest to its config (a checkpoint's wins).
        self.run_options = {k: v for k, v in overrides.items() if k in RunOptions.model_fields}
        self.overrides = {k: v for k, v in overrides.items() if k not in self.run_options}
        self.device = None if device is None else torch.device(device)
        self.module: Any = None
        if self.checkpoint is not None:
            self.module = self._load(self.checkpoint)
        elif hidden_size is not None:
            self.module = self._fresh(int(hidden_size))
        if self.module is not None and self.device is not None:
            self.module.to(self.device)

    @property
    def hidden_size(self) -> int | None:
        """D of the underlying module; None until built."""
        return None if self.module is None else int(self.module.config.hidden_size)

    def _fresh(self, hidden_size: int) -> Any:
        from craft_core import CraftCompressor, CraftConfig

        config = CraftConfig(hidden_size=hidden_size, **self.overrides)
        # the module's init draws from torch's global generator: seeded here, a fresh module
        # is the same whatever ran before it in the process (measured before: the world's
        # untrained row moved 0.2 points with the order of the methods in a table)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            return CraftCompressor(config, **self.run_options).eval()

    def _load(self, path: str) -> Any:
        from craft_core import CraftCompressor

        # "org/name@rev" pins a Hub revision; a local folder is never split.
        name, _, revision = (path, "", "") if Path(path).is_dir() else path.partition("@")
        module = CraftCompressor.from_pretrained(
            name, revision=revision or None, **self.run_options
        ).eval()
        if self.overrides:
            from craft_core import CraftConfig

            config = CraftConfig(**{**module.config.model_dump(), **self.overrides})
            rebuilt = CraftCompressor(config, **self.run_options)
            rebuilt.load_state_dict(module.state_dict())
            module = rebuilt.eval()
        return module

    def module_for(self, features: torch.Tensor) -> Any:
        """The `CraftCompressor` for these features `[N, D]`: built now from their width if
        it was not yet, and on their device unless a device was fixed."""
        if self.module is None:
            if not isinstance(features, torch.Tensor) or features.dim() != 2:
                raise ValueError("features must be a [N, D] tensor")
            self.module = self._fresh(int(features.shape[1])).to(features.device)
        elif self.device is None and _module_device(self.module) != features.device:
            self.module.to(features.device)
        return self.module

    def compress(self, request: Request, **extras: Any) -> CompressionResult:
        module = self.module_for(request.features)
        with torch.no_grad():
            result = module(request.features, request.coords, request.budget)
        return self._named(result)

    def compress_many(
        self,
        features: Sequence[torch.Tensor],
        coords: Sequence[torch.Tensor],
        budget: TokenBudget,
        *,
        importance: Sequence[torch.Tensor | None] | None = None,
    ) -> list[CompressionResult]:
        """Several videos in ONE call of the module's batched entry
        (`CraftCompressor.compress_many`: each video's tokens and rows the same as `compress`
        on it alone); `importance` is unused, as in `compress`."""
        features = list(features)
        if not features:
            return []
        module = self.module_for(features[0])
        with torch.no_grad():
            results = module.compress_many(features, list(coords), budget)
        return [self._named(result) for result in results]

    def _named(self, result: CompressionResult) -> CompressionResult:
        result.info["method"] = self.name
        if self.checkpoint is not None:
            result.info.setdefault("checkpoint", self.checkpoint)
        return result


def _module_device(module: Any) -> torch.device:
    for tensor in list(module.parameters()) + list(module.buffers()):
        return tensor.device
    return torch.device("cpu")


@register_method(
    "craft",
    kind="merge",
    needs=("checkpoint",),
    description="CRAFT: similarity selection + learned position-aware gated merge "
    "(checkpoint=PATH; fresh untrained module without one).",
)
def build_craft(
    checkpoint: str | Path | None = None, hidden_size: int | None = None, **overrides: Any
) -> CraftMethod:
    return CraftMethod(name="craft", checkpoint=checkpoint, hidden_size=hidden_size, **overrides)


@register_method(
    "craft-selection",
    kind="merge",
    needs=(),
    description="Selection-only CRAFT: CRAFT's selection, uniform weights, plain mean (training-free).",
)
def build_craft_selection(hidden_size: int | None = None, **overrides: Any) -> CraftMethod:
    overrides = {**overrides, "weighting": "uniform", "reduce": "mean"}
    return CraftMethod(name="craft-selection", hidden_size=hidden_size, **overrides)


@register_method(
    "craft-prune",
    kind="prune",
    needs=(),
    description="Target-pruning CRAFT: CRAFT's selection, every target keeps its own row (G = 0).",
)
def build_craft_prune(hidden_size: int | None = None, **overrides: Any) -> CraftMethod:
    overrides = {**overrides, "reduce": "target"}
    return CraftMethod(name="craft-prune", hidden_size=hidden_size, **overrides)
