"""FastVID: dynamic temporal segmentation, salient tokens and density-based token merging.

Shen et al., "FastVID: Dynamic Density Pruning for Fast Video Large Language Models", 2025.
1. Segment the video at the `c - 1` lowest adjacent-frame similarities (frame = mean token,
   cosine) and wherever the similarity is below `tau`.
2. Each frame's budget `k_f` (the total split in proportion to frame sizes) keeps a salient
   share `1 - d` by attention received.
3. The rest of a segment's budget becomes density-peak anchors (DPC-kNN, `k = 4`) chosen
   among the non-salient tokens of every `p`-th frame of the segment; every other
   non-salient token of the segment merges into its most similar anchor:
   `anchor = w * anchor + (1 - w) * mean(assigned)`, `w = max(1 / (n + 1), beta)`.
"""

from __future__ import annotations

import itertools

import torch

from craft_core import CompressionResult
from craft_eval.baselines._common import (
    apportion,
    finish,
    frames_of,
    group_sum,
    identity,
    importance_scores,
    most_similar,
    normalized,
    prepare,
    top_indices,
)

NAME = "fastvid"


def segment_frames(frame_means: torch.Tensor, segments: int, tau: float) -> list[list[int]]:
    """DySeg: frame indices of each segment, cut at the `segments - 1` lowest adjacent
    similarities and at every similarity below `tau`."""
    t = frame_means.shape[0]
    if t == 1:
        return [[0]]
    g = normalized(frame_means)
    sim = (g[:-1] * g[1:]).sum(dim=-1)
    lowest = top_indices(sim, min(max(0, segments - 1), t - 1), largest=False)
    cuts = sorted(set(lowest.tolist()) | set(torch.nonzero(sim < tau).squeeze(1).tolist()))
    bounds = [0, *(c + 1 for c in cuts), t]
    return [list(range(a, b)) for a, b in itertools.pairwise(bounds)]


def density_peaks(e: torch.Tensor, count: int, knn: int) -> torch.Tensor:
    """DPC-kNN: positions of the `count` rows with the highest density x distance score.

    density = exp(-mean squared distance to the k nearest neighbours); distance = the
    distance to the nearest row of higher density (the largest distance for the densest).
    Distances are Euclidean between the L2-normalised rows. Ties go to the smaller position.
    """
    m = e.shape[0]
    dist = (2.0 - 2.0 * (e @ e.T)).clamp(min=0.0).sqrt()
    k = min(knn, m - 1)
    if k > 0:
        near = torch.topk(dist, k + 1, dim=-1, largest=False).values[:, 1:]
        density = torch.exp(-(near**2).mean(dim=-1))
    else:
        density = torch.ones(m, device=e.device)
    higher = density[None, :] > density[:, None]
    delta = dist.masked_fill(~higher, float("inf")).min(dim=-1).values
    no_higher = ~higher.any(dim=-1)
    delta[no_higher] = dist[no_higher].max(dim=-1).values
    return top_indices(density * delta, count)


def fastvid(
    features: torch.Tensor,
    coords: torch.Tensor,
    *,
    ratio: float | None = None,
    threshold: float | None = None,
    min_tokens: int | None = None,
    importance: torch.Tensor | None = None,
    segments: int = 8,
    tau: float = 0.9,
    d: float = 0.4,
    p: int = 4,
    beta: float = 0.6,
    knn: int = 4,
) -> CompressionResult:
    """Keep exactly `max(1, floor(N / ratio))` tokens: salient ones plus merged anchors.

    Args:
        importance: `[N]` attention received per token; the L2 norm is the proxy without it.
        segments: `c`, the most segments cut at the lowest similarities.
        tau: cut wherever adjacent frames are less similar than this.
        d: share of each frame's budget given to density anchors (the rest is salient).
        p: anchors are drawn from every `p`-th frame of a segment.
        beta: floor of the anchor's own weight in its merge.
        knn: neighbours of the DPC-kNN density.

    If a segment's anchor frames hold fewer non-salient tokens than its anchor budget, the
    anchors are drawn from all of its non-salient tokens. A segment whose budget is all
    salient gives one salient slot to an anchor so that its other tokens have somewhere to
    merge; a segment with no budget at all (budget below the segment count) is pruned and
    its tokens are assigned to the most similar kept token of the video.
    """
    if not 0.0 <= d <= 1.0:
        raise ValueError(f"d must lie in [0, 1], got {d}")
    if p < 1 or segments < 1 or knn < 1:
        raise ValueError(f"p, segments and knn must be >= 1, got {p}, {segments}, {knn}")
    budget = prepare(
        NAME, features, coords, ratio=ratio, threshold=threshold, min_tokens=min_tokens
    )
    n = features.shape[0]
    scores, proxy = importance_scores(features, importance)
    settings = {"segments": segments, "tau": tau, "d": d, "p": p, "beta": beta, "knn": knn}
    info: dict = {"settings": settings, "importance": proxy}
    k = budget.floor
    if k >= n:
        return identity(NAME, features, coords, info)

    frames = frames_of(coords)
    x = features.float()
    e = normalized(x)
    frame_means = torch.stack([x[m].mean(dim=0) for m in frames.members])
    segs = segment_frames(frame_means, segments, tau)
    budgets = apportion(k, frames.sizes, frames.sizes)
    salient_counts = [min(k_f, round(k_f * (1.0 - d))) for k_f in budgets]

    representative = torch.arange(n, device=x.device)
    kept_parts: list[torch.Tensor] = []
    row_parts: list[torch.Tensor] = []
    orphans: list[torch.Tensor] = []
    for seg in segs:
        seg_budget = sum(budgets[f] for f in seg)
        anchors_wanted = seg_budget - sum(salient_counts[f] for f in seg)
        has_leftovers = sum(frames.sizes[f] for f in seg) > seg_budget
        if seg_budget > 0 and anchors_wanted == 0 and has_leftovers:
            donor = max(seg, key=lambda f: (salient_counts[f], -f))
            salient_counts[donor] -= 1
            anchors_wanted = 1
        rest_by_frame = []
        for f in seg:
            members = frames.members[f]
            salient_pos = top_indices(scores[members], salient_counts[f])
            mask = torch.ones(members.numel(), dtype=torch.bool, device=x.device)
            mask[salient_pos] = False
            kept_parts.append(members[salient_pos])
            row_parts.append(x[members[salient_pos]])
            rest_by_frame.append(members[mask])
        rest = torch.cat(rest_by_frame)
        if rest.numel() == 0:
            continue
        if anchors_wanted == 0:
            orphans.append(rest)
            continue
        pool = torch.cat(rest_by_frame[::p])
        if pool.numel() < anchors_wanted:
            pool = rest
        anchors = torch.sort(pool[density_peaks(e[pool], anchors_wanted, knn)]).values
        is_anchor = torch.zeros(n, dtype=torch.bool, device=x.device)
        is_anchor[anchors] = True
        others = rest[~is_anchor[rest]]
        owner = most_similar(e[others], e[anchors])
        sums = group_sum(x[others], owner, anchors.numel())
        counts = torch.bincount(owner, minlength=anchors.numel()).float()
        w = torch.clamp(1.0 / (counts + 1.0), min=beta)[:, None]
        merged = w * x[anchors] + (1.0 - w) * sums / counts.clamp(min=1.0)[:, None]
        merged = torch.where(counts[:, None] > 0, merged, x[anchors])
        representative[others] = anchors[owner]
        kept_parts.append(anchors)
        row_parts.append(merged)

    kept = torch.cat(kept_parts)
    if orphans:
        lost = torch.cat(orphans)
        representative[lost] = kept[most_similar(e[lost], e[kept])]
    info["segments"] = [len(s) for s in segs]
    return finish(NAME, features, coords, kept, representative, torch.cat(row_parts), info=info)
