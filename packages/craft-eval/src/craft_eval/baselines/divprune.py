"""DivPrune: greedy max-min diversity pruning.

Alvar et al., "DivPrune: Diversity-based Visual Token Pruning for Large Multimodal Models",
CVPR 2025. Distance = 1 - cosine. The first pick is the token whose nearest neighbour is
farthest; then, repeatedly, the token whose minimum distance to the picked set is largest.
A pruned token is assigned to its nearest picked token (tracked for free by the greedy loop).
"""

from __future__ import annotations

import torch

from craft_core import CompressionResult
from craft_eval.baselines._common import Checked, baseline, finish, identity, normalized

NAME = "divprune"


@baseline(
    NAME,
    kind="prune",
    description="DivPrune: greedy max-min diversity (1 - cosine) pruning.",
)
def divprune(
    features: torch.Tensor, coords: torch.Tensor, budget: Checked, importance: torch.Tensor | None
) -> CompressionResult:
    """Keep the `max(1, floor(N / ratio))` most mutually diverse tokens (pure pruning).

    Ties go to the smaller index. The published loop can pick a token twice when distances
    tie at zero (e.g. identical tokens); here a picked token is never picked again.
    """
    n = features.shape[0]
    info = {"settings": {"distance": "1 - cosine"}, "importance": None}
    k = budget.floor
    if k >= n:
        return identity(NAME, features, coords, info)

    e = normalized(features)
    dist = 1.0 - e @ e.T  # [N, N], as in the published code
    dist.fill_diagonal_(float("inf"))
    first = int(dist.min(dim=0).values.argmax())  # nearest neighbour farthest away
    dist.fill_diagonal_(0.0)

    picked = torch.empty(k, dtype=torch.long, device=features.device)
    picked[0] = first
    min_dist = dist[first].clone()
    nearest = torch.full((n,), first, dtype=torch.long, device=features.device)
    taken = torch.zeros(n, dtype=torch.bool, device=features.device)
    taken[first] = True
    for step in range(1, k):
        score = min_dist.masked_fill(taken, float("-inf"))
        i = int(score.argmax())
        picked[step] = i
        taken[i] = True
        row = dist[i]
        closer = row < min_dist
        nearest = torch.where(closer, i, nearest)
        min_dist = torch.minimum(min_dist, row)
    nearest[picked] = picked
    return finish(NAME, features, coords, picked, nearest, info=info)
