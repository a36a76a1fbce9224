"""LLaVA-Scissor: semantic connected components, per frame and then across frames.

Sun et al., "LLaVA-Scissor: Token Compression with Semantic Connected Components for Video
LLMs", 2025.
1. Per frame: a graph with an edge wherever the cosine exceeds `tau`; every connected
   component is averaged into one representative.
2. The same over all frames' representatives together (each component of representatives
   averaged).
3. Every original token is assigned to its most similar representative and each
   representative becomes `(rep + sum assigned) / (n + 1)`.

Threshold mode is the published one (`threshold = tau`, default 0.9; no floor unless
`min_tokens` is given, then padded up to it). The fixed-ratio mode
searches `tau` by bisection so that step 2 lands on the budget; where no `tau` gives the
exact count (the count jumps, or all tokens are alike) the nearest count above is trimmed
(the representatives of the fewest tokens are dropped) or the count below padded (the tokens
least similar to their representative become representatives of their own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from craft_core import CompressionResult
from craft_eval.baselines._common import (
    Checked,
    Frames,
    baseline,
    finish,
    frames_of,
    identity,
    most_similar,
    normalized,
    top_indices,
)

NAME = "llava-scissor"

#: Bisection steps of the budgeted mode's search over tau in [-1, 1].
SEARCH_STEPS = 24


def connected_components(sims: torch.Tensor, tau: float) -> torch.Tensor:
    """Component id (0..C-1, numbered by smallest member) of every node of the graph with an
    edge wherever `sims > tau`. Exact: min-label propagation over the edge list with pointer
    jumping.

    The published `approximate_components` (github.com/HumanMLLM/LLaVA-Scissor,
    `llava/model/llava_arch_zip.py`, lines 73-129, commit b63354c) differs in two ways: it unions only the
    edges of about log(n)/eps^2 sampled nodes (every node below about 3,300 nodes at
    eps = 0.05), and it collects a component as `np.where(uf.parent == root)`, the nodes
    whose parent IS the root, so a node two or more links below its root (union by rank
    without a final path compression) belongs to no component and is lost. Here every node
    is in exactly one component (a deliberate deviation; see docs/baselines.md)."""
    n = sims.shape[0]
    one_way = torch.nonzero(sims > tau).T  # made symmetric: the graph is undirected
    src, dst = torch.cat([one_way[0], one_way[1]]), torch.cat([one_way[1], one_way[0]])
    labels = torch.arange(n, device=sims.device)
    while True:
        new = labels.scatter_reduce(0, src, labels[dst], reduce="amin", include_self=True)
        while True:  # pointer jumping: every label is a node of the same component
            jumped = new[new]
            if torch.equal(jumped, new):
                break
            new = jumped
        if torch.equal(new, labels):
            break
        labels = new
    return torch.unique(labels, return_inverse=True)[1]


def _group_mean(values: torch.Tensor, group: torch.Tensor, count: int) -> torch.Tensor:
    sums = torch.zeros(count, values.shape[1], device=values.device).index_add(0, group, values)
    sizes = torch.bincount(group, minlength=count).clamp(min=1).float()
    return sums / sizes[:, None]


@dataclass
class ScissorPlan:
    """LLaVA-Scissor's grouping of one video, before the final fusion.

    Attributes:
        reps: `[K, D]` float32 representatives after steps 1-2 (and any trim / pad).
        anchors: `[K]` original index of the token that stands for each representative (the
            member of its component most similar to it; its position is the output's).
        representative: `[N]` the anchor every token is assigned to (its most similar
            representative; each anchor to itself).
        tau: the threshold that ran.
        adjusted: tokens trimmed (> 0) or padded (< 0) to land on the budget.
    """

    reps: torch.Tensor
    anchors: torch.Tensor
    representative: torch.Tensor
    tau: float
    adjusted: int


class _Grouper:
    """Steps 1-2 for any tau, reusing each frame's similarity matrix.

    With `gram=True` (the budgeted search, which runs steps 1-2 many times) the Gram matrix
    `X X^T` of the tokens is computed once and every step-1 representative's similarities
    come from it (`M G M^T` for the averaging matrix `M`, O(N^2) per call) instead of a
    fresh `R x R x D` product per call (R is close to N at the taus that matter).
    """

    def __init__(self, x: torch.Tensor, e: torch.Tensor, frames: Frames, *, gram: bool) -> None:
        self.x, self.frames = x, frames
        self.gram = x @ x.T if gram else None
        self.cosine: torch.Tensor | None = None  # the tokens' cosines, built when needed
        if self.gram is None:
            self.frame_sims = [e[m] @ e[m].T for m in frames.members]
        else:
            norm = self.norm = self.gram.diagonal().clamp(min=1e-24).sqrt()
            self.frame_sims = [
                self.gram[m][:, m] / (norm[m][:, None] * norm[m][None, :]) for m in frames.members
            ]
        self.cache: dict[float, tuple[torch.Tensor, torch.Tensor]] = {}

    def _steps(self, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
        """`(group1 [N], comp2 [R1])`: each token's step-1 group, each step-1 group's
        step-2 group (both numbered from 0)."""
        if tau in self.cache:
            return self.cache[tau]
        n, device = self.x.shape[0], self.x.device
        group1 = torch.empty(n, dtype=torch.long, device=device)
        count1 = 0
        for members, sims in zip(self.frames.members, self.frame_sims):
            comp = connected_components(sims, tau)
            group1[members] = comp + count1
            count1 += int(comp.max()) + 1
        if self.gram is None:
            e1 = normalized(_group_mean(self.x, group1, count1))
            sims1 = e1 @ e1.T
        elif torch.equal(group1, torch.arange(n, device=device)):  # step 1 merged nothing
            if self.cosine is None:
                self.cosine = self.gram / (self.norm[:, None] * self.norm[None, :])
            sims1 = self.cosine
        else:
            sizes = torch.bincount(group1, minlength=count1).float()
            rows = torch.zeros(count1, n, device=device).index_add(0, group1, self.gram)
            rows /= sizes[:, None]
            gram1 = torch.zeros(count1, count1, device=device).index_add(1, group1, rows)
            gram1 /= sizes[None, :]
            norm1 = gram1.diagonal().clamp(min=1e-24).sqrt()
            sims1 = gram1 / (norm1[:, None] * norm1[None, :])
        self.cache = {tau: (group1, connected_components(sims1, tau))}
        return self.cache[tau]

    def count(self, tau: float) -> int:
        """Number of step-2 groups at `tau`."""
        return int(self._steps(tau)[1].max()) + 1

    def representatives(self, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
        """`(reps [R, D], group [N])` at `tau`: step 2's averages of step 1's averages."""
        group1, comp2 = self._steps(tau)
        reps1 = _group_mean(self.x, group1, comp2.numel())
        return _group_mean(reps1, comp2, int(comp2.max()) + 1), comp2[group1]


def scissor_plan(
    features: torch.Tensor,
    coords: torch.Tensor,
    *,
    floor: int,
    threshold: float | None,
    search_steps: int = SEARCH_STEPS,
) -> ScissorPlan:
    """Group the tokens as LLaVA-Scissor does.

    With `threshold`, `tau = threshold` and the count is never below `floor` (padded).
    Without it, `tau` is searched so that the count is exactly `floor` (trimmed or padded
    when the search cannot land on it).
    """
    n = features.shape[0]
    x = features.float()
    e = normalized(x)
    grouper = _Grouper(x, e, frames_of(coords), gram=threshold is None)
    tau = float(threshold) if threshold is not None else _search_tau(grouper, floor, search_steps)
    reps, group = grouper.representatives(tau)

    # the member of each component most similar to its representative stands for it
    er = normalized(reps)
    closeness = (e * er[group]).sum(dim=-1)
    order = torch.sort(closeness, descending=True, stable=True).indices
    order = order[torch.sort(group[order], stable=True).indices]  # by group, best first
    starts = torch.ones(n, dtype=torch.bool, device=x.device)
    starts[1:] = group[order][1:] != group[order][:-1]
    anchors = order[starts]  # one per group, in group order (ties: smaller index)

    adjusted = 0
    count = reps.shape[0]
    if threshold is None and count > floor:  # trim: drop the smallest components
        sizes = torch.bincount(group, minlength=count)
        by_anchor = torch.argsort(anchors)
        keep = by_anchor[torch.sort(sizes[by_anchor], descending=True, stable=True).indices]
        keep = torch.sort(keep[:floor]).values
        reps, anchors, adjusted = reps[keep], anchors[keep], count - floor
    elif count < floor:  # pad: the tokens least like their representative stand alone
        free = torch.ones(n, dtype=torch.bool, device=x.device)
        free[anchors] = False
        candidates = torch.nonzero(free).squeeze(1)
        extra = candidates[top_indices(closeness[candidates], floor - count, largest=False)]
        reps = torch.cat([reps, x[extra]])
        anchors = torch.cat([anchors, extra])
        adjusted = count - floor

    owner = anchors[most_similar(e, normalized(reps))]
    owner[anchors] = anchors
    return ScissorPlan(reps, anchors, owner, tau, adjusted)


def _search_tau(grouper: _Grouper, floor: int, search_steps: int) -> float:
    """Bisect `tau` in [-1, 1] for a component count of exactly `floor` (the smallest tau
    found with a count of at least `floor` when it cannot land on it)."""
    lo, hi = -1.0, 1.0
    for _ in range(search_steps):
        mid = (lo + hi) / 2
        count = grouper.count(mid)
        if count >= floor:
            hi = mid
        else:
            lo = mid
        if count == floor:
            break
    return hi


def plan_groups(
    features: torch.Tensor, coords: torch.Tensor, budget: Checked, *, search_steps: int
) -> tuple[ScissorPlan | None, dict[str, Any]]:
    """The LLaVA-Scissor grouping shared by `llava-scissor` and `scissor-merge`:
    `(plan, info)`, with no plan when a fixed budget keeps every token."""
    info: dict[str, Any] = {"importance": None}
    if budget.threshold is None and budget.floor >= features.shape[0]:
        info["settings"] = {"mode": "budget"}
        return None, info
    # threshold mode: no floor unless min_tokens is given (the published method has none)
    no_floor = budget.threshold is not None and budget.given.min_tokens is None
    plan = scissor_plan(
        features,
        coords,
        floor=1 if no_floor else budget.floor,
        threshold=budget.threshold,
        search_steps=search_steps,
    )
    info["settings"] = {
        "mode": "threshold" if budget.threshold is not None else "budget",
        "tau": plan.tau,
        "components": "exact",
    }
    info["adjusted"] = plan.adjusted
    return plan, info


@baseline(
    NAME,
    kind="merge",
    description="LLaVA-Scissor: semantic connected components (threshold=tau, published 0.9, "
    "no floor unless min_tokens=; ratio= searches tau for the exact count).",
    adaptive=True,
)
def llava_scissor(
    features: torch.Tensor,
    coords: torch.Tensor,
    budget: Checked,
    importance: torch.Tensor | None,
    *,
    search_steps: int = SEARCH_STEPS,
) -> CompressionResult:
    """LLaVA-Scissor in its own mode (`threshold=tau`, published 0.9; never below
    `min_tokens` when it is given, no floor otherwise) or budgeted (`ratio=`: exactly
    `max(1, floor(N / ratio))` tokens, tau searched). Each output token sits at its
    anchor's original position. `importance` is ignored."""
    plan, info = plan_groups(features, coords, budget, search_steps=search_steps)
    if plan is None:
        return identity(NAME, features, coords, info)
    rows = _final_rows(features.float(), plan)
    return finish(NAME, features, coords, plan.anchors, plan.representative, rows, info=info)


def _final_rows(x: torch.Tensor, plan: ScissorPlan) -> torch.Tensor:
    """`(rep + sum of assigned tokens) / (n + 1)` for every representative."""
    slot = torch.full((x.shape[0],), -1, dtype=torch.long, device=x.device)
    slot[plan.anchors] = torch.arange(plan.anchors.numel(), device=x.device)
    target = slot[plan.representative]
    k = plan.anchors.numel()
    sums = torch.zeros(k, x.shape[1], device=x.device).index_add(0, target, x)
    counts = torch.bincount(target, minlength=k).float()
    return (plan.reps + sums) / (counts + 1.0)[:, None]
