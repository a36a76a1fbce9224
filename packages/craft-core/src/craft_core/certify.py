"""Exact selection at float speed: float32 similarities, a rigorous error bound, exact rechecks.

The rule (`selection.py`) compares EXACT similarities `s_ij = E_i . E_j` of the exact
embedding E (float64 on the grid 2^-23). Computing all of them in float64 costs about twice
a float32 pass; this module computes them in float32 and recomputes exactly only what the
float32 values cannot decide. The result is the exact rule's, bit for bit:

- **Exact inputs.** An entry of E is `k * 2^-23` with `|k| <= 2^23`: 24 significant bits, so
  `E.float()` is exact; only the products' summation rounds.
- **The bound.** For any kernel that forms the `d` products `a_k b_k` (rounded, or fused into
  an FMA) and adds them in ANY order and parenthesisation (sequential, blocked, pairwise
  trees, split-K partial sums added later, zero padding), each product passes through at
  most `d` roundings on its way to the result (its own, and at most `d - 1` additions, the
  depth of a leaf in any binary tree of `d` leaves; an FMA removes one, adding an exact zero
  removes nothing), so in the standard model of IEEE arithmetic (Higham, Accuracy and
  Stability of Numerical Algorithms, 2nd ed., Lemma 3.1 and section 3.1)

      |fl(a . b) - a . b|  <=  gamma_d * sum_k |a_k b_k|  <=  gamma_d * ||a|| * ||b||,
      gamma_d = d u / (1 - d u),  u = 2^-24 (float32).

  The model needs no underflow and no overflow: every product of two grid values is a
  multiple of 2^-46 and every partial sum is 0 or at least 2^-46 in magnitude (a float32
  rounding of such a number stays above 2^-46, far from the subnormals), and `|a.b| <= d`.
  Kernels that round their INPUTS first (TF32, bf16: allowed when
  `torch.get_float32_matmul_precision()` is not "highest") add `(2 v + v^2) ||a|| ||b||`
  with `v` their unit roundoff. `||E_i|| <= NORM_MAX` for every row (the grid rounding moves
  a unit vector by at most `sqrt(d) 2^-24`), so one constant `delta` bounds every pair.
- **Partners.** Each row keeps its fast top-`keep + 1` columns (any tie order: `topk` only
  promises that no column left out is larger). The exact similarities of the first `keep`
  are computed (`keep` float64 dot products per row) and the best of them, ties to the
  smallest index, is the row's partner IF it beats `f_(keep+1) + delta`, an upper bound on
  the exact similarity of every column left out. Otherwise the row is in doubt (exact
  duplicates: static frames, letterbox bars) and `exact_best` recomputes it exactly on the
  columns whose fast value is within `delta` of that best: every column outside them is
  strictly less similar than the best listed one, so it can neither win nor tie.
- **The other comparisons.** The winning similarity `s*_i` is the exact float64 value of
  the listed pair, so the global ranking, the threshold and the fusion read exact values;
  orientation reads the exact norms of `row_keys`. Nothing depends on how a kernel rounds.
"""

from __future__ import annotations

import math

import torch

U_FLOAT32 = 2.0**-24
"""Unit roundoff of float32."""
NORM_MAX = 1.0 + 2.0**-18
"""Upper bound on `||E_i||` of the exact embedding (d_sim <= 512: `sqrt(512) 2^-24 < 2^-19`)."""


_PAST_END = 2**62
"""An index past any row: masked entries that a min or a compare must never pick."""

_INPUT_ROUNDOFF = {"highest": 0.0, "ieee": 0.0, "none": 0.0, "high": 2.0**-11, "tf32": 2.0**-11}


def _precision_settings() -> list[str]:
    """Every float32-matmul precision setting torch reads (legacy and per-backend APIs)."""
    settings = []
    try:
        settings.append(torch.get_float32_matmul_precision())
    except RuntimeError:  # legacy and new APIs mixed: torch refuses to say; assume the worst
        settings.append("medium")
    for backend in ("cuda", "mkldnn"):
        matmul = getattr(getattr(torch.backends, backend, None), "matmul", None)
        settings.append(str(getattr(matmul, "fp32_precision", "ieee")))
    return settings


def matmul_input_roundoff() -> float:
    """Unit roundoff of the inputs of a float32 matmul under the current precision settings:
    0 (exact inputs), 2^-11 (TF32 allowed) or 2^-8 (bf16, or anything else)."""
    return max(_INPUT_ROUNDOFF.get(setting, 2.0**-8) for setting in _precision_settings())


def similarity_bound(sim_dim: int) -> float:
    """`delta`: `|fl32(E_i . E_j) - E_i . E_j| <= delta` for any two rows of the exact E.

    Rounded up generously (a relative `2^-20` and an absolute `2^-40`) so that evaluating
    this bound and the float64 comparisons made with it cannot lose the inequality.
    """
    gamma = sim_dim * U_FLOAT32 / (1.0 - sim_dim * U_FLOAT32)
    v = matmul_input_roundoff()
    per_norm = gamma * (1.0 + v) ** 2 + 2.0 * v + v * v
    return math.nextafter(per_norm * NORM_MAX**2 * (1.0 + 2.0**-20) + 2.0**-40, math.inf)


def listed_exact(
    row_embed: torch.Tensor,
    key_embed: torch.Tensor,
    top_val: torch.Tensor,
    top_pos: torch.Tensor,
    keep: int,
    delta: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact similarities of each row's first `keep` fast candidates, and a bound on the rest.

    Args:
        row_embed: `[b, d]` float64 exact embeddings of the rows.
        key_embed: `[m, d]` float64 exact embeddings of the columns.
        top_val: `[b, c]` float32 fast top-`c` values of each row (c <= keep + 1), the row's
            own column at -inf.
        top_pos: `[b, c]` their column positions.
        keep: how many candidates get an exact similarity.
        delta: `similarity_bound`.

    Returns:
        `(exact [b, k] float64, pos [b, k] long, left [b] float64)` with `k = min(keep, c)`:
        the exact similarity of each listed column (-inf and position -1 for the own column),
        and an upper bound on the exact similarity of every column not listed (-inf if none).
    """
    listed_val, pos = top_val[:, :keep], top_pos[:, :keep]
    # Float64 dot products of grid values are exact in any order (multiples of 2^-46 < 2^53).
    exact = torch.bmm(key_embed[pos], row_embed.unsqueeze(2)).squeeze(2)
    # A -inf fast score is no candidate: the own column when every column is listed, or a
    # masked column (the compiled loop's padding). Otherwise every listed score is finite.
    excluded = torch.isneginf(listed_val)
    exact, pos = exact.masked_fill(excluded, float("-inf")), pos.masked_fill(excluded, -1)
    if top_val.shape[1] > keep:
        left = top_val[:, keep].double() + delta
    else:
        left = torch.full_like(exact[:, 0], float("-inf"))
    return exact, pos, left


def exact_best(
    row_embed: torch.Tensor,
    row_ids: torch.Tensor,
    key_embed: torch.Tensor,
    key_ids: torch.Tensor,
    block: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact rule (today's float64 arithmetic) for some rows against some columns.

    Args:
        row_embed: `[r, d]` float64 exact embeddings of the rows.
        row_ids: `[r]` their ids (a row never pairs with the column of its own id).
        key_embed: `[m, d]` float64 exact embeddings of the columns.
        key_ids: `[m]` ascending ids of the columns.
        block: rows per step (extra memory `block x m` float64).

    Returns:
        `(similarity [r] float64, partner [r] long id)`: ties go to the smallest id.
    """
    r, m = row_ids.numel(), key_ids.numel()
    sim = torch.empty(r, dtype=torch.float64, device=row_embed.device)
    pos = torch.empty(r, dtype=torch.long, device=row_embed.device)
    for start in range(0, r, block):
        stop = min(start + block, r)
        sims = row_embed[start:stop] @ key_embed.T
        own = torch.searchsorted(key_ids, row_ids[start:stop]).clamp_(max=m - 1).unsqueeze(1)
        # The own column (where present) at -inf, with fixed shapes: rewrite one column each.
        is_own = key_ids[own] == row_ids[start:stop].unsqueeze(1)
        sims.scatter_(1, own, sims.gather(1, own).masked_fill_(is_own, float("-inf")))
        torch.max(sims, dim=1, out=(sim[start:stop], pos[start:stop]))
    return sim, key_ids[pos]


def _fast_listed(
    embed: torch.Tensor, block: int, keep: int, delta: float, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One float32 pass and the exact similarities of each row's listed candidates.

    Returns `(best [n] float64 exact, partner [n] position, doubt [n] bool)`: the best listed
    column (ties: smallest position) and whether it fails to beat the bound on the rest.
    Columns where `valid` (`[n]` bool) is False are never candidates.
    """
    n = embed.shape[0]
    fast = embed.float()  # exact: 24 significant bits
    if n <= 2 * block:  # one block; no loop over n, so a compiled round keeps n symbolic
        sims = fast @ fast.T
        sims.diagonal().fill_(float("-inf"))  # a row's own column never wins
        if valid is not None:
            sims.masked_fill_(~valid, float("-inf"))
        top_val, top_pos = torch.topk(sims, min(keep + 1, n), dim=1)
        return _decide(embed, top_val, top_pos, keep, delta)
    values, positions = [], []
    for start in range(0, n, 2 * block):
        sims = fast[start : start + 2 * block] @ fast.T
        sims.diagonal(offset=start).fill_(float("-inf"))  # a row's own column never wins
        if valid is not None:
            sims.masked_fill_(~valid, float("-inf"))
        top = torch.topk(sims, min(keep + 1, n), dim=1)
        values.append(top.values)
        positions.append(top.indices)
    return _decide(embed, torch.cat(values), torch.cat(positions), keep, delta)


def _decide(
    embed: torch.Tensor, top_val: torch.Tensor, top_pos: torch.Tensor, keep: int, delta: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Best listed partner of each row (`_fast_listed`'s result) from its fast top-k."""
    exact, pos, left = listed_exact(embed, embed, top_val, top_pos, keep, delta)
    best = exact.amax(dim=1)
    # Exact ties among the listed: the smallest position (= smallest index) wins.
    partner = pos.masked_fill(exact != best.unsqueeze(1), _PAST_END).amin(dim=1)
    return best, partner, best <= left


def certified_partners(
    embed: torch.Tensor, block: int, keep: int = 3, recheck_all: bool = False
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """`algorithm.pair`'s exact answer from one float32 pass plus exact rechecks.

    One host sync (how many rows are in doubt); `buffered_partners` needs none.

    Args:
        embed: `[n, d]` float64 exact embeddings of the active tokens, ascending index.
        block: rows per float64 block (the rechecks); the float32 pass takes `2 x block`
            rows at a time: extra memory about `2 block x n` float32 values either way.
        keep: candidates per row that get an exact similarity (a static frame repeated
            `keep` times is decided without a recheck).
        recheck_all: recheck every row exactly (tests the fallback; the result is the same).

    Returns:
        `(similarity [n] float64 exact, partner [n] position, rechecked rows)`.
    """
    n = embed.shape[0]
    best, partner, doubt = _fast_listed(embed, block, keep, similarity_bound(embed.shape[1]))
    if recheck_all:
        doubt = torch.ones_like(doubt)
    rows = torch.nonzero(doubt).squeeze(1)  # the host sync
    if rows.numel():
        ids = torch.arange(n, device=embed.device)
        best[rows], partner[rows] = exact_best(embed[rows], rows, embed, ids, block)
    return best, partner, rows.numel()


def buffered_partners(
    embed: torch.Tensor,
    block: int,
    delta: float,
    spare: int,
    keep: int = 3,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`certified_partners` with fixed shapes and no host sync: the GPU path's pairing.

    The first `spare` rows in doubt (by position) are recomputed exactly against every
    column, whether or not any row is in doubt (a fixed `[spare, n]` float64 product). If
    more rows are in doubt, the answer is NOT exact: the caller reads the returned count at
    its one sync and falls back to `certified_partners`.

    Args:
        embed: `[n, d]` float64 exact embeddings of the active tokens, ascending index.
        block: rows per float64 block; the float32 pass takes `2 x block` rows at a time.
        delta: `similarity_bound(d)` (read once by the caller: it queries global settings).
        spare: rows the exact recheck holds (a fixed `[spare, n]` product).
        keep: candidates per row that get an exact similarity.
        valid: `[n]` bool, the rows that take part (None: all). The others (the compiled
            loop's padding) are nobody's partner and never in doubt; their own answer is
            meaningless.

    Returns:
        `(similarity [n] float64, partner [n] position, in_doubt 0-d long)`: exact whenever
        `in_doubt <= spare`.
    """
    n = embed.shape[0]
    best, partner, doubt = _fast_listed(embed, block, keep, delta, valid)
    if valid is not None:
        doubt = doubt & valid
    # Row r in doubt goes to buffer slot (its rank among the rows in doubt); the rest, and
    # rows past the buffer, to the spare slot `spare`, which is then dropped. No Python
    # int that depends on n enters an op, so a compiled round keeps n symbolic.
    rank = torch.cumsum(doubt, 0) - 1
    slot = torch.where(doubt & (rank < spare), rank, spare)
    ids = torch.arange(n, device=embed.device)
    rows = torch.full((spare + 1,), _PAST_END, device=embed.device).scatter_(0, slot, ids)
    used = rows[:spare] < _PAST_END
    rows = torch.where(used, rows[:spare], 0)
    sims = embed[rows] @ embed.T  # [spare, n] float64, exact
    sims.scatter_(1, rows.unsqueeze(1), float("-inf"))  # the own column never wins
    if valid is not None:
        sims.masked_fill_(~valid, float("-inf"))
    exact_sim, exact_pos = sims.max(dim=1)  # ties: the first maximum = smallest index
    # Written one place to the right; unused slots write the spare entry 0, then dropped.
    target = torch.where(used, rows + 1, 0)
    best = torch.nn.functional.pad(best, (1, 0)).scatter_(0, target, exact_sim)[1:]
    partner = torch.nn.functional.pad(partner, (1, 0)).scatter_(0, target, exact_pos)[1:]
    return best, partner, doubt.sum()
