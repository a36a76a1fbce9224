"""CRAFT's round, written once, plainly: the reference every runner is tested against.

    from craft_core.algorithm import compress
    kept, owner, rows, rounds = compress(compressor, features, coords, budget)

One round (`docs/algorithm.md`), top to bottom:

1. `pair`: every active token's most similar other active token (exact similarities of the
   exact embeddings `selection.row_keys`; ties to the smaller index).
2. `select`: candidates ranked by similarity, the first `room` of them (`room`), those below
   the threshold dropped; each edge `orient`-ed (the larger current norm is the target);
   a token that is any kept edge's target is no edge's source (no chains); one target per
   source (its best edge).
3. `merge.fuse` (through `GatedMerge.forward`): each target fuses with its sources.
4. `retire`: sources hand their tokens to their targets and leave the active set.
5. Stop when `room` is 0 or a round selects nothing.

The formulas that the fast runners share live here (`room`, `orient`, `retire`) or in
`merge.fuse`; the runners' own code (fixed-shape masks, incremental pairing, padded rounds)
is tested equal to `compress`, tokens and rows bit for bit (`tests/test_algorithm.py`).
This loop recomputes every embedding and every similarity each round: slow, obvious, exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from craft_core.budget import Budget
    from craft_core.compressor import CraftCompressor


def room(active: int, floor: int) -> int:
    """Edges a round may keep: at most half the active tokens, never below the floor. The
    loop stops when it is 0 (the stop test)."""
    return min(active - floor, active // 2)


def orient(
    first: torch.Tensor, second: torch.Tensor, square_norms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(targets, sources)` of edges `first -- second` (`[E]` ids): the larger current squared
    norm (`square_norms [N]`) is the target; equal norms: the smaller index."""
    norm_first, norm_second = square_norms[first], square_norms[second]
    first_is_target = torch.where(
        norm_first == norm_second, first < second, norm_first > norm_second
    )
    return torch.where(first_is_target, first, second), torch.where(first_is_target, second, first)


def retire(
    owner: torch.Tensor,
    active: torch.Tensor,
    sources: torch.Tensor,
    targets: torch.Tensor,
    gone: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sources hand their tokens to their targets (targets are never sources) and leave.

    Args:
        owner: `[S]` the token each input token belongs to (`S >= N`: padded tables too).
        active: `[B]` active ids, ascending (padding, if any, holds `gone`).
        sources, targets: `[E]` each edge's source and target (padding edges: `gone` twice).
        gone: an id past every real one, which leaving ids become.

    Returns:
        `(owner [S], active [B])`: owners redirected; `active` ascending with the sources
        pushed to the end as `gone` (a caller cuts them off, or keeps them as padding).
    """
    redirect = torch.arange(owner.numel(), device=owner.device).index_put((sources,), targets)
    leaving = redirect[active] != active
    return redirect[owner], torch.sort(active.masked_fill(leaving, gone)).values


def pair(embed: torch.Tensor, block: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """`(similarity [n] float64, partner [n] position)` of every row of `embed` (`[n, d]`
    float64 exact embeddings, ascending ids): its most similar other row, ties to the
    smallest position. The `[n, n]` product, `block` rows at a time (65,536 tokens would
    need 32 GiB at once); every value is exact (`selection.py`), so a block's rows are the
    whole product's."""
    values, partners = [], []
    for start in range(0, embed.shape[0], block):
        sims = embed[start : start + block] @ embed.T
        rows = torch.arange(sims.shape[0], device=embed.device)
        sims[rows, start + rows] = float("-inf")  # not its own partner
        value, partner = sims.max(dim=1)  # max returns the first maximum
        values.append(value)
        partners.append(partner)
    return torch.cat(values), torch.cat(partners)


def select(
    active: list[int],
    partner: list[int],
    similarity: list[float],
    square_norms: torch.Tensor,
    floor: int,
    threshold: float | None,
) -> list[tuple[int, int, float]]:
    """A round's edges `(target, source, similarity)`, in rank order (similarity descending,
    then the smaller active position), from each active token's partner."""
    order = sorted(range(len(active)), key=lambda i: -similarity[i])  # stable: ties by i
    if threshold is not None:
        order = [i for i in order if similarity[i] >= threshold]
    ranked = order[: max(0, room(len(active), floor))]
    first = torch.tensor([active[i] for i in ranked], dtype=torch.long)
    second = torch.tensor([partner[i] for i in ranked], dtype=torch.long)
    targets, sources = orient(first, second, square_norms.cpu())
    edges = list(zip(targets.tolist(), sources.tolist(), (similarity[i] for i in ranked)))
    is_target = {t for t, _, _ in edges}
    best: dict[int, tuple[tuple[float, int, bool], int, int, float]] = {}
    for rank, (t, s, sim) in enumerate(edges):
        if s in is_target:
            continue  # no chains: a target is nobody's source
        # One target per source: its best edge (similarity, then the smaller target). The
        # two copies of a mutual pair are one edge; the one ranked from its target counts.
        key = (sim, -t, t == active[ranked[rank]])
        if s not in best or key > best[s][0]:
            best[s] = (key, rank, t, sim)
    kept = sorted((rank, t, s, sim) for s, (_, rank, t, sim) in best.items())
    return [(t, s, sim) for _, t, s, sim in kept]


def compress(
    compressor: CraftCompressor, features: torch.Tensor, coords: torch.Tensor, budget: Budget
) -> tuple[list[int], list[int], torch.Tensor, int]:
    """The whole loop, plainly, with `compressor`'s weights and precision (no autograd).

    Returns `(kept ids ascending, owner [N] of every input token, kept rows [K, D] in the
    input dtype, rounds)`."""
    from craft_core.keys import grid_projection, row_keys
    from craft_core.merge import group_edges

    n = features.shape[0]
    weight = grid_projection(compressor.projection)
    rows = features.detach().float().clone()
    owner = torch.arange(n)
    active = torch.arange(n)
    rounds = 0
    with torch.no_grad():
        while room(active.numel(), budget.floor) > 0:
            embed, square_norms = row_keys(rows, weight)
            similarity, position = pair(embed[active])
            edges = select(
                active.tolist(),
                active[position].tolist(),
                similarity.tolist(),
                square_norms,
                budget.floor,
                budget.threshold,
            )
            if not edges:
                break
            rounds += 1
            targets = torch.tensor([t for t, _, _ in edges], dtype=torch.long)
            sources = torch.tensor([s for _, s, _ in edges], dtype=torch.long)
            sims = torch.tensor([sim for _, _, sim in edges], dtype=torch.float64)
            layout = group_edges(targets)
            sources, sims = sources[layout.order], sims[layout.order]
            rows[layout.targets] = compressor.merge(
                rows[layout.targets],
                rows[sources],
                layout,
                coords[layout.targets],
                coords[sources],
                sims.float(),
                rounds,
                compressor.options.merge_dtype(),
            )
            owner, active = retire(owner, active, sources, layout.targets[layout.group], n)
            active = active[: active.numel() - sources.numel()]
    return active.tolist(), owner.tolist(), rows[active].to(features.dtype), rounds
