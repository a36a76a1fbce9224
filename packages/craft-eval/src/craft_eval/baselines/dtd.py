"""DTD: TimeChat-Online's differential token dropping.

Yao et al., "TimeChat-Online: 80% Visual Tokens are Naturally Redundant in Streaming Videos",
2025. A token is dropped when its cosine with the token at the same `(h, w)` in the previous
frame exceeds a threshold; the first frame stays whole. For a fixed budget the most redundant
tokens (highest cosine with their predecessor) are dropped first. A dropped token is assigned
to where its predecessor ended up (the chain ends at a kept token).
"""

from __future__ import annotations

import itertools

import torch

from craft_core import CompressionResult
from craft_eval.baselines._common import (
    finish,
    frames_of,
    most_similar,
    normalized,
    prepare,
    top_indices,
)

NAME = "dtd"


def _predecessors(coords: torch.Tensor, members: list[torch.Tensor]) -> torch.Tensor:
    """`[N]` index of the token at the same `(h, w)` in the previous frame, -1 if none."""
    n = coords.shape[0]
    h = coords[:, 1].long() - coords[:, 1].min()
    w = coords[:, 2].long() - coords[:, 2].min()
    key = h * (int(w.max()) + 1) + w
    pred = torch.full((n,), -1, dtype=torch.long, device=coords.device)
    for prev, cur in itertools.pairwise(members):
        prev_keys, order = torch.sort(key[prev], stable=True)
        pos = torch.searchsorted(prev_keys, key[cur]).clamp(max=prev.numel() - 1)
        found = prev_keys[pos] == key[cur]
        pred[cur[found]] = prev[order[pos[found]]]
    return pred


def dtd(
    features: torch.Tensor,
    coords: torch.Tensor,
    *,
    ratio: float | None = None,
    threshold: float | None = None,
    min_tokens: int | None = None,
    importance: torch.Tensor | None = None,
) -> CompressionResult:
    """Drop tokens that repeat the same patch of the previous frame.

    Threshold mode (the published rule): drop when the cosine exceeds `threshold`; if that
    leaves fewer than the floor (`min_tokens`), the least redundant dropped tokens come back.
    Fixed ratio: keep exactly `max(1, floor(N / ratio))`: every token without a predecessor
    (the first frame, patches new to their frame) plus the least redundant others; when the
    budget is below the count of predecessor-less tokens, an even stride of those is kept and
    each of the others is assigned to its most similar kept token. `importance` is ignored.
    """
    budget = prepare(
        NAME,
        features,
        coords,
        ratio=ratio,
        threshold=threshold,
        min_tokens=min_tokens,
        adaptive=True,
    )
    n = features.shape[0]
    frames = frames_of(coords)
    pred = _predecessors(coords, frames.members)
    has_pred = pred >= 0
    e = normalized(features)
    cos = torch.full((n,), float("-inf"), device=features.device)
    cos[has_pred] = (e[has_pred] * e[pred[has_pred]]).sum(dim=-1)

    kept_mask = ~has_pred
    predless = torch.nonzero(~has_pred).squeeze(1)
    candidates = torch.nonzero(has_pred).squeeze(1)
    if budget.threshold is not None:
        kept_mask = kept_mask | (has_pred & (cos <= budget.threshold))
        missing = budget.floor - int(kept_mask.sum())
        if missing > 0:
            dropped = torch.nonzero(~kept_mask).squeeze(1)
            kept_mask[dropped[top_indices(cos[dropped], missing, largest=False)]] = True
    elif budget.floor >= predless.numel():
        extra = budget.floor - predless.numel()
        kept_mask[candidates[top_indices(cos[candidates], extra, largest=False)]] = True
    else:
        kept_mask = torch.zeros(n, dtype=torch.bool, device=features.device)
        stride = torch.linspace(0, predless.numel() - 1, budget.floor, device=features.device)
        kept_mask[predless[stride.round().long()]] = True

    kept = torch.nonzero(kept_mask).squeeze(1)
    representative = torch.arange(n, device=features.device)
    orphans = predless[~kept_mask[predless]]
    if orphans.numel():
        representative[orphans] = kept[most_similar(e[orphans], e[kept])]
    for members in frames.members[1:]:
        follow = members[has_pred[members] & ~kept_mask[members]]
        representative[follow] = representative[pred[follow]]

    info = {
        "settings": {"threshold": budget.threshold, "compare": "same (h, w), previous frame"},
        "importance": None,
    }
    return finish(NAME, features, coords, kept, representative, info=info)
