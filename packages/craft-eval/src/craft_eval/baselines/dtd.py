"""DTD: TimeChat-Online's differential token dropping (the feature variant).

Yao et al., "TimeChat-Online: 80% Visual Tokens are Naturally Redundant in Streaming Videos",
2025. Re-stated from github.com/yaolinli/TimeChat-Online,
`eval/qwen2_5_vl/modeling_qwen2_5_vl_DTD.py`, `token_drop`, lines 1313-1350 (commit 25a1578):
frame by frame, each token's cosine with the token at the same place in the PREVIOUS frame
(the previous frame's own tokens, dropped or not) is computed; the first frame stays whole.

- absolute mode (`threshold=`): drop every token whose cosine exceeds the threshold;
- relative mode (`ratio=` here): each later frame drops its `k_f` most similar tokens
  (published: `k = int(n_f * fraction)`, the same in every later frame).

The budget is exact: `max(1, floor(N / ratio))` tokens are kept, the first frame whole and
the rest split over the later frames in proportion to their sizes (equal frames: equal
shares, the remainder to the earlier frames). Equal cosines (common in near-static video,
float32 rounds them together) drop the smaller index first; the published `topk` leaves
that order unspecified. Deliberate deviations (docs/baselines.md): when
the budget is below the first frame's size (ratio > T) the published mode cannot reach it;
then every frame keeps its share of the budget, the first frame an even stride of its
tokens; a threshold-mode floor applies only when `min_tokens` is given (the least redundant
dropped tokens come back). A dropped token is assigned to where its predecessor ended up.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from craft_core import CompressionResult
from craft_eval.baselines._common import (
    Checked,
    apportion,
    baseline,
    finish,
    frames_of,
    most_similar,
    normalized,
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


def _fixed_ratio_keep(
    members: list[torch.Tensor], cos: torch.Tensor, k: int, n: int
) -> torch.Tensor:
    """`[N]` bool: the first frame whole and each later frame's least redundant share."""
    kept = torch.zeros(n, dtype=torch.bool, device=cos.device)
    sizes = [int(m.numel()) for m in members]
    if k >= sizes[0]:
        shares = [sizes[0], *apportion(k - sizes[0], sizes[1:], sizes[1:])]
    else:  # below one frame: every frame its share, the first an even stride
        shares = apportion(k, sizes, sizes)
        first = members[0]
        if shares[0] > 0:
            stride = torch.linspace(0, first.numel() - 1, shares[0], device=cos.device)
            kept[first[stride.round().long()]] = True
    for f, (m, share) in enumerate(zip(members, shares)):
        if f == 0 and k < sizes[0]:
            continue
        kept[m] = True  # drop the most redundant; equal cosines: the smaller index first
        kept[m[top_indices(cos[m], m.numel() - share)]] = False
    return kept


@baseline(
    NAME,
    kind="prune",
    saliency="token features (cosine with the same patch of the previous frame)",
    description="TimeChat-Online DTD: drop tokens too similar to the same patch of the "
    "previous frame (threshold=, or ratio= drops each later frame's most redundant).",
    adaptive=True,
)
def dtd(
    features: torch.Tensor, coords: torch.Tensor, budget: Checked, importance: torch.Tensor | None
) -> CompressionResult:
    """Drop tokens that repeat the same patch of the previous frame.

    Args:
        features: `[N, D]` one video's tokens; coords: `[N, 3]` `(t, h, w)`.
        threshold: absolute mode, drop where the cosine exceeds it (published rule).
        min_tokens: threshold mode only: if given, the least redundant dropped tokens come
            back until this many are kept. No floor without it (as published).
        ratio: keep exactly `max(1, floor(N / ratio))` (see the module docstring).
        importance: ignored.

    A token with no predecessor (first frame, a patch new to its frame) counts as cosine
    `-inf`: never dropped before the others.
    """
    n = features.shape[0]
    frames = frames_of(coords)
    pred = _predecessors(coords, frames.members)
    has_pred = pred >= 0
    e = normalized(features)
    x = features.float()
    cos = torch.full((n,), float("-inf"), device=features.device)
    cos[has_pred] = F.cosine_similarity(x[pred[has_pred]], x[has_pred], dim=-1)  # as published

    if budget.threshold is not None:
        kept_mask = ~has_pred | (cos <= budget.threshold)
        missing = (0 if budget.given.min_tokens is None else budget.floor) - int(kept_mask.sum())
        if missing > 0:
            dropped = torch.nonzero(~kept_mask).squeeze(1)
            kept_mask[dropped[top_indices(cos[dropped], missing, largest=False)]] = True
    else:
        kept_mask = _fixed_ratio_keep(frames.members, cos, budget.floor, n)

    kept = torch.nonzero(kept_mask).squeeze(1)
    representative = torch.arange(n, device=features.device)
    orphans = torch.nonzero(~has_pred & ~kept_mask).squeeze(1)
    if orphans.numel():
        representative[orphans] = kept[most_similar(e[orphans], e[kept])]
    for members in frames.members[1:]:
        follow = members[has_pred[members] & ~kept_mask[members]]
        representative[follow] = representative[pred[follow]]

    info = {
        "settings": {
            "mode": "threshold" if budget.threshold is not None else "ratio",
            "threshold": budget.threshold,
            "compare": "same (h, w), previous frame",
        },
        "importance": None,
    }
    return finish(NAME, features, coords, kept, representative, info=info)
