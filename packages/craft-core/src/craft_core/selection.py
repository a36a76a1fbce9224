"""Training-free selection of CRAFT: which tokens merge (steps 1-7 of algorithm.md).

Pure functions on tensors, no learnable state, run under `torch.no_grad()`:

    E = l2_normalize(X @ W_rand)            # similarity space, [N, d_sim], on an exact grid
    p(i) = argmax_{j in A, j != i} E_i.E_j   # pairing, blockwise: never an N x N matrix
    edges = rank_edges(...)                 # budget, orientation, chains, one target per source

**Exact similarities** (`keys.py`): every quantity selection compares is computed exactly,
so it is the same bits on every path.

The selection (`rank_edges`) has fixed shapes and no host synchronisation (the pairing is
`certify.py`'s; the plain one every pairing is tested against is `algorithm.pair`): the
only data-dependent sizes of a round (edges, targets, lone targets) reach the host in one
transfer, after which `lay_out` only slices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from craft_core.algorithm import orient
from craft_core.algorithm import room as round_room
from craft_core.keys import grid_projection as grid_projection  # re-exported
from craft_core.keys import make_projection as make_projection  # re-exported
from craft_core.keys import row_keys as row_keys  # re-exported
from craft_core.merge import GroupLayout


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
