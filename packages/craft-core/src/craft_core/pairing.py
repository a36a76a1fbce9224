"""How each round finds every active token's best partner: the `Pairing` protocol and two
of its strategies (the third, `dense.DensePairing`, keeps every exact similarity).

Both compute similarities in float32 and decide exactly (`certify.py`): a row whose best
candidate beats the bound on every other column is decided fast, a row in doubt is
recomputed with the exact float64 rule on the columns within the bound. Both therefore give
the exact partners of `selection.full_partners` and `algorithm.pair` (ties to the smallest
index), the plain statements of the rule that the tests compare them with.

`FullPairing` is the plain loop: every round, one blockwise pass over the active set
(`|A|^2 d_sim` multiply-adds), fixed shapes, no host sync of its own: the GPU path.

`PairingState` recomputes only what a round changed (a round removes its sources and changes
its targets, nothing else): on video-like input it does about 1.6 full passes in all where
the plain loop does about 2.6, at the price of data-dependent shapes, which cost nothing on a
CPU: the CPU path.
"""

from __future__ import annotations

from typing import Protocol

import torch

from craft_core.certify import (
    buffered_partners,
    certified_partners,
    exact_best,
    listed_exact,
    similarity_bound,
)
from craft_core.selection import RankedEdges, rank_edges


class Pairing(Protocol):
    """What the eager loop asks of a pairing strategy (`FullPairing`, `PairingState`,
    `dense.DensePairing`): the same partners, found differently.

    Attributes:
        full_rows: pairing work so far, in rows of an N x N pass.
        counts: `(decided fast, rechecked exactly)` rows of the last round.
        fallbacks: rounds that needed `fallback`.
    """

    full_rows: float
    counts: tuple[int, int]
    fallbacks: int

    def round_edges(
        self,
        active_ids: torch.Tensor,
        square_norms: torch.Tensor,
        floor: int,
        threshold: float | None,
    ) -> RankedEdges:
        """Pairing and selection of one round (`active_ids [n]` ascending, `square_norms
        [N]`), fixed shapes, nothing read back; `sizes` `[3]`, or `[4]` ending with the rows
        in doubt."""
        ...

    def settle(self, active_ids: torch.Tensor, in_doubt: int) -> bool:
        """Take the rows in doubt read on the host; False if `fallback` is needed."""
        ...

    def fallback(self, active_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(partner [n] original index, similarity [n] float64)`, exact, with host syncs."""
        ...

    def update(
        self,
        targets: torch.Tensor,
        new_embed: torch.Tensor,
        active_ids: torch.Tensor,
        sources: torch.Tensor,
    ) -> None:
        """Apply one round: `targets [T]` take `new_embed [T, d_sim]`, `sources [E]` left;
        `active_ids [n - E]` are those still active."""
        ...


class FullPairing:
    """Re-pairs the whole active set every round (the plain algorithm).

    A round is fixed-shape and reads nothing back
    (`certify.buffered_partners`): the caller reads `in_doubt` together with the round's
    sizes in its one host sync, and calls `fallback` only if more rows were in doubt than
    the exact recheck's buffer holds (counted in `fallbacks`).

    Attributes:
        embed: `[N, d_sim]` float64 exact embeddings (rows of inactive tokens are stale).
        spare: rows in doubt that one round rechecks without a fallback.
        in_doubt: 0-d long tensor, rows in doubt of the last `partners` call (None when the
            call decided every row itself).
        fallbacks: rounds that needed `fallback`.
        full_rows: pairing work so far, in rows of an N x N pass.
        counts: `(fast, rechecked)` rows of the last round (set by `settle`/`fallback`).
    """

    def __init__(self, embed: torch.Tensor, block: int, spare: int = 64) -> None:
        self.embed = embed
        self.block = block
        self.spare = spare
        self.delta = similarity_bound(embed.shape[1])
        self.in_doubt: torch.Tensor | None = None
        self.fallbacks = 0
        self.full_rows = 0.0
        self.counts = (0, 0)

    def settle(self, active_ids: torch.Tensor, in_doubt: int) -> bool:
        """Record the rows in doubt read on the host; False if `fallback` is needed."""
        if self.in_doubt is None:  # decided by `fallback`, which set the counts
            return True
        n = active_ids.numel()
        self.counts = (n - in_doubt, in_doubt)
        return in_doubt <= min(self.spare, n)

    def fallback(self, active_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact partners with host syncs (data-dependent rechecks)."""
        n = active_ids.numel()
        if self.in_doubt is not None:
            self.fallbacks += 1
        self.in_doubt = None
        sim, pos, rechecked = certified_partners(self.embed[active_ids], self.block)
        self.counts = (n - rechecked, rechecked)
        return active_ids[pos], sim

    def round_edges(
        self,
        active_ids: torch.Tensor,
        square_norms: torch.Tensor,
        floor: int,
        threshold: float | None,
    ) -> RankedEdges:
        """Pairing and selection of one round, fixed shapes, nothing read back: `sizes` `[4]`
        ends with the rows in doubt, for the caller's one host sync (the selection is exact
        if they are at most `min(spare, n)`)."""
        n = active_ids.numel()
        self.full_rows += n**2 / self.embed.shape[0]
        sim, pos, self.in_doubt = buffered_partners(
            self.embed[active_ids], self.block, self.delta, self.spare
        )
        edges = ranked_edges(active_ids, active_ids[pos], sim, square_norms, floor, threshold)
        edges.sizes = torch.cat([edges.sizes, self.in_doubt.view(1)])
        return edges

    def update(
        self,
        targets: torch.Tensor,
        new_embed: torch.Tensor,
        active_ids: torch.Tensor,
        sources: torch.Tensor,
    ) -> None:
        """Apply one round: `targets` (`[T]`) take `new_embed` (`[T, d_sim]`)."""
        del active_ids, sources  # every round re-pairs whatever is active
        self.embed[targets] = new_embed


def ranked_edges(
    active_ids: torch.Tensor,
    partner: torch.Tensor,
    partner_sim: torch.Tensor,
    square_norms: torch.Tensor,
    floor: int,
    threshold: float | None,
) -> RankedEdges:
    """`selection.rank_edges` for a round known to have room (`min(n - floor, n // 2) >= 1`)."""
    edges = rank_edges(active_ids, partner, partner_sim, square_norms, floor, threshold)
    if edges is None:
        raise ValueError("a round needs min(n - floor, n // 2) >= 1; check before pairing")
    return edges


def _order_candidates(sim: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort each row's candidates by similarity (descending), then index (ascending)."""
    order = torch.argsort(idx, dim=1, stable=True)
    sim, idx = sim.gather(1, order), idx.gather(1, order)
    order = torch.argsort(sim, dim=1, descending=True, stable=True)
    return sim.gather(1, order), idx.gather(1, order)


class PairingState:
    """Every active token's best partner, kept exact across rounds at a fraction of the cost.

    A round removes its sources and changes the embedding of its targets; every other token is
    untouched. So each active token `i` keeps a short list of candidates with their EXACT
    current similarities, ordered (similarity, then index), and a bound `b_i` such that every
    active token outside the list is at most `b_i` similar to `i`. Lists come from float32
    scores (`certify.listed_exact`: the fast top `keep`, their exact similarities, and the
    `(keep+1)`-th fast score plus the error bound as `b_i`). After a round, list entries that
    left are dropped, changed targets are re-scored by one `|A| x |T|` product (the best of
    them enter the list, the rest raise the bound), and the list's head is `i`'s exact best
    partner whenever it is strictly above the bound. Only the changed targets and the tokens
    whose list ran out need a full pass over the active set; within a pass, a row whose head
    does not beat its bound is recomputed exactly on the columns within the bound. Ties go to
    the smallest index everywhere, so the partners are those of a full exact recompute.

    Attributes:
        embed: `[N, d_sim]` float64 exact embedding (rows of inactive tokens are stale).
        fast: `[N, d_sim]` the same values in float32, for the fast products.
        partner: `[N]` long best partner of each active token (original index).
        partner_sim: `[N]` float64 its exact similarity.
        full_rows: pairing work so far, in rows of an N x N pass (the first pass is N);
            `full_rows / N` is the work in multiples of one full pass.
        counts: `(fast, rechecked)` rows whose partner was decided for the last call to
            `partners` (since the call before): from a list or a certified pass, or by an
            exact recheck.
        fallbacks: always 0 (its partners are always exact; `fallback` is never needed).
    """

    def __init__(self, embed: torch.Tensor, block: int, keep: int = 4) -> None:
        n = embed.shape[0]
        device = embed.device
        self.embed = embed
        self.fast = embed.float()
        self.delta = similarity_bound(embed.shape[1])
        self.block = block
        # Float32 blocks are half the bytes of float64 ones: twice the rows, same memory.
        self.fast_block = 2 * block
        self.keep = keep
        self.partner = torch.full((n,), -1, dtype=torch.long, device=device)
        f64 = torch.float64
        self.partner_sim = torch.full((n,), float("-inf"), dtype=f64, device=device)
        self.list_idx = torch.full((n, keep), -1, dtype=torch.long, device=device)
        self.list_sim = torch.full((n, keep), float("-inf"), dtype=f64, device=device)
        self.bound = torch.full((n,), float("-inf"), dtype=f64, device=device)
        self.full_rows = 0.0
        self.fallbacks = 0
        self.counts = (0, 0)
        self._decided = [0, 0]
        ids = torch.arange(n, device=device)
        self._recompute(ids, ids)

    def round_edges(
        self,
        active_ids: torch.Tensor,
        square_norms: torch.Tensor,
        floor: int,
        threshold: float | None,
    ) -> RankedEdges:
        """Pairing and selection of one round (`FullPairing.round_edges`); `sizes` `[3]`."""
        partner, sim = self.partners(active_ids)
        return ranked_edges(active_ids, partner, sim, square_norms, floor, threshold)

    def settle(self, active_ids: torch.Tensor, in_doubt: int) -> bool:
        """Nothing to settle: the partners are always exact (see `FullPairing.settle`)."""
        return True

    def fallback(self, active_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Never needed (`settle` is always True): the partners, exact."""
        return self.partners(active_ids)

    def partners(self, active_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(partner [n] original index, similarity [n] float64)` of each active token."""
        self.counts = (self._decided[0], self._decided[1])
        self._decided = [0, 0]
        return self.partner[active_ids], self.partner_sim[active_ids]

    def _top_candidates(
        self, sims: torch.Tensor, ids: torch.Tensor, keys: torch.Tensor, key_embed: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """From fast scores `[b, m]` of rows `ids` against `keys` (`[m]` ascending, exact
        embeddings `key_embed` `[m, d]`): the ordered exact top-`keep` (sim, idx)
        `[b, keep]` and an upper bound on the exact score of every key left out `[b]`."""
        top_val, top_pos = sims.topk(min(self.keep + 1, keys.numel()), dim=1)
        top_sim, pos, left_out = listed_exact(
            self.embed[ids], key_embed, top_val, top_pos, self.keep, self.delta
        )
        top_idx = torch.where(pos < 0, -1, keys[pos.clamp(min=0)])
        top_sim, top_idx = _order_candidates(top_sim, top_idx)
        pad = self.keep - top_sim.shape[1]
        if pad:
            top_sim = torch.nn.functional.pad(top_sim, (0, pad), value=float("-inf"))
            top_idx = torch.nn.functional.pad(top_idx, (0, pad), value=-1)
        return top_sim, top_idx, left_out

    def _scores(
        self, ids: torch.Tensor, keys: torch.Tensor, key_fast: torch.Tensor
    ) -> torch.Tensor:
        """Fast similarities `[b, m]` of rows `ids` to `keys` (ascending; fast embeddings
        `key_fast` `[m, d]`), with a row's own column at -inf."""
        sims = self.fast[ids] @ key_fast.T
        pos = torch.searchsorted(keys, ids).clamp_(max=keys.numel() - 1)
        own = torch.nonzero(keys[pos] == ids).squeeze(1)
        sims[own, pos[own]] = float("-inf")
        return sims

    def _recompute(self, rows: torch.Tensor, keys: torch.Tensor) -> None:
        """Full pass: rows `[r]` against every active token `keys` (ascending)."""
        key_embed, key_fast = self.embed[keys], self.fast[keys]
        for start in range(0, rows.numel(), self.fast_block):
            stop = min(start + self.fast_block, rows.numel())
            ids = rows[start:stop]
            sims = self._scores(ids, keys, key_fast)
            top_sim, top_idx, left_out = self._top_candidates(sims, ids, keys, key_embed)
            self.list_sim[ids], self.list_idx[ids], self.bound[ids] = top_sim, top_idx, left_out
            best_sim, best_idx = top_sim[:, 0], top_idx[:, 0]
            # In doubt (the head does not beat every key left out): the exact rule on the
            # keys whose fast score is within the bound of the head; no other can win or tie.
            unsure = torch.nonzero(best_sim <= left_out).squeeze(1)
            if unsure.numel():
                near = sims[unsure] >= (best_sim[unsure] - self.delta).unsqueeze(1)
                cols = torch.nonzero(near.any(dim=0)).squeeze(1)
                best_sim[unsure], best_idx[unsure] = exact_best(
                    self.embed[ids[unsure]], ids[unsure], key_embed[cols], keys[cols], self.block
                )
            self.partner_sim[ids], self.partner[ids] = best_sim, best_idx
            self._decided[0] += ids.numel() - unsure.numel()
            self._decided[1] += unsure.numel()
        self.full_rows += rows.numel() * keys.numel() / self.embed.shape[0]

    def _rescore(self, rows: torch.Tensor, changed: torch.Tensor) -> None:
        """Re-score `rows` against the changed targets and merge the result into their lists."""
        changed_embed, changed_fast = self.embed[changed], self.fast[changed]
        for start in range(0, rows.numel(), self.fast_block):
            ids = rows[start : start + self.fast_block]
            self._absorb(ids, self.fast[ids] @ changed_fast.T, changed, changed_embed)
        self.full_rows += rows.numel() * changed.numel() / self.embed.shape[0]

    def _absorb(
        self, rows: torch.Tensor, sims: torch.Tensor, keys: torch.Tensor, key_embed: torch.Tensor
    ) -> None:
        """Merge fresh fast scores `[r, m]` of `rows` against `keys` into their candidate
        lists: the best enter the list, the rest raise the bound."""
        col_sim, col_idx, col_left = self._top_candidates(sims, rows, keys, key_embed)
        merged_sim, merged_idx = _order_candidates(
            torch.cat([self.list_sim[rows], col_sim], dim=1),
            torch.cat([self.list_idx[rows], col_idx], dim=1),
        )
        self.list_sim[rows] = merged_sim[:, : self.keep]
        self.list_idx[rows] = merged_idx[:, : self.keep]
        spill = torch.maximum(col_left, merged_sim[:, self.keep])
        self.bound[rows] = torch.maximum(self.bound[rows], spill)

    def update(
        self,
        targets: torch.Tensor,
        new_embed: torch.Tensor,
        active_ids: torch.Tensor,
        sources: torch.Tensor,
    ) -> None:
        """Apply one round: `targets` (`[T]`) take `new_embed` (`[T, d_sim]`); `active_ids`
        (`[n]`, ascending) are the tokens still active after it (its `sources` have left;
        unused: the lists drop whatever is no longer active)."""
        del sources
        changed_mask = (self.embed[targets] != new_embed).any(dim=1)
        self.embed[targets[changed_mask]] = new_embed[changed_mask]
        self.fast[targets[changed_mask]] = new_embed[changed_mask].float()
        changed = torch.sort(targets[changed_mask]).values
        if active_ids.numel() < 2:
            return
        stale = torch.ones(self.embed.shape[0], dtype=torch.bool, device=active_ids.device)
        stale[active_ids] = False
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
        self._decided[0] += rows.numel() - redo.numel()
        if redo.numel():
            self._recompute(redo, active_ids)
