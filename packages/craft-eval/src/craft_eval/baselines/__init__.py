"""The published baselines as pure functions on one video's tokens (issue 5).

Each function takes `features [N, D]`, `coords [N, 3]` (t, h, w) and exactly one budget
(`ratio=` fixed and exact, or `threshold=` for the methods with an adaptive mode) and returns a
`craft_core.CompressionResult`. Methods that score tokens by the vision tower's attention
take `importance=[N]` (attention received) and fall back to the L2 norm, recording which ran
in `result.info["importance"]`; their registered compressors set `needs_attention = True`,
so craft-adapters hands them the vision tower's last-layer attention (craft_adapters.attention).

Importing this package registers every baseline in `craft_eval.methods` (the registry passes
the vision tower's attention as the extra `attention=`; `importance=` is accepted too).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from craft_core import CompressionResult
from craft_eval.baselines.divprune import divprune
from craft_eval.baselines.dtd import dtd
from craft_eval.baselines.fastvid import fastvid
from craft_eval.baselines.scissor import SEARCH_STEPS, llava_scissor, scissor_plan
from craft_eval.baselines.scissor_merge import scissor_merge
from craft_eval.baselines.tome import tome
from craft_eval.baselines.vidcom2 import vidcom2
from craft_eval.baselines.visionzip import visionzip
from craft_eval.methods.registry import register_method

__all__ = [
    "BaselineMethod",
    "ScissorMergeMethod",
    "divprune",
    "dtd",
    "fastvid",
    "llava_scissor",
    "scissor_merge",
    "scissor_plan",
    "tome",
    "vidcom2",
    "visionzip",
]


class BaselineMethod:
    """A registered baseline: the function with its settings bound (a `TokenCompressor`)."""

    def __init__(
        self,
        function: Callable[..., CompressionResult],
        *,
        needs_attention: bool = False,
        **settings: Any,
    ) -> None:
        self.function = function
        self.settings = settings
        #: craft-adapters hands `importance=` (received attention) to compressors that ask
        self.needs_attention = needs_attention

    def __call__(
        self,
        features: torch.Tensor,
        coords: torch.Tensor,
        *,
        ratio: float | None = None,
        threshold: float | None = None,
        min_tokens: int | None = None,
        importance: torch.Tensor | None = None,
        attention: torch.Tensor | None = None,
        **extras: Any,
    ) -> CompressionResult:
        return self.function(
            features,
            coords,
            ratio=ratio,
            threshold=threshold,
            min_tokens=min_tokens,
            importance=importance if importance is not None else attention,
            **self.settings,
        )


class ScissorMergeMethod:
    """Scissor-Merge with its `CraftCompressor`: from `checkpoint`, or fresh (built on the
    first call from the features' width when `hidden_size` is not given). The module is
    loaded and placed exactly as for the `craft` method."""

    def __init__(
        self,
        checkpoint: str | Path | None = None,
        hidden_size: int | None = None,
        search_steps: int | None = None,
        **overrides: Any,
    ) -> None:
        from craft_eval.methods.craft import CraftMethod

        self.craft = CraftMethod(
            name="scissor-merge", checkpoint=checkpoint, hidden_size=hidden_size, **overrides
        )
        self.checkpoint = self.craft.checkpoint
        self.search_steps = SEARCH_STEPS if search_steps is None else int(search_steps)

    def __call__(
        self,
        features: torch.Tensor,
        coords: torch.Tensor,
        *,
        ratio: float | None = None,
        threshold: float | None = None,
        min_tokens: int | None = None,
        importance: torch.Tensor | None = None,
        **extras: Any,
    ) -> CompressionResult:
        result = scissor_merge(
            features,
            coords,
            compressor=self.craft.module_for(features),
            ratio=ratio,
            threshold=threshold,
            min_tokens=min_tokens,
            search_steps=self.search_steps,
        )
        result.info["checkpoint"] = self.checkpoint
        return result


_ATTENTION_NOTE = " Ranks by attention=[N] (received attention); L2-norm proxy without it."
_ATTENTION = "attention (ViT last layer, received); L2-norm fallback"


@register_method(
    "tome",
    kind="merge",
    needs=(),
    description="ToMe (video): bipartite soft matching over all tokens, size-weighted means.",
)
def build_tome(**_: Any) -> BaselineMethod:
    return BaselineMethod(tome)


@register_method(
    "divprune",
    kind="prune",
    needs=(),
    description="DivPrune: greedy max-min diversity (1 - cosine) pruning.",
)
def build_divprune(**_: Any) -> BaselineMethod:
    return BaselineMethod(divprune)


@register_method(
    "visionzip",
    kind="merge",
    needs=("attention",),
    saliency=_ATTENTION,
    description="VisionZip: per-frame dominant tokens + contextual merges (54:10)."
    + _ATTENTION_NOTE,
)
def build_visionzip(contextual_fraction: float = 10 / 64, **_: Any) -> BaselineMethod:
    return BaselineMethod(visionzip, needs_attention=True, contextual_fraction=contextual_fraction)


@register_method(
    "vidcom2",
    kind="prune",
    needs=(),
    saliency="token features (Gaussian similarity to video / frame means)",
    description="VidCom2: frame-adaptive budgets, keeps each frame's most distinctive tokens.",
)
def build_vidcom2(
    channel_fraction: float = 0.5, temperature: float = 0.01, **_: Any
) -> BaselineMethod:
    return BaselineMethod(vidcom2, channel_fraction=channel_fraction, temperature=temperature)


@register_method(
    "fastvid",
    kind="merge",
    needs=("attention",),
    saliency=_ATTENTION,
    description="FastVID (published OneVision code): dynamic segments, salient tokens + "
    "density-peak anchors merging segment tokens per anchor frame." + _ATTENTION_NOTE,
)
def build_fastvid(
    segments: int = 8,
    tau: float = 0.9,
    d: float = 0.4,
    p: int = 4,
    beta: float = 0.6,
    knn: int = 4,
    include_anchor: bool = True,
    exact_budget: bool = True,
    **_: Any,
) -> BaselineMethod:
    return BaselineMethod(
        fastvid,
        needs_attention=True,
        segments=segments,
        tau=tau,
        d=d,
        p=p,
        beta=beta,
        knn=knn,
        include_anchor=include_anchor,
        exact_budget=exact_budget,
    )


@register_method(
    "llava-scissor",
    kind="merge",
    needs=(),
    description="LLaVA-Scissor: semantic connected components (threshold=tau, published 0.9, "
    "no floor unless min_tokens=; ratio= searches tau for the exact count).",
)
def build_llava_scissor(search_steps: int | None = None, **_: Any) -> BaselineMethod:
    settings: dict[str, Any] = {} if search_steps is None else {"search_steps": search_steps}
    return BaselineMethod(llava_scissor, **settings)


@register_method(
    "dtd",
    kind="prune",
    needs=(),
    saliency="token features (cosine with the same patch of the previous frame)",
    description="TimeChat-Online DTD: drop tokens too similar to the same patch of the "
    "previous frame (threshold=, or ratio= drops each later frame's most redundant).",
)
def build_dtd(**_: Any) -> BaselineMethod:
    return BaselineMethod(dtd)


@register_method(
    "scissor-merge",
    kind="merge",
    needs=("checkpoint",),
    description="Scissor-Merge: LLaVA-Scissor's grouping fused by CRAFT's GatedMerge "
    "(checkpoint=PATH; fresh untrained module without one).",
)
def build_scissor_merge(
    checkpoint: str | Path | None = None,
    hidden_size: int | None = None,
    search_steps: int | None = None,
    **overrides: Any,
) -> ScissorMergeMethod:
    return ScissorMergeMethod(
        checkpoint=checkpoint, hidden_size=hidden_size, search_steps=search_steps, **overrides
    )
