"""Training-free selection of CRAFT: which tokens merge (steps 1-7 of algorithm.md).

Pure functions on tensors, no learnable state, run under `torch.no_grad()`:

    E = l2_normalize(X @ W_rand)            # similarity space, [N, d_sim], on an exact grid
    p(i) = argmax_{j in A, j != i} E_i.E_j   # pairing, blockwise: never an N x N matrix
    edges = select_edges(...)               # budget, orientation, chains, one target per source

**Exact similarities.** Exact duplicate tokens are common in video, so mathematically equal
similarities are common, and a floating-point dot product rounds them differently on every
path (matmul vs dot, block shape, AVX2 vs AVX-512, CPU vs CUDA). Here every quantity that
selection compares is computed EXACTLY, so it is the same bits on every path:

- a feature row is rounded to `X_BITS` significant bits of its largest entry, and W_rand to a
  grid of `2^-W_BITS`; their product is then a sum of integers below 2^53, exact in float64
  whatever the summation order;
- that projection is rounded to `P_BITS` bits of its largest entry, so its squared norm is
  exact too, and the normalisation is one correctly rounded `sqrt` and one division;
- E is rounded to the grid `2^-E_BITS`, so `E_i . E_j` is a multiple of `2^-46` below 2^53
  in magnitude: exact in float64 in any order (`torch.mm`, a dot product, cuBLAS).
- the orientation's row norms are squared norms of the row rounded to `NORM_BITS` bits of its
  largest entry: exact sums of integers.

Only IEEE operations that are correctly rounded (scaling by powers of two, `round`, `sqrt`,
division) or exact take part, so `kept_index`, `assignment` and `rounds` are a pure function
of (rows, coords, config, budget). The grids are far finer than the rounding of float32 rows.

The full pairing (`full_partners`) and the selection (`select_edges`) have fixed shapes and no
host synchronisation: the only data-dependent sizes of a round (edges, targets, lone targets)
reach the host in one transfer at the end of `select_edges`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from craft_core.merge import GroupLayout

X_BITS = 23
"""Significant bits kept of each feature, relative to its row's largest entry."""
W_BITS = 16
"""W_rand is rounded to multiples of 2^-W_BITS (its entries lie in [-1, 1])."""
P_BITS = 22
"""Significant bits kept of each projected row before normalisation (d_sim <= 512)."""
E_BITS = 23
"""E is rounded to multiples of 2^-E_BITS: similarities are multiples of 2^-46."""
NORM_BITS = 19
"""Significant bits of each row kept for its exact squared norm (D <= 2^15)."""


def make_projection(hidden_size: int, sim_dim: int, seed: int) -> torch.Tensor:
    """W_rand `[D, d_sim]`: standard normal from a seeded CPU generator, unit-norm columns.

    The CPU generator makes the matrix identical on every machine and device.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    weight = torch.randn(hidden_size, sim_dim, generator=generator, dtype=torch.float32)
    return weight / weight.norm(dim=0, keepdim=True)


def grid_projection(projection: torch.Tensor) -> torch.Tensor:
    """W_rand as integers `round(W * 2^W_BITS)` in float64, `[D, d_sim]` (exact, any device)."""
    return torch.round(projection.double() * 2.0**W_BITS)


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """`2^e` as float64, built from its bits (exact: no `pow` or `exp2` library call)."""
    return torch.bitwise_left_shift(exponent + 1023, 52).view(torch.float64)


def _row_scale(rows: torch.Tensor, bits: int) -> torch.Tensor:
    """`[n, 1]` power of two that brings each row's largest |entry| into [2^(bits-1), 2^bits)."""
    top = rows.abs().amax(dim=1, keepdim=True)
    exponent = torch.bitwise_right_shift(top.view(torch.int64), 52) - 1023  # floor(log2 top)
    # An all-zero row has no exponent; any scale keeps it zero.
    return _pow2((bits - 1 - exponent).clamp(-1000, 1000))


def similarity_embedding(
    features: torch.Tensor, projection: torch.Tensor, block: int = 4096
) -> torch.Tensor:
    """E = l2_normalize(X @ W_rand), computed exactly and rounded to the grid 2^-E_BITS.

    Args:
        features: `[n, D]` rows (any float dtype).
        projection: `[D, d_sim]` W_rand (float32) or its `grid_projection` (float64).
        block: rows per step (bounds the float64 copies to `block x D`).

    Returns:
        `[n, d_sim]` float64; an all-zero row gives a zero embedding.
    """
    weight = projection if projection.dtype == torch.float64 else grid_projection(projection)
    out = []
    for start in range(0, features.shape[0], block):
        rows = features[start : start + block].detach().double()
        rows = torch.round(rows * _row_scale(rows, X_BITS))
        projected = rows @ weight  # integers below 2^53: exact in any order
        projected = torch.round(projected * _row_scale(projected, P_BITS))
        norm = (projected * projected).sum(dim=1, keepdim=True).sqrt()  # exact sum
        unit = torch.where(norm > 0, projected / norm, torch.zeros_like(projected))
        out.append(torch.round(unit * 2.0**E_BITS) * 2.0**-E_BITS)
    if not out:
        return torch.zeros(0, weight.shape[1], dtype=torch.float64, device=weight.device)
    return torch.cat(out) if len(out) > 1 else out[0]


def exact_square_norms(rows: torch.Tensor) -> torch.Tensor:
    """`[n, D] -> [n]` float64: squared L2 norm of each row rounded to NORM_BITS bits of its
    largest entry; exact (a sum of integers below 2^53), so ties compare equal on every path."""
    rows = rows.detach().double()
    scale = _row_scale(rows, NORM_BITS)
    grid = torch.round(rows * scale)
    return (grid * grid).sum(dim=1) / (scale.squeeze(1) * scale.squeeze(1))


def full_partners(embed: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1 for every row of a compact active set: its most similar other row.

    Args:
        embed: `[n, d]` exact embeddings of the active tokens, in ascending original index.
        block: rows per block; extra memory is `block x n` float64 values.

    Returns:
        `(similarity [n] float64, partner [n] long)`: `partner` is a POSITION in `embed`.
        Ties go to the smallest position (`max` returns the first maximum), i.e. the
        smallest original index. A lone row gets `-inf`.
    """
    n = embed.shape[0]
    best_sim = torch.empty(n, dtype=torch.float64, device=embed.device)
    best_pos = torch.empty(n, dtype=torch.long, device=embed.device)
    for start in range(0, n, block):
        sims = embed[start : start + block] @ embed.T
        sims.diagonal(offset=start).fill_(float("-inf"))  # a row's own column never wins
        torch.max(sims, dim=1, out=(best_sim[start : start + block], best_pos[start : start + block]))
    return best_sim, best_pos


@dataclass
class RoundPlan:
    """The surviving edges of one round, laid out for `GatedMerge` (lone targets first).

    Attributes:
        targets: `[E]` original index of each edge's target (representative).
        sources: `[E]` original index of each edge's source; each once, never a target.
        similarity: `[E]` float64 exact selection similarity `s_ti`.
        layout: `GroupLayout` of the edges (their order is already the layout's).
    """

    targets: torch.Tensor
    sources: torch.Tensor
    similarity: torch.Tensor
    layout: GroupLayout


def select_edges(
    active_ids: torch.Tensor,
    partner: torch.Tensor,
    partner_sim: torch.Tensor,
    square_norms: torch.Tensor,
    floor: int,
    threshold: float | None,
) -> RoundPlan | None:
    """Steps 2-7 of one round on fixed-shape masks, then ONE host transfer of the sizes.

    Args:
        active_ids: `[n]` ascending original indices of the active tokens.
        partner: `[n]` best partner (original index) of each active token.
        partner_sim: `[n]` float64 its exact similarity `s*_i`.
        square_norms: `[N]` exact squared norm of every token's current row.
        floor: fewest tokens allowed to remain.
        threshold: `s_theta` in threshold mode, None in fixed-ratio mode.

    Returns:
        The round's edges, or None when no edge survives (no candidate, or k <= 0).
    """
    n, size, device = active_ids.numel(), square_norms.numel(), active_ids.device
    budget = min(n - floor, n // 2)
    if budget <= 0:
        return None
    # 2-4. Candidates, k, truncation: the k best s*_i, ties to the smaller i (stable sort).
    candidate = (
        torch.ones(n, dtype=torch.bool, device=device)
        if threshold is None
        else partner_sim >= threshold
    )
    ranked = torch.where(candidate, partner_sim, float("-inf"))
    order = torch.sort(ranked, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(n, device=device))
    chosen = candidate & (rank < torch.clamp(candidate.sum(), max=budget))

    # 5. Orientation: the larger current norm is the target; equal norms: the smaller index.
    first, second = active_ids, partner
    norm_first, norm_second = square_norms[first], square_norms[second]
    first_is_target = (norm_first > norm_second) | ((norm_first == norm_second) & (first < second))
    targets = torch.where(first_is_target, first, second)
    sources = torch.where(first_is_target, second, first)
    # A mutual pair (i -> j and j -> i, equal exact similarity) is one edge: keep the copy
    # that starts at its target.
    at = torch.searchsorted(active_ids, second)
    mutual = chosen[at] & (partner[at] == first)
    keep = chosen & ~(mutual & ~first_is_target)

    # 6. Chain prevention: a token that is any edge's target drops the edges where it is a source.
    sink = torch.full_like(targets, size)  # masked edges write into a spare slot
    is_target = torch.zeros(size + 1, dtype=torch.bool, device=device)
    is_target.scatter_(0, torch.where(keep, targets, sink), True)
    keep = keep & ~is_target[sources]

    # 7. One target per source: highest similarity, then smallest target index.
    slot = torch.where(keep, sources, sink)
    best = torch.full((size + 1,), float("-inf"), dtype=torch.float64, device=device)
    best = best.scatter_reduce(0, slot, torch.where(keep, partner_sim, float("-inf")), "amax")
    keep = keep & (partner_sim == best[sources])
    slot = torch.where(keep, sources, sink)
    lowest = torch.full((size + 1,), size, dtype=torch.long, device=device)
    lowest = lowest.scatter_reduce(0, slot, torch.where(keep, targets, sink), "amin")
    keep = keep & (targets == lowest[sources])
    return _lay_out(keep, targets, sources, partner_sim, size)


def _lay_out(
    keep: torch.Tensor,
    targets: torch.Tensor,
    sources: torch.Tensor,
    similarity: torch.Tensor,
    size: int,
) -> RoundPlan | None:
    """Group the kept edges (`keep [n]` mask) by target, lone targets first, for GatedMerge."""
    n, device = keep.numel(), keep.device
    # Kept edges first, grouped by ascending target (stable: then by position).
    key = torch.where(keep, targets, size)
    order = torch.sort(key, stable=True).indices
    sorted_key = key[order]
    starts = torch.ones(n, dtype=torch.bool, device=device)
    starts[1:] = sorted_key[1:] != sorted_key[:-1]
    group = torch.cumsum(starts, 0) - 1  # group of each sorted edge (masked ones last)
    count = torch.zeros(n, dtype=torch.long, device=device)
    count.scatter_add_(0, group, torch.ones_like(group))
    real = torch.arange(n, device=device) < (starts & (sorted_key < size)).sum()
    lone_group = (count == 1) & real
    sizes = torch.stack([keep.sum(), real.sum(), lone_group.sum()]).tolist()  # the one sync
    num_edges, num_targets, num_lone = sizes
    if num_edges == 0:
        return None
    # Rows: lone groups first, then shared ones, each in ascending target order.
    row_order = torch.sort((~lone_group[:num_targets]).to(torch.uint8), stable=True).indices
    row_of = torch.empty_like(row_order).scatter_(
        0, row_order, torch.arange(num_targets, device=device)
    )
    edge_row = row_of[group[:num_edges]]
    edge_order = torch.sort(edge_row, stable=True).indices
    edges = order[:num_edges][edge_order]
    group_target = torch.empty(num_targets, dtype=torch.long, device=device)
    group_target.scatter_(0, group[:num_edges], sorted_key[:num_edges])
    layout = GroupLayout(
        order=torch.arange(num_edges, device=device),
        targets=group_target[row_order],
        group=edge_row[edge_order],
        lone=num_lone,
    )
    return RoundPlan(targets[edges], sources[edges], similarity[edges], layout)
