"""Scissor-Merge: LLaVA-Scissor's grouping fused by CRAFT's learnable GatedMerge.

The groups are LLaVA-Scissor's (`scissor_plan`: components per frame, then across frames,
then every token assigned to its most similar representative). Each group's anchor token is
the target and its other members the sources of ONE `CraftCompressor.fuse_groups` step
(round 1), with the cosine between source and target as the selection similarity. A trained
checkpoint gives the learned merge; a fresh module gives G = 0.5 everywhere.
"""

from __future__ import annotations

import torch

from craft_core import CompressionResult, CraftCompressor
from craft_eval.baselines._common import finish, identity, normalized
from craft_eval.baselines.scissor import SEARCH_STEPS, plan_groups

NAME = "scissor-merge"


def scissor_merge(
    features: torch.Tensor,
    coords: torch.Tensor,
    *,
    compressor: CraftCompressor,
    ratio: float | None = None,
    threshold: float | None = None,
    min_tokens: int | None = None,
    importance: torch.Tensor | None = None,
    search_steps: int = SEARCH_STEPS,
) -> CompressionResult:
    """Group as LLaVA-Scissor (threshold mode or budgeted, exactly as `llava_scissor`) and
    fuse each group into its anchor with `compressor.fuse_groups`. `importance` is ignored."""
    plan, info = plan_groups(
        NAME,
        features,
        coords,
        ratio=ratio,
        threshold=threshold,
        min_tokens=min_tokens,
        search_steps=search_steps,
    )
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
