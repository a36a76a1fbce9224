"""Training-free selection of CRAFT: which tokens merge (steps 1-7 of algorithm.md).

Pure functions on tensors, no learnable state, run under `torch.no_grad()`:

    E = l2_normalize(X @ W_rand)            # similarity space, [N, d_sim], on an exact grid
    p(i) = argmax_{j in A, j != i} E_i.E_j   # pairing, blockwise: never an N x N matrix
    edges = rank_edges(...)                 # budget, orientation, chains, one target per source

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

The full pairing (`full_partners`) and the selection (`rank_edges`) have fixed shapes and no
host synchronisation: the only data-dependent sizes of a round (edges, targets, lone targets)
reach the host in one transfer, after which `lay_out` only slices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from craft_core.algorithm import orient
from craft_core.algorithm import room as round_room
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
    """W_rand `[D, d_sim]`: seeded random entries with unit-norm columns, float32.

    Each entry is a sum of four uniform integers in [-4096, 4096) (Irwin-Hall: close to a
    normal, zero mean), drawn with a seeded CPU generator, and each column is divided by its
    norm computed exactly (a sum of integers below 2^53, one correctly rounded sqrt). No
    transcendental function is involved (`torch.randn` uses vectorised log/cos whose last bit
    depends on the CPU's instruction set), so the matrix is the same bits on every machine.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    draws = torch.randint(-4096, 4096, (4, hidden_size, sim_dim), generator=generator)
    weight = draws.sum(dim=0).double()
    norms = (weight * weight).sum(dim=0, keepdim=True).sqrt()
    return (weight / norms).float()


def grid_projection(projection: torch.Tensor) -> torch.Tensor:
    """W_rand as integers `round(W * 2^W_BITS)` in float64, `[D, d_sim]` (exact, any device)."""
    return torch.round(projection.double() * 2.0**W_BITS)


def _row_scale(top: torch.Tensor, bits: int) -> torch.Tensor:
    """`[n, 1]` float64 power of two that brings `top` (each row's largest |entry|, `[n, 1]`
    float64) into [2^(bits-1), 2^bits), built from the exponent bits (exact; no `pow` or
    `exp2` call)."""
    # top = m * 2^e has exponent field f = e + 1023; 2^(bits - 1 - e) has field
    # bits + 2045 - f. The clamp keeps an all-zero row's scale finite (it stays zero).
    field = torch.bitwise_right_shift(top.view(torch.int64), 52).clamp_(min=bits)
    return torch.bitwise_left_shift(bits + 2045 - field, 52).view(torch.float64)


def row_keys(
    features: torch.Tensor, weight: torch.Tensor, block: int = 4096
) -> tuple[torch.Tensor, torch.Tensor]:
    """Everything selection reads of some rows, computed exactly (see the module docstring).

    Args:
        features: `[n, D]` rows (any float dtype).
        weight: `[D, d_sim]` `grid_projection(W_rand)`.
        block: rows per step (bounds the float64 copies to `block x D`).

    Returns:
        `(E [n, d_sim] float64 on the grid 2^-E_BITS, squared norms [n] float64)`; an
        all-zero row gives a zero embedding.
    """
    embeds, norms = [], []
    for start in range(0, features.shape[0], block):
        # Read in the input dtype (no float64 copy): the row maximum is exact in any dtype,
        # and the product with a float64 power of two promotes to float64, exactly.
        rows = features[start : start + block].detach()
        low, high = torch.aminmax(rows, dim=1, keepdim=True)  # one read, no |rows| temporary
        scale = _row_scale(torch.maximum(high, -low).double(), X_BITS)
        scaled = rows * scale  # float64, exact: a power of two
        # The norm's grid is 2^(NORM_BITS - X_BITS) coarser: one more exact scaling.
        grid = torch.mul(scaled, 2.0 ** (NORM_BITS - X_BITS)).round_()
        # Row-wise dot products of integers below 2^53: exact in any order.
        square = torch.einsum("nd,nd->n", grid, grid)
        norms.append(square * 2.0 ** (2 * (X_BITS - NORM_BITS)) / (scale * scale).squeeze(1))
        projected = scaled.round_() @ weight  # integers below 2^53: exact
        top = projected.abs().amax(dim=1, keepdim=True)
        projected = torch.round(projected * _row_scale(top, P_BITS))
        norm = torch.einsum("nd,nd->n", projected, projected).sqrt().unsqueeze(1)  # exact sum
        # A nonzero integer vector has norm >= 1, so the clamp only spares zero rows 0/0.
        embeds.append(torch.round(projected / norm.clamp(min=1.0) * 2.0**E_BITS) * 2.0**-E_BITS)
    if len(embeds) == 1:
        return embeds[0], norms[0]
    if not embeds:
        empty = torch.zeros(0, dtype=torch.float64, device=weight.device)
        return empty.reshape(0, weight.shape[1]), empty
    return torch.cat(embeds), torch.cat(norms)


def similarity_embedding(
    features: torch.Tensor, projection: torch.Tensor, block: int = 4096
) -> torch.Tensor:
    """E = l2_normalize(X @ W_rand), exact, on the grid 2^-E_BITS: `[n, D] -> [n, d_sim]`.

    `projection` is W_rand (float32) or its `grid_projection` (float64).
    """
    weight = projection if projection.dtype == torch.float64 else grid_projection(projection)
    return row_keys(features, weight, block)[0]


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
        torch.max(
            sims, dim=1, out=(best_sim[start : start + block], best_pos[start : start + block])
        )
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


@dataclass
class RankedEdges:
    """A round's candidate edges in layout order, fixed shapes: `m = min(n - floor, n // 2)`.

    Kept edges come first (lone targets, then shared targets' edges contiguous), masked
    edges last; `sizes` says how many of each, and is what the round reads on the host.

    Attributes:
        targets, sources, similarity: `[m]` each edge's target, source, exact similarity.
        group: `[m]` target row of each edge (kept edges only are meaningful).
        row_target: `[m]` target id of each target row (the first `num_targets`).
        sizes: `[3]` long: kept edges, targets, lone targets (plus extra counts appended).
    """

    targets: torch.Tensor
    sources: torch.Tensor
    similarity: torch.Tensor
    group: torch.Tensor
    row_target: torch.Tensor
    sizes: torch.Tensor


def rank_edges(
    active_ids: torch.Tensor,
    partner: torch.Tensor,
    partner_sim: torch.Tensor,
    square_norms: torch.Tensor,
    floor: int,
    threshold: float | torch.Tensor | None,
    room: torch.Tensor | None = None,
) -> RankedEdges | None:
    """Steps 2-7 of one round on fixed-shape masks, and the layout, with no host sync.

    Args:
        active_ids: `[n]` ascending original indices of the active tokens.
        partner: `[n]` best partner (original index) of each active token.
        partner_sim: `[n]` float64 its exact similarity `s*_i`.
        square_norms: `[N]` exact squared norm of every token's current row.
        floor: fewest tokens allowed to remain.
        threshold: `s_theta` in threshold mode (a float or a 0-d tensor), None in
            fixed-ratio mode.
        room: the compiled loop's padded rounds: the budget as a 0-d long tensor, for
            `n` padded rows whose padding has `partner_sim` -inf (`floor` is then unused
            and the edges are `n // 2` slots, those past `room` masked).

    Returns:
        The round's ranked edges, or None when the budget allows none (k <= 0).
    """
    n, size = active_ids.numel(), square_norms.numel()
    budget = round_room(n, floor) if room is None else n // 2
    if budget <= 0:
        return None
    # 2-4. Candidates, k, truncation: the best s*_i first, ties to the smaller i (stable
    # sort); the first `budget` of them, less any that are no candidate (threshold mode).
    ranked = partner_sim
    if threshold is not None:
        ranked = partner_sim.masked_fill(partner_sim < threshold, float("-inf"))
    ranked, pos = torch.sort(ranked, descending=True, stable=True)
    pos = pos[:budget]
    first, second, sim = active_ids[pos], partner[pos], partner_sim[pos]
    keep = ranked[:budget] > float("-inf")  # all True in fixed-ratio mode (n >= 2)
    if room is not None:
        keep = keep & (torch.arange(budget, device=keep.device) < room)

    # 5. Orientation: the larger current norm is the target; equal norms: the smaller index.
    targets, sources = orient(first, second, square_norms)
    first_is_target = targets == first

    # 6. Chain prevention: a token that is any edge's target drops the edges where it is a
    # source. Masked edges write into the spare slot `size`.
    not_target = torch.ones(size + 1, dtype=torch.bool, device=keep.device)
    not_target.index_put_((torch.where(keep, targets, size),), ~keep)
    keep = keep & not_target[sources]

    # 7. One target per source.
    keep = _one_target_per_source(keep, targets, sources, sim, first_is_target, size)
    return _rank_layout(keep, targets, sources, sim, size)


def _one_target_per_source(
    keep: torch.Tensor,
    targets: torch.Tensor,
    sources: torch.Tensor,
    sim: torch.Tensor,
    first_is_target: torch.Tensor,
    size: int,
) -> torch.Tensor:
    """Step 7 on `[m]` edges sorted by similarity: the `keep` mask, each source's best edge
    only (highest similarity, then smallest target index)."""
    # The two copies of a mutual pair (i -> j and j -> i: same target, source and
    # similarity) are one edge: the copy that starts at its target wins. One integer key
    # orders all three: the rank of the similarity among the distinct values (edges are
    # sorted by it), the target, and the copy.
    sim_rank = torch.nn.functional.pad(torch.cumsum(sim[1:] != sim[:-1], 0), (1, 0))
    key = (sim_rank * (size + 1) + targets) * 2 + (~first_is_target)
    slot = torch.where(keep, sources, size)
    lowest = torch.full((size + 1,), torch.iinfo(torch.long).max, device=keep.device)
    return keep & (key == lowest.scatter_reduce_(0, slot, key, "amin")[sources])


def _rank_layout(
    keep: torch.Tensor,
    targets: torch.Tensor,
    sources: torch.Tensor,
    similarity: torch.Tensor,
    size: int,
) -> RankedEdges:
    """Group the kept edges (`keep [m]` mask) by target, lone targets first, fixed shapes."""
    # Edges per target (masked edges count into the spare slot `size`, with weight 0).
    count = torch.zeros(size + 1, dtype=torch.long, device=keep.device)
    count.scatter_add_(0, torch.where(keep, targets, size), keep.long())
    shared = count[targets] > 1
    # One stable sort: kept edges of lone targets (ascending target), then those of shared
    # targets (ascending target, then by rank), then the masked edges (one group, last).
    key = torch.where(keep, targets + shared * (size + 1), 2 * size + 2)
    sorted_key, order = torch.sort(key, stable=True)
    group = torch.nn.functional.pad(torch.cumsum(sorted_key[1:] != sorted_key[:-1], 0), (1, 0))
    edge_target = targets[order]
    # Edges of one target write the same id; the masked edges' row lies past every target's.
    row_target = torch.empty_like(edge_target).scatter_(0, group, edge_target)
    sizes = torch.stack([keep.sum(), (count[:size] > 0).sum(), (count[:size] == 1).sum()])
    return RankedEdges(edge_target, sources[order], similarity[order], group, row_target, sizes)


def lay_out(edges: RankedEdges, num_edges: int, num_targets: int, num_lone: int) -> RoundPlan:
    """The kept edges of `edges` for GatedMerge, given its `sizes` read on the host."""
    layout = GroupLayout(
        order=torch.arange(num_edges, device=edges.targets.device),
        targets=edges.row_target[:num_targets],
        group=edges.group[:num_edges],
        lone=num_lone,
    )
    return RoundPlan(
        edges.targets[:num_edges], edges.sources[:num_edges], edges.similarity[:num_edges], layout
    )
