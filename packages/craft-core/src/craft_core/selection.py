"""Training-free selection of CRAFT: which tokens merge (steps 1-7 of algorithm.md).

Pure functions on tensors, no learnable state. Everything here runs under `torch.no_grad()`
and in float32, whatever the dtype of the features.

    E = l2_normalize(X @ W_rand)          # similarity space, [N, d_sim]
    p(i) = argmax_{j in A, j != i} E_i.E_j  # pairing, blockwise: never an N x N matrix

`PairingState` keeps every active token's best partner up to date from one round to the next
by recomputing only what a round changed (see its docstring): the result is the one a full
recompute gives, at a fraction of its cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def make_projection(hidden_size: int, sim_dim: int, seed: int) -> torch.Tensor:
    """W_rand `[D, d_sim]`: standard normal from a seeded CPU generator, unit-norm columns.

    The CPU generator makes the matrix identical on every machine and device.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    weight = torch.randn(hidden_size, sim_dim, generator=generator, dtype=torch.float32)
    return weight / weight.norm(dim=0, keepdim=True)


def similarity_embedding(features: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """E = l2_normalize(X @ W_rand) in float32: `[n, D] -> [n, d_sim]`."""
    projected = features.detach().float() @ projection.float()
    return torch.nn.functional.normalize(projected, dim=1)


def best_partners(
    row_embed: torch.Tensor,
    row_ids: torch.Tensor,
    key_embed: torch.Tensor,
    key_ids: torch.Tensor,
    block: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each row, its most similar key other than itself, blockwise.

    Args:
        row_embed: `[n, d]` unit rows whose partner is sought.
        row_ids: `[n]` original index of each row.
        key_embed: `[m, d]` unit candidate partners.
        key_ids: `[m]` original index of each key, ASCENDING (so that `max`, which returns the
            first maximal position, breaks ties toward the smallest index).
        block: rows per block; extra memory is `block x m` floats.

    Returns:
        `(similarity [n] float32, partner [n] long)`; a row with no key but itself gets
        `-inf` and partner -1.
    """
    n = row_embed.shape[0]
    best_sim = torch.empty(n, dtype=torch.float32, device=row_embed.device)
    best_idx = torch.empty(n, dtype=torch.long, device=row_embed.device)
    if key_ids.numel() == 0:
        best_sim.fill_(float("-inf"))
        best_idx.fill_(-1)
        return best_sim, best_idx
    for start in range(0, n, block):
        stop = min(start + block, n)
        sims = row_embed[start:stop] @ key_embed.T
        ids = row_ids[start:stop]
        # A row's own column (if it is among the keys) must never win.
        pos = torch.searchsorted(key_ids, ids).clamp_(max=key_ids.numel() - 1)
        is_self = key_ids[pos] == ids
        rows = torch.nonzero(is_self).squeeze(1)
        sims[rows, pos[rows]] = float("-inf")
        values, where = sims.max(dim=1)
        best_sim[start:stop] = values
        best_idx[start:stop] = torch.where(
            torch.isneginf(values), torch.full_like(where, -1), key_ids[where]
        )
    return best_sim, best_idx


@dataclass
class Edges:
    """Surviving merge edges of one round, one per source.

    Attributes:
        targets: `[M]` original index of each edge's target (representative).
        sources: `[M]` original index of each edge's source; every source appears once and
            no source is a target.
        similarity: `[M]` float32 selection similarity `s_ti` of each edge.
    """

    targets: torch.Tensor
    sources: torch.Tensor
    similarity: torch.Tensor


def select_edges(
    active_ids: torch.Tensor,
    partner: torch.Tensor,
    partner_sim: torch.Tensor,
    norms: torch.Tensor,
    floor: int,
    threshold: float | None,
) -> Edges | None:
    """Steps 2-7 of one round: candidates, budget, truncation, orientation, chain prevention,
    one target per source.

    Args:
        active_ids: `[n]` ascending original indices of the active tokens.
        partner: `[n]` best partner (original index) of each active token.
        partner_sim: `[n]` its similarity `s*_i`.
        norms: `[N]` current L2 norm of every token's feature row (indexed by original index).
        floor: fewest tokens allowed to remain.
        threshold: `s_theta` in threshold mode, None in fixed-ratio mode.

    Returns:
        The surviving edges, or None when the round must not run (no candidate, or k <= 0).
    """
    n = active_ids.numel()
    if threshold is None:
        cand = torch.arange(n, device=active_ids.device)
    else:
        cand = torch.nonzero(partner_sim >= threshold).squeeze(1)
    k = min(n - floor, n // 2, cand.numel())
    if k <= 0:
        return None
    # Highest s* first; the stable sort keeps ascending index order among equal similarities.
    order = torch.sort(partner_sim[cand], descending=True, stable=True).indices[:k]
    kept = cand[order]
    first = active_ids[kept]
    second = partner[kept]
    sim = partner_sim[kept]

    norm_first, norm_second = norms[first], norms[second]
    first_is_target = (norm_first > norm_second) | ((norm_first == norm_second) & (first < second))
    targets = torch.where(first_is_target, first, second)
    sources = torch.where(first_is_target, second, first)

    # i -> j and j -> i orient to the same (target, source): keep one, with the larger s.
    size = norms.numel()
    pair_key = targets * size + sources
    unique_key, inverse = torch.unique(pair_key, return_inverse=True)
    pair_sim = torch.full((unique_key.numel(),), float("-inf"), device=sim.device)
    pair_sim = pair_sim.scatter_reduce(0, inverse, sim, reduce="amax")
    targets, sources, sim = unique_key // size, unique_key % size, pair_sim

    # Chain prevention: a token that is any edge's target drops the edges where it is a source.
    is_target = torch.zeros(size, dtype=torch.bool, device=targets.device)
    is_target[targets] = True
    keep = ~is_target[sources]
    targets, sources, sim = targets[keep], sources[keep], sim[keep]

    # One target per source: highest similarity, then smallest target index.
    if int(torch.bincount(sources, minlength=size).max()) <= 1:
        return Edges(targets, sources, sim)
    order = torch.argsort(targets, stable=True)
    order = order[torch.sort(sim[order], descending=True, stable=True).indices]
    order = order[torch.argsort(sources[order], stable=True)]
    targets, sources, sim = targets[order], sources[order], sim[order]
    first_of_source = torch.ones_like(sources, dtype=torch.bool)
    first_of_source[1:] = sources[1:] != sources[:-1]
    return Edges(targets[first_of_source], sources[first_of_source], sim[first_of_source])


def _order_candidates(sim: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort each row's candidates by similarity (descending), then index (ascending)."""
    order = torch.argsort(idx, dim=1, stable=True)
    sim, idx = sim.gather(1, order), idx.gather(1, order)
    order = torch.argsort(sim, dim=1, descending=True, stable=True)
    return sim.gather(1, order), idx.gather(1, order)


class PairingState:
    """Every active token's best partner, kept exact across rounds at a fraction of the cost.

        A round removes its sources and changes the embedding of its targets; every other token
        is untouched. So each active token `i` keeps a short list of its best candidates with
        their current similarities, and a bound `b_i` such that every active token outside the
        list is at most `b_i` similar to `i`. After a round, list entries that left are dropped,
        changed targets are re-scored by one `|A| x |T|` product (the best of them enter the list,
        the rest raise the bound), and the list's head is `i`'s exact best partner whenever it is
        strictly above the bound. Only the changed targets and the tokens whose list ran out need
        a full pass over the active set, and the changed targets' rows, read transposed, re-score
    them for everyone else. Ties go to the smallest index everywhere, so the partners
        are those of a full recompute.

        Attributes:
            embed: `[N, d_sim]` float32 similarity embedding (rows of inactive tokens are stale).
            active: `[N]` bool.
            partner: `[N]` long best partner of each active token (original index).
            partner_sim: `[N]` float32 its similarity.
            full_rows: pairing work so far, in rows of an N x N pass (the first pass is N);
                `full_rows / N` is the work in multiples of one full pass.
    """

    def __init__(self, embed: torch.Tensor, block: int, keep: int = 4) -> None:
        n = embed.shape[0]
        device = embed.device
        self.embed = embed
        self.block = block
        self.keep = keep
        self.active = torch.ones(n, dtype=torch.bool, device=device)
        self.partner = torch.full((n,), -1, dtype=torch.long, device=device)
        self.partner_sim = torch.full((n,), float("-inf"), device=device)
        self.list_idx = torch.full((n, keep), -1, dtype=torch.long, device=device)
        self.list_sim = torch.full((n, keep), float("-inf"), device=device)
        self.bound = torch.full((n,), float("-inf"), device=device)
        self.full_rows = 0.0
        ids = torch.arange(n, device=device)
        self._recompute(ids, ids)

    def active_ids(self) -> torch.Tensor:
        """`[n]` ascending original indices of the active tokens."""
        return torch.nonzero(self.active).squeeze(1)

    def _top_candidates(
        self, sims: torch.Tensor, keys: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """From scores `[b, m]` against `keys` (`[m]` ascending): the ordered top-`keep`
        (sim, idx) `[b, keep]` and the best score left out of them `[b]`."""
        count = min(self.keep + 1, keys.numel())
        top_sim, top_pos = sims.topk(count, dim=1)
        top_idx = torch.where(torch.isneginf(top_sim), -1, keys[top_pos])
        left_out = torch.full((sims.shape[0],), float("-inf"), device=sims.device)
        if count > self.keep:
            left_out = top_sim[:, self.keep]
            top_sim, top_idx = top_sim[:, : self.keep], top_idx[:, : self.keep]
        # topk already orders by similarity; only exact ties need the index order fixed.
        if bool((top_sim[:, 1:] == top_sim[:, :-1]).any()):
            top_sim, top_idx = _order_candidates(top_sim, top_idx)
        pad = self.keep - top_sim.shape[1]
        if pad:
            top_sim = torch.nn.functional.pad(top_sim, (0, pad), value=float("-inf"))
            top_idx = torch.nn.functional.pad(top_idx, (0, pad), value=-1)
        return top_sim, top_idx, left_out

    def _scores(
        self, ids: torch.Tensor, keys: torch.Tensor, key_embed: torch.Tensor
    ) -> torch.Tensor:
        """Similarities `[b, m]` of rows `ids` to `keys` (ascending; embeddings `key_embed`
        `[m, d]`), with a row's own column at -inf."""
        sims = self.embed[ids] @ key_embed.T
        pos = torch.searchsorted(keys, ids).clamp_(max=keys.numel() - 1)
        own = torch.nonzero(keys[pos] == ids).squeeze(1)
        sims[own, pos[own]] = float("-inf")
        return sims

    def _recompute(self, rows: torch.Tensor, keys: torch.Tensor) -> None:
        """Full pass: rows `[r]` against every active token `keys` (ascending)."""
        key_embed = self.embed[keys]
        for start in range(0, rows.numel(), self.block):
            stop = min(start + self.block, rows.numel())
            ids = rows[start:stop]
            sims = self._scores(ids, keys, key_embed)
            top_sim, top_idx, left_out = self._top_candidates(sims, keys)
            self.list_sim[ids], self.list_idx[ids], self.bound[ids] = top_sim, top_idx, left_out
            best_sim, best_idx = top_sim[:, 0], top_idx[:, 0]
            # If the maximum is tied beyond the list, the smallest tied index may lie outside it.
            unsure = torch.nonzero(best_sim == left_out).squeeze(1)
            if unsure.numel():
                value, where = sims[unsure].max(dim=1)
                best_sim[unsure], best_idx[unsure] = value, keys[where]
            self.partner_sim[ids], self.partner[ids] = best_sim, best_idx
        self.full_rows += rows.numel() * keys.numel() / self.embed.shape[0]

    def _rescore(self, rows: torch.Tensor, changed: torch.Tensor) -> None:
        """Re-score `rows` against the changed targets and merge the result into their lists."""
        changed_embed = self.embed[changed]
        for start in range(0, rows.numel(), self.block):
            ids = rows[start : start + self.block]
            self._absorb(ids, self.embed[ids] @ changed_embed.T, changed)
        self.full_rows += rows.numel() * changed.numel() / self.embed.shape[0]

    def _absorb(self, rows: torch.Tensor, sims: torch.Tensor, keys: torch.Tensor) -> None:
        """Merge fresh scores `[r, m]` of `rows` against `keys` into their candidate lists:
        the best enter the list, the rest raise the bound."""
        col_sim, col_idx, col_left = self._top_candidates(sims, keys)
        merged_sim, merged_idx = _order_candidates(
            torch.cat([self.list_sim[rows], col_sim], dim=1),
            torch.cat([self.list_idx[rows], col_idx], dim=1),
        )
        self.list_sim[rows] = merged_sim[:, : self.keep]
        self.list_idx[rows] = merged_idx[:, : self.keep]
        spill = torch.maximum(col_left, merged_sim[:, self.keep])
        self.bound[rows] = torch.maximum(self.bound[rows], spill)

    def update(self, targets: torch.Tensor, new_embed: torch.Tensor, sources: torch.Tensor) -> None:
        """Apply one round: `sources` leave, `targets` (`[T]`) take `new_embed` (`[T, d_sim]`)."""
        self.active[sources] = False
        changed_mask = (self.embed[targets] != new_embed).any(dim=1)
        self.embed[targets[changed_mask]] = new_embed[changed_mask]
        changed = torch.sort(targets[changed_mask]).values
        active_ids = self.active_ids()
        if active_ids.numel() < 2:
            return
        stale = ~self.active
        stale[changed] = True
        rows = active_ids[~stale[active_ids]]

        # Entries that left or changed drop out; the changed targets' full rows re-score them.
        list_idx = self.list_idx[rows]
        dropped = (list_idx < 0) | stale[list_idx.clamp(min=0)]
        self.list_sim[rows] = self.list_sim[rows].masked_fill(dropped, float("-inf"))
        self.list_idx[rows] = list_idx.masked_fill(dropped, -1)
        if changed.numel():
            self._rescore(rows, changed)
            self._recompute(changed, active_ids)
        else:
            self.list_sim[rows], self.list_idx[rows] = _order_candidates(
                self.list_sim[rows], self.list_idx[rows]
            )
        list_sim, bound = self.list_sim[rows], self.bound[rows]
        sure = list_sim[:, 0] > bound
        self.partner_sim[rows[sure]] = list_sim[sure, 0]
        self.partner[rows[sure]] = self.list_idx[rows[sure], 0]
        redo = rows[~sure]
        if redo.numel():
            self._recompute(redo, active_ids)
