"""ToMe (video): bipartite soft matching repeated over all T*HW tokens until the budget.

Bolya et al., "Token Merging: Your ViT But Faster", ICLR 2023. Each step splits the active
tokens (in ascending original index) alternately into sets a (even positions) and b (odd),
lets every a-token pick its most similar b-token (cosine of the current features), and merges
the `r` best edges (at most half the active tokens) by size-weighted mean into their b-token.
A merged token keeps its destination's original position.
"""

from __future__ import annotations

import torch

from craft_core import CompressionResult
from craft_eval.baselines._common import Checked, baseline, finish, identity, normalized

NAME = "tome"


@baseline(
    NAME,
    kind="merge",
    description="ToMe (video): bipartite soft matching over all tokens, size-weighted means.",
)
def tome(
    features: torch.Tensor, coords: torch.Tensor, budget: Checked, importance: torch.Tensor | None
) -> CompressionResult:
    """Merge tokens by repeated bipartite soft matching down to `max(1, floor(N / ratio))`.

    `importance` is accepted for the common interface and ignored (ToMe needs none).
    """
    n = features.shape[0]
    info = {"settings": {"metric": "features (L2-normalised)"}, "importance": None}
    target = budget.floor
    if target >= n:
        return identity(NAME, features, coords, info)

    active = torch.arange(n, device=features.device)  # original index of each active token
    x = features.float()  # current features of the active tokens (size-weighted means)
    size = torch.ones(n, dtype=torch.float32, device=features.device)
    representative = torch.arange(n, device=features.device)
    steps = 0
    while active.numel() > target:
        count = active.numel()
        r = min(count - target, count // 2)
        metric = normalized(x)
        a_pos = torch.arange(0, count, 2, device=features.device)
        b_pos = torch.arange(1, count, 2, device=features.device)
        scores = metric[a_pos] @ metric[b_pos].T
        best, best_b = scores.max(dim=-1)  # first maximum on ties
        edge_order = torch.sort(best, descending=True, stable=True).indices
        src = edge_order[:r]  # positions in a
        dst = best_b[src]  # positions in b
        src_pos, dst_pos = a_pos[src], b_pos[dst]

        weighted = x * size[:, None]
        new_size = size.index_add(0, dst_pos, size[src_pos])
        new_x = weighted.index_add(0, dst_pos, weighted[src_pos]) / new_size[:, None]

        # every token whose representative was a source now points at its destination
        redirect = torch.arange(n, device=features.device)
        redirect[active[src_pos]] = active[dst_pos]
        representative = redirect[representative]

        keep = torch.ones(count, dtype=torch.bool, device=features.device)
        keep[src_pos] = False
        active, x, size = active[keep], new_x[keep], new_size[keep]
        steps += 1

    return finish(NAME, features, coords, active, representative, x, rounds=steps, info=info)
