"""VisionZip: dominant tokens by attention plus contextual tokens merged around strided centres.

Yang et al., "VisionZip: Longer is Better but Not Necessary in Vision Language Models",
CVPR 2025. Per frame (the published code runs per image through the vision tower):
the `k_dom` tokens that receive the most attention are kept as they are; the rest are split
by a uniform stride into `k_ctx` centres, every other remaining token is assigned to its most
similar centre (cosine) and each centre becomes `centre + mean(assigned)` (a sum, as in the
published code). Budget split dominant:contextual 54:10 by default.
"""

from __future__ import annotations

import torch

from craft_core import CompressionResult
from craft_eval.baselines._common import (
    ATTENTION,
    ATTENTION_NOTE,
    Checked,
    apportion,
    baseline,
    check_settings,
    finish,
    frames_of,
    group_sum,
    most_similar,
    normalized,
    opening,
    top_indices,
)

NAME = "visionzip"


@baseline(
    NAME,
    kind="merge",
    needs=("attention",),
    saliency=ATTENTION,
    description="VisionZip: per-frame dominant tokens + contextual merges (54:10)."
    + ATTENTION_NOTE,
)
def visionzip(
    features: torch.Tensor,
    coords: torch.Tensor,
    budget: Checked,
    importance: torch.Tensor | None,
    *,
    contextual_fraction: float = 10 / 64,
) -> CompressionResult:
    """Keep exactly `max(1, floor(N / ratio))` tokens: dominant + contextual, per frame.

    Args:
        importance: `[N]` attention received per token; the L2 norm is the proxy without it.
        contextual_fraction: share of each frame's budget given to contextual tokens
            (published: 10 of 64). A frame with leftover tokens gets at least one centre.

    The frame budgets are the total budget split in proportion to frame sizes; when the
    budget is smaller than the number of frames the whole video is one group.
    """
    check_settings(NAME, contextual_fraction=(contextual_fraction, "in [0, 1]"))
    settings = {"contextual_fraction": contextual_fraction}
    scores, info, done = opening(NAME, features, coords, budget, importance, settings)
    if done is not None:
        return done
    n, k = features.shape[0], budget.floor

    frames = frames_of(coords)
    groups = frames.members if k >= frames.count else [torch.arange(n, device=features.device)]
    sizes = [int(g.numel()) for g in groups]
    budgets = apportion(k, sizes, sizes)
    info["groups"] = "frames" if k >= frames.count else "video"

    e = normalized(features)
    x = features.float()
    kept_parts, row_parts = [], []
    representative = torch.arange(n, device=features.device)
    for members, k_f in zip(groups, budgets):
        group_kept, group_rows = _zip_group(
            x, e, scores, members, k_f, contextual_fraction, representative
        )
        kept_parts += group_kept
        row_parts += group_rows

    kept = torch.cat(kept_parts)
    return finish(NAME, features, coords, kept, representative, torch.cat(row_parts), info=info)


def _zip_group(
    x: torch.Tensor,
    e: torch.Tensor,
    scores: torch.Tensor,
    members: torch.Tensor,
    k_f: int,
    contextual_fraction: float,
    representative: torch.Tensor,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One group (a frame, or the video) of `members` kept as `k_f` tokens: the dominant
    (top-scored) ones as they are, and contextual centres, evenly spaced among the rest,
    each merging the rest most similar to it. Updates `representative` in place.
    -> (kept indices, their rows) as lists of tensors."""
    n_f = members.numel()
    if k_f >= n_f:
        return [members], [x[members]]
    k_ctx = min(k_f, max(1, round(k_f * contextual_fraction)))
    k_dom = k_f - k_ctx
    dominant_pos = top_indices(scores[members], k_dom)
    rest_mask = torch.ones(n_f, dtype=torch.bool, device=x.device)
    rest_mask[dominant_pos] = False
    rest = members[rest_mask]  # ascending original index
    step = max(1, rest.numel() // k_ctx)
    centre_pos = torch.arange(0, rest.numel(), step, device=x.device)[:k_ctx]
    is_centre = torch.zeros(rest.numel(), dtype=torch.bool, device=x.device)
    is_centre[centre_pos] = True
    centres, others = rest[is_centre], rest[~is_centre]
    owner = most_similar(e[others], e[centres])
    sums = group_sum(x[others], owner, k_ctx)
    counts = torch.bincount(owner, minlength=k_ctx).clamp(min=1).float()
    representative[others] = centres[owner]
    dominant = members[dominant_pos]
    return [dominant, centres], [x[dominant], x[centres] + sums / counts[:, None]]
