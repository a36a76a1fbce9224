"""Scissor-Merge: LLaVA-Scissor's grouping fused by CRAFT's learnable GatedMerge.

The groups are LLaVA-Scissor's (`scissor_plan`: components per frame, then across frames,
then every token assigned to its most similar representative). Each group's anchor token is
the target and its other members the sources of ONE `CraftCompressor.fuse_groups` step
(round 1), with the cosine between source and target as the selection similarity. A trained
checkpoint gives the learned merge; a fresh module gives G = 0.5 everywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from craft_core import CompressionResult, CraftCompressor
from craft_eval.baselines._common import Baseline, Checked, finish, identity, normalized
from craft_eval.baselines.scissor import SEARCH_STEPS, plan_groups
from craft_eval.methods.base import Method, Request
from craft_eval.methods.registry import register_method

NAME = "scissor-merge"


def _scissor_merge(
    features: torch.Tensor,
    coords: torch.Tensor,
    budget: Checked,
    importance: torch.Tensor | None,
    *,
    compressor: CraftCompressor,
    search_steps: int = SEARCH_STEPS,
) -> CompressionResult:
    """Group as LLaVA-Scissor (threshold mode or budgeted, exactly as `llava_scissor`) and
    fuse each group into its anchor with `compressor.fuse_groups`. `importance` is ignored."""
    plan, info = plan_groups(features, coords, budget, search_steps=search_steps)
    if plan is None:
        return identity(NAME, features, coords, info)
    n = features.shape[0]
    is_anchor = torch.zeros(n, dtype=torch.bool, device=features.device)
    is_anchor[plan.anchors] = True
    sources = torch.nonzero(~is_anchor).squeeze(1)
    targets = plan.representative[sources]
    e = normalized(features)
    similarity = (e[sources] * e[targets]).sum(dim=-1)
    with torch.no_grad():
        fused = compressor.fuse_groups(features, coords, targets, sources, similarity)
    info["settings"]["merge"] = {
        "weighting": compressor.config.weighting,
        "reduce": compressor.config.reduce,
    }
    return finish(
        NAME,
        features,
        coords,
        plan.anchors,
        plan.representative,
        fused[plan.anchors],
        rounds=1,
        info=info,
    )


#: the public call: `scissor_merge(features, coords, ratio=..., compressor=module)`
scissor_merge = Baseline(NAME, _scissor_merge, adaptive=True)


class ScissorMergeMethod(Method):
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

    def compress(self, request: Request, **extras: Any) -> CompressionResult:
        compressor = self.craft.module_for(request.features)
        result = scissor_merge.compress(
            request, compressor=compressor, search_steps=self.search_steps
        )
        result.info["checkpoint"] = self.checkpoint
        return result


# registered here: adding a baseline touches this one file (and its test)
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
