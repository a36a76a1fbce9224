"""The batched round: many videos advance together through CRAFT's loop, one host sync a round.

    from craft_core.batched import compress_videos
    results = compress_videos(compressor, features, coords, budgets)   # one result a video

Every video's tokens live in ONE flat table (video b holds ids `[offset_b, offset_b + N_b)`,
then one dummy id `Z` that padding points at), and the active sets of all videos are one
padded `[B, M]` matrix of ids, ascending in each row. A round (`algorithm.md`, steps 1-9) is
the same fixed-shape ops for one video or sixteen:

1. **Select** (`select`): every active token's exact partner is kept in the tables; the
   candidates of each video are ranked (a sort along the row), cut to the video's room,
   oriented, chains dropped and one target per source kept, with masks and scatters into the
   flat tables. The round's sizes (edges, targets, rows to re-pair, per video) reach the
   host in ONE transfer: the stop test and every slice after it.
2. **Fuse**: the kept edges of all videos, grouped by target, go through `GatedMerge.fuse_all`
   in one call; the targets' rows and exact keys (`keys.row_keys`) are rewritten.
3. **Retire**: sources hand their tokens to their targets and leave each row of the active
   matrix (one sort pushes them to the padding).
4. **Re-pair exactly, incrementally** (`_repair`): a token whose partner is neither a source
   nor a target of this round keeps it as its best among the unchanged tokens, so only the
   changed targets can beat it (one `[B, M, T]` product); the targets themselves and the
   tokens whose partner left or changed are re-paired against their whole video (one
   `[B, R, M]` product). Every similarity is an exact float64 product of grid values
   (`keys.py`), so the partners are those of a full recompute, ties to the smallest id.

Each video's kept tokens and rows are the same as compressing it alone, whatever else is in
the batch (its rows and columns never meet another video's; tested on the reference cases
shuffled into batches). Videos leave the batch when their budget allows no edge or a round
selects none for them. With autograd (training) the row table is rewritten out of place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from craft_core.algorithm import orient, room
from craft_core.budget import Budget
from craft_core.keys import row_keys
from craft_core.merge import GatedMerge, round_embedding

NEG = float("-inf")
LIST = 6
"""Candidates each token keeps with their exact similarities: when its partner leaves or
changes, the next one listed is its partner if it still beats the bound (no full pass)."""


@dataclass
class Tables:
    """The flat state of a batch of videos (`Z` real tokens, then the dummy id `Z`).

    Attributes:
        rows: `[Z + 1, D]` float32 current rows (the dummy row zero).
        coords: `[Z + 1, 3]` long original (t, h, w).
        embed: `[Z + 1, d]` float64 exact embeddings (`keys.row_keys`; dummy zero).
        norms: `[Z + 1]` float64 exact squared norms of the current rows.
        partner: `[Z + 1]` long each active token's exact best partner (dummy: `Z`).
        partner_sim: `[Z + 1]` float64 its exact similarity (dummy: -inf).
        listed: `[Z + 1, LIST]` long, a few of each token's most similar tokens.
        listed_sim: `[Z + 1, LIST]` float64 their exact similarities (-inf: none).
        bound: `[Z + 1]` float64, at least the exact similarity of every active token of
            the video that is not listed: the partner is sure while the best listed one
            beats it.
        pending: `[Z + 1]` bool, tokens whose partner is not known exactly (re-paired in
            full before the next selection).
        owner: `[Z]` long the token each input token now belongs to.
    """

    rows: torch.Tensor
    coords: torch.Tensor
    embed: torch.Tensor
    norms: torch.Tensor
    partner: torch.Tensor
    partner_sim: torch.Tensor
    listed: torch.Tensor
    listed_sim: torch.Tensor
    bound: torch.Tensor
    pending: torch.Tensor
    owner: torch.Tensor

    @property
    def dummy(self) -> int:
        return self.owner.numel()


class Pairs(NamedTuple):
    """Rows' exact best partner and candidate lists (`exact_candidates`).

    Attributes:
        sim, partner: `[B, R]` float64 and id: the most similar column, ties to the
            smallest id (-inf where no column qualifies).
        listed_sim, listed: `[B, R, LIST]` the `LIST` most similar columns (-inf: none).
        bound: `[B, R]` float64, the similarity of the next one (every other column is at
            most that similar).
    """

    sim: torch.Tensor
    partner: torch.Tensor
    listed_sim: torch.Tensor
    listed: torch.Tensor
    bound: torch.Tensor


def exact_candidates(
    embed: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, dummy: int, block: int
) -> Pairs:
    """Each row's most similar columns of its own video, exactly (`Pairs`).

    Args:
        embed: `[Z + 1, d]` float64 exact embeddings.
        rows: `[B, R]` ids (padding: `dummy`).
        cols: `[B, M]` ids of each row's candidates, ascending (padding: `dummy`, last).
        dummy: the padding id.
        block: rows per product (extra memory `B x block x M` float64).
    """
    # 0 on real columns, -inf on padding: added by the product, exactly (`x + 0 == x`).
    bias = torch.where(cols == dummy, NEG, 0.0).to(embed.dtype).unsqueeze(1)
    keys = embed[cols].transpose(1, 2)  # [B, d, M]
    count = min(LIST + 1, cols.shape[1])
    parts: list[tuple[torch.Tensor, ...]] = []
    for start in range(0, rows.shape[1], block):
        part = rows[:, start : start + block]
        # Grid values: every product and partial sum is exact in float64, in any order.
        scores = torch.baddbmm(bias, embed[part], keys)
        scores.masked_fill_(part.unsqueeze(2) == cols.unsqueeze(1), NEG)  # not its own
        best, position = scores.max(dim=2)  # the first maximum: the smallest id
        top, top_position = scores.topk(count, dim=2)
        top_ids = cols.unsqueeze(1).expand(-1, part.shape[1], -1).gather(2, top_position)
        parts.append((best, cols.gather(1, position), top, top_ids))
    best, partner, top, top_ids = (
        parts[0] if len(parts) == 1 else [torch.cat(p, dim=1) for p in zip(*parts)]
    )
    if count < LIST + 1:  # fewer columns than a list holds
        top = torch.nn.functional.pad(top, (0, LIST + 1 - count), value=NEG)
        top_ids = torch.nn.functional.pad(top_ids, (0, LIST + 1 - count), value=dummy)
    return Pairs(best, partner, top[..., :LIST], top_ids[..., :LIST], top[..., LIST])


@dataclass
class Selection:
    """One round's selection on device, fixed shapes (before its sizes are read).

    Attributes:
        targets, sources, similarity: `[B * K]` each candidate edge's target, source and
            exact similarity, kept edges first, grouped by ascending target.
        group: `[B * K]` the target row of each edge (meaningful for kept edges).
        row_target: `[B * K]` the target id of each target row (the first `T`).
        changed: `[B, M]` ids of each video's targets, ascending, then padding.
        redo: `[B, M]` ids to re-pair in full (targets, and tokens whose list holds no
            sure partner once the round's sources and targets are struck out), ascending,
            then padding.
        leaving: `[Z + 2]` bool, the sources.
        touched: `[Z + 2]` bool, the sources and targets.
        sizes: `[4B + 1]` long: kept edges, targets, ids to re-pair, pending ids per video;
            all targets.
    """

    targets: torch.Tensor
    sources: torch.Tensor
    similarity: torch.Tensor
    group: torch.Tensor
    row_target: torch.Tensor
    changed: torch.Tensor
    redo: torch.Tensor
    leaving: torch.Tensor
    touched: torch.Tensor
    sizes: torch.Tensor


def select(
    tables: Tables, active: torch.Tensor, rooms: torch.Tensor, threshold: float | None
) -> Selection:
    """Steps 2-7 for every video at once (`algorithm.select`), with no host sync.

    `active [B, M]` ids ascending per row (padding `Z` last); `rooms [B]` long, the edges
    each video may keep (`algorithm.room`, 0 for none)."""
    dummy, spare = tables.dummy, tables.dummy + 1
    sim = tables.partner_sim[active]
    if threshold is not None:
        sim = sim.masked_fill(sim < threshold, NEG)
    width = active.shape[1] // 2  # no video keeps more than half its tokens
    ranked, position = torch.sort(sim, dim=1, descending=True, stable=True)
    ranked, position = ranked[:, :width], position[:, :width]
    first = active.gather(1, position)
    second = tables.partner[first]
    slots = torch.arange(width, device=active.device)
    keep = (ranked > NEG) & (slots < rooms.unsqueeze(1))
    targets, sources = orient(first, second, tables.norms)
    # No chains: a token that is any kept edge's target is no edge's source.
    is_target = torch.zeros(spare + 1, dtype=torch.bool, device=active.device)
    is_target.index_put_((torch.where(keep, targets, spare),), keep)
    keep = keep & ~is_target[sources]
    # One target per source: highest similarity, then the smaller target, and of the two
    # copies of a mutual pair the one ranked from its target. One integer key orders all
    # three (the rank of the similarity among the video's distinct values).
    sim_rank = torch.nn.functional.pad(torch.cumsum(ranked[:, 1:] != ranked[:, :-1], 1), (1, 0))
    key = (sim_rank * (spare + 1) + targets) * 2 + (targets != first)
    slot = torch.where(keep, sources, spare)
    lowest = torch.full((spare + 1,), torch.iinfo(torch.long).max, device=active.device)
    lowest.scatter_reduce_(0, slot.flatten(), key.flatten(), "amin")
    keep = keep & (key == lowest[sources])
    # The surviving targets and sources, as flags on the flat table.
    is_target = torch.zeros_like(is_target).index_put_((torch.where(keep, targets, spare),), keep)
    leaving = torch.zeros_like(is_target).index_put_((torch.where(keep, sources, spare),), keep)
    touched = is_target | leaving
    edge_targets, order, group, row_target = _group_by_target(keep, targets, dummy)
    target_here, redo, changed, redo_ids = _to_repair(tables, active, is_target, touched)
    sizes = torch.cat(
        [
            keep.sum(1),
            target_here.sum(1),
            redo.sum(1),
            tables.pending[active].sum(1),
            is_target[:dummy].sum().view(1),
        ]
    )
    return Selection(
        edge_targets,
        sources.flatten()[order],
        ranked.flatten()[order],
        group,
        row_target,
        changed,
        redo_ids,
        leaving,
        touched,
        sizes,
    )


def _to_repair(
    tables: Tables, active: torch.Tensor, is_target: torch.Tensor, touched: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """Ids each video re-pairs in full: its targets (changed rows), and tokens none of whose
    listed candidates that stay unchanged beats the bound (the partner must be searched).

    -> `(target here [B, M], redo [B, M] bool, changed ids [B, M], redo ids [B, M])`, the
    ids ascending then padding."""
    dummy = tables.dummy
    target_here = is_target[active]
    leaving = touched[active] & ~target_here  # a target is never a source
    still = tables.listed_sim[active].masked_fill(touched[tables.listed[active]], NEG)
    redo = (target_here | (still.amax(dim=2) <= tables.bound[active])) & ~leaving
    redo = redo & (active != dummy)
    changed = torch.sort(torch.where(target_here, active, dummy), dim=1).values
    redo_ids = torch.sort(torch.where(redo, active, dummy), dim=1).values
    return target_here, redo, changed, redo_ids


def _group_by_target(
    keep: torch.Tensor, targets: torch.Tensor, dummy: int
) -> tuple[torch.Tensor, ...]:
    """Kept edges first, grouped by ascending target: one sort of the flat edge list.

    `keep`, `targets` `[B, K]` -> `(edge targets [B*K] sorted (masked: dummy), order [B*K],
    group [B*K] target row of each edge, row_target [B*K] target id of each row)`."""
    order_key = torch.where(keep, targets, dummy + 2).flatten()
    sorted_key, order = torch.sort(order_key, stable=True)
    group = torch.nn.functional.pad(torch.cumsum(sorted_key[1:] != sorted_key[:-1], 0), (1, 0))
    edge_targets = sorted_key.clamp(max=dummy)
    row_target = torch.empty_like(edge_targets).scatter_(0, group, edge_targets)
    return edge_targets, order, group, row_target


def start_tables(
    features: list[torch.Tensor], coords: list[torch.Tensor], weight: torch.Tensor, block: int
) -> tuple[Tables, torch.Tensor]:
    """The flat tables of a batch and its `[B, max N]` active matrix, every token paired."""
    device, width = features[0].device, features[0].shape[1]
    sizes = [int(f.shape[0]) for f in features]
    zero_row = torch.zeros(1, width, device=device)
    rows = torch.cat([*(f.float() for f in features), zero_row])  # autograd reaches features
    with torch.no_grad():
        return _paired_tables(rows, coords, sizes, weight, block)


def _paired_tables(
    rows: torch.Tensor,
    coords: list[torch.Tensor],
    sizes: list[int],
    weight: torch.Tensor,
    block: int,
) -> tuple[Tables, torch.Tensor]:
    """`start_tables` past the rows (`[Z + 1, D]`, the dummy last; `sizes` each video's N),
    without autograd."""
    device, total = rows.device, rows.shape[0] - 1
    counts = torch.tensor(sizes, device=device)
    embed, norms = row_keys(rows, weight, block)  # the dummy's row is zero: zero keys
    coords_table = torch.cat([*coords, coords[0].new_zeros(1, 3)])
    offsets = torch.cumsum(counts, 0) - counts
    slots = torch.arange(max(sizes), device=device)
    active = torch.where(slots < counts.unsqueeze(1), offsets.unsqueeze(1) + slots, total)
    f64 = torch.float64
    tables = Tables(
        rows,
        coords_table,
        embed,
        norms,
        partner=torch.full((total + 1,), total, device=device),
        partner_sim=torch.full((total + 1,), NEG, dtype=f64, device=device),
        listed=torch.full((total + 1, LIST), total, device=device),
        listed_sim=torch.full((total + 1, LIST), NEG, dtype=f64, device=device),
        bound=torch.full((total + 1,), NEG, dtype=f64, device=device),
        pending=torch.zeros(total + 1, dtype=torch.bool, device=device),
        owner=torch.arange(total, device=device),
    )
    _write_pairs(tables, active, exact_candidates(embed, active, active, total, block))
    return tables, active


def _write_pairs(tables: Tables, ids: torch.Tensor, pairs: Pairs) -> None:
    """`ids`' (`[B, R]`) exact partners and lists written, pending cleared; padding writes
    land on the dummy, which is reset."""
    for table, values in zip(_pair_tables(tables), pairs):
        table.index_put_((ids,), values)
    tables.pending.index_put_((ids,), torch.zeros_like(ids, dtype=torch.bool))
    _reset_dummy(tables)


def _pair_tables(tables: Tables) -> tuple[torch.Tensor, ...]:
    """The tables a `Pairs` writes, in its field order."""
    return tables.partner_sim, tables.partner, tables.listed_sim, tables.listed, tables.bound


def _reset_dummy(tables: Tables) -> None:
    """The dummy id pairs with nobody (padding rows write on it)."""
    dummy = tables.dummy
    tables.partner_sim[dummy] = NEG
    tables.partner[dummy] = dummy
    tables.pending[dummy] = False


def _repair(
    tables: Tables,
    active: torch.Tensor,
    chosen: Selection,
    changed: torch.Tensor,
    redo: torch.Tensor,
    block: int,
) -> None:
    """Step 1 of the next round, exactly: `active [B, M]` after the round, `changed [B, T]`
    its targets (new keys), `redo [B, R]` ids to re-pair against their whole video.

    Every other token strikes the round's sources and targets out of its list and merges in
    its most similar changed targets: its partner is the best listed one if that beats the
    bound (every column not listed is at most that similar), else it is `pending`."""
    dummy = tables.dummy
    listed = tables.listed[active]
    listed_sim = tables.listed_sim[active].masked_fill(chosen.touched[listed], NEG)
    bound = tables.bound[active]
    if changed.shape[1]:
        fresh = exact_candidates(tables.embed, active, changed, dummy, block)
        merged_sim = torch.cat([listed_sim, fresh.listed_sim], dim=2)
        top, position = merged_sim.topk(LIST + 1, dim=2)
        listed = torch.cat([listed, fresh.listed], dim=2).gather(2, position[..., :LIST])
        listed_sim = top[..., :LIST]
        bound = torch.maximum(bound, torch.maximum(fresh.bound, top[..., LIST]))
    best = listed_sim.amax(dim=2)
    # Ties to the smallest id: every token as similar as the best one is listed (it beats
    # the bound), so the smallest listed id of that similarity is the partner.
    partner = torch.where(listed_sim == best.unsqueeze(2), listed, dummy).amin(dim=2)
    for table, values in zip(_pair_tables(tables), (best, partner, listed_sim, listed, bound)):
        table.index_put_((active,), values)
    tables.pending.index_put_((active,), best <= bound)
    if redo.shape[1]:
        _write_pairs(tables, redo, exact_candidates(tables.embed, redo, active, dummy, block))
    _reset_dummy(tables)


def _settle_pending(tables: Tables, active: torch.Tensor, pending: list[int], block: int) -> None:
    """Re-pair in full the tokens left `pending` by the last round (`pending` per row of
    `active`): ties among the changed targets that the lists could not hold (rare)."""
    ids = torch.sort(torch.where(tables.pending[active], active, tables.dummy), dim=1).values
    ids = ids[:, : max(pending)]
    _write_pairs(tables, ids, exact_candidates(tables.embed, ids, active, tables.dummy, block))


def run_rounds(
    merge: GatedMerge,
    tables: Tables,
    active: torch.Tensor,
    budgets: list[Budget],
    run: tuple[torch.Tensor, int, torch.dtype, bool],
) -> tuple[list[torch.Tensor], list[int]]:
    """The loop, until no video may or does merge.

    Args:
        merge: the `GatedMerge`.
        tables, active: from `start_tables` (row b of `active` is video b).
        budgets: each video's resolved budget (one threshold for all); `run`:
            `(grid_projection(W_rand) [D, d], block, the merge's dtype, tracks_grad)`.

    Returns:
        `(kept ids [n_b] ascending, rounds)` of each video; `tables` hold the rows and owners.
    """
    block, threshold = run[1], budgets[0].threshold
    count = [int(n) for n in (active != tables.dummy).sum(1).tolist()]
    live = list(range(len(budgets)))  # the video of each row of `active`
    kept: list[torch.Tensor] = [active[0, :0]] * len(budgets)
    rounds = [0] * len(budgets)
    while live:
        allowed = [room(count[v], budgets[v].floor) for v in live]
        active, live = _leave(active, live, [a > 0 for a in allowed], count, kept)
        if not live:
            break
        rooms = torch.tensor([a for a in allowed if a > 0], device=active.device)
        with torch.no_grad():
            chosen = select(tables, active, rooms, threshold)
        sizes = chosen.sizes.tolist()  # the round's one host sync
        b = len(live)
        edges, targets, redo = sizes[:b], sizes[b : 2 * b], sizes[2 * b : 3 * b]
        pending = sizes[3 * b : 4 * b]
        if any(pending):  # rare (see `_repair`): those partners first, then select again
            with torch.no_grad():
                _settle_pending(tables, active, pending, block)
            continue
        if sum(edges) == 0:
            _leave(active, live, [False] * b, count, kept)
            break
        round_index = max(rounds[v] for v in live) + 1
        phi = round_embedding(round_index, merge.config.round_embed_dim, active.device)
        _fuse(merge, tables, chosen, (sum(edges), sizes[-1]), phi, run)
        # A video that selected nothing would select nothing again: it leaves the batch.
        going = [e > 0 for e in edges]
        changed, redo_ids, edges, targets, redo = _going(
            going, (chosen.changed, chosen.redo), (edges, targets, redo)
        )
        active, live = _leave(active, live, going, count, kept)
        with torch.no_grad():
            active = _retire(tables, active, chosen.leaving)
            for i, v in enumerate(live):
                count[v] -= edges[i]
                rounds[v] += 1
            active = active[:, : max(count[v] for v in live)]
            changed, redo_ids = changed[:, : max(targets)], redo_ids[:, : max(redo)]
            _repair(tables, active, chosen, changed, redo_ids, block)
    return kept, rounds


def _going(
    going: list[bool], rows: tuple[torch.Tensor, ...], sizes: tuple[list[int], ...]
) -> tuple:
    """The `[B, .]` tensors `rows` and per-video `sizes` of the videos that stay (`going`)."""
    if all(going):
        return (*rows, *sizes)
    index = torch.tensor([i for i, g in enumerate(going) if g], device=rows[0].device)
    kept_sizes = ([x[i] for i, g in enumerate(going) if g] for x in sizes)
    return (*(r[index] for r in rows), *kept_sizes)


def _retire(tables: Tables, active: torch.Tensor, leaving: torch.Tensor) -> torch.Tensor:
    """`active [B, M]` without the round's sources (`leaving [Z + 2]`): one sort pushes them
    into the padding."""
    return torch.sort(torch.where(leaving[active], tables.dummy, active), dim=1).values


def _leave(
    active: torch.Tensor,
    live: list[int],
    stays: list[bool],
    count: list[int],
    kept: list[torch.Tensor],
) -> tuple[torch.Tensor, list[int]]:
    """Videos whose `stays` is False leave the batch: their kept ids recorded in `kept`;
    `(active, live)` of those that stay, the matrix cut to the longest of them."""
    if all(stays):
        return active, live
    for i, v in enumerate(live):
        if not stays[i]:
            kept[v] = active[i, : count[v]]
    rows = [i for i in range(len(live)) if stays[i]]
    if not rows:
        return active[:0], []
    live = [live[i] for i in rows]
    active = active[torch.tensor(rows, device=active.device)]
    return active[:, : max(count[v] for v in live)], live


def _fuse(
    merge: GatedMerge,
    tables: Tables,
    chosen: Selection,
    sizes: tuple[int, int],
    phi: torch.Tensor,
    run: tuple[torch.Tensor, int, torch.dtype, bool],
) -> None:
    """Fuse every kept edge of the batch (`sizes = (edges, targets)`), rewrite the targets'
    rows and keys, and hand the sources' tokens to their targets."""
    num_edges, num_targets = sizes
    weight, block, dtype, tracks_grad = run
    targets = chosen.row_target[:num_targets]
    sources = chosen.sources[:num_edges]
    new_rows = merge.fuse_all(
        (tables.rows[targets], tables.rows[sources]),
        chosen.group[:num_edges],
        (tables.coords[targets], tables.coords[sources]),
        chosen.similarity[:num_edges].float(),
        phi,
        dtype,
    )
    if tracks_grad:
        tables.rows = tables.rows.index_put((targets,), new_rows)
    else:
        tables.rows.index_put_((targets,), new_rows)
    with torch.no_grad():
        embed, norms = row_keys(new_rows, weight, block)
        tables.embed.index_put_((targets,), embed)
        tables.norms.index_put_((targets,), norms)
        redirect = torch.arange(tables.dummy + 1, device=targets.device)
        redirect.index_put_((sources,), chosen.targets[:num_edges])
        tables.owner = redirect[tables.owner]
