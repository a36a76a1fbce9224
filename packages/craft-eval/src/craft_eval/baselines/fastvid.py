"""FastVID: dynamic temporal segmentation, salient tokens and density-based token merging.

Shen et al., "FastVID: Dynamic Density Pruning for Fast Video Large Language Models", 2025.
Re-stated from the published LLaVA-OneVision code, github.com/LunarShen/FastVID,
`fastvid_llavaonevision/LLaVA-NeXT/llava/model/language_model/modeling_qwen2.py`, lines
912-1061 (commit a40a109):

1. DySeg (912-922): cut the video after the `c - 1` lowest adjacent-frame cosines of the
   frame features (here: the frame's mean token, as the published Qwen2.5-VL variant does)
   and wherever the cosine is below `tau`.
2. STPrune (924-962): each frame keeps `k_f` tokens, `k_f - int(k_f * d)` of them salient
   (top attention received); the other `int(k_f * d)` are its "context" share.
3. Anchor distribution (940-950): in a segment of `L` frames the anchor frames are those
   with `(L - 1 - j) % p == 0` (counted from the END, so the last frame always is one); the
   segment's context total is split equally among them (`ctx * L // ceil(L / p)` each).
4. Density peaks (964-989), per anchor frame over its non-salient tokens:
   `dist = cdist(x, x) / sqrt(D)` on the raw features, density
   `exp(-mean(top4 smallest dist ** 2))` with the zero self-distance INCLUDED, `delta` the
   distance to the nearest denser token (the frame's largest distance for the densest);
   the `count` highest `delta * density` are the anchors.
5. DTM (991-1061): in a multi-frame segment EVERY non-salient token of the segment merges,
   for each anchor frame, into its most similar (cosine) anchor of that frame, the anchor
   itself included; single-frame segments (and `p = 1`) merge within the frame. An anchor
   becomes `w * anchor + (1 - w) * mean(assigned)`, `w = max(1 / (n + 1), beta)`, where the
   mean includes the anchor (the published LLaVA-OneVision variant; `include_anchor=False`
   gives the LLaVA-Video variant's mean over the other tokens only).

Deliberate deviations (listed in docs/baselines.md): the budget is exact by default
(`exact_budget=True`: the `floor(N / ratio)` tokens are split over frames by size and the
segment's anchors over its anchor frames with the remainder going to the earlier ones;
`exact_budget=False` is the published per-frame `int(n_f / ratio)`); the published code
adds `rand * 1e-6` to the density to break ties, here ties go to the smaller index; an
anchor frame asked for more anchors than it has non-salient tokens (the published code
fails there) gives the excess to salient tokens of the segment's other frames.
"""

from __future__ import annotations

import itertools
import math

import torch

from craft_core import CompressionResult
from craft_eval.baselines._common import (
    ATTENTION,
    ATTENTION_NOTE,
    COUNT,
    Checked,
    apportion,
    baseline,
    check_settings,
    finish,
    frames_of,
    most_similar,
    normalized,
    opening,
    top_indices,
)

NAME = "fastvid"


def segment_frames(frame_means: torch.Tensor, segments: int, tau: float) -> list[list[int]]:
    """DySeg: frame indices of each segment, cut at the `segments - 1` lowest adjacent
    similarities and at every similarity below `tau`. `frame_means` is `[T, D]`."""
    t = frame_means.shape[0]
    if t == 1:
        return [[0]]
    g = normalized(frame_means)
    sim = (g[:-1] * g[1:]).sum(dim=-1)
    lowest = top_indices(sim, min(max(0, segments - 1), t - 1), largest=False)
    cuts = sorted(set(lowest.tolist()) | set(torch.nonzero(sim < tau).squeeze(1).tolist()))
    bounds = [0, *(c + 1 for c in cuts), t]
    return [list(range(a, b)) for a, b in itertools.pairwise(bounds)]


def density_peaks(x: torch.Tensor, count: int, knn: int = 4) -> torch.Tensor:
    """DPC-kNN as published: positions of the `count` rows of `x [m, D]` with the highest
    `delta * density`, ascending (ties: the smaller position).

    `dist = cdist(x, x) / sqrt(D)`; density = `exp(-mean of the knn smallest dist^2)` (the
    row's zero distance to itself is one of them); delta = the distance to the nearest row
    of strictly higher density, or the largest distance of the whole matrix for the densest.
    """
    m, dim = x.shape
    if count <= 0 or m == 0:
        return torch.zeros(0, dtype=torch.long, device=x.device)
    dist = torch.cdist(x, x) / (dim**0.5)
    nearest = torch.topk(dist, min(knn, m), dim=-1, largest=False).values
    density = torch.exp(-(nearest**2).mean(dim=-1))
    higher = (density[None, :] > density[:, None]).to(dist.dtype)
    delta = (dist * higher + dist.max() * (1 - higher)).min(dim=-1).values
    return top_indices(delta * density, min(count, m))


def _plan(
    frames_sizes: list[int],
    segs: list[list[int]],
    k: int,
    ratio: float,
    d: float,
    p: int,
    exact: bool,
) -> tuple[list[int], dict[int, int]]:
    """Salient count per frame and anchor count per anchor frame."""
    if exact:
        retain = apportion(k, frames_sizes, frames_sizes)
    else:
        retain = [min(s, int(s * (1.0 / ratio))) for s in frames_sizes]
    salient = [r - int(r * d) for r in retain]
    context = [r - s for r, s in zip(retain, salient)]
    anchors: dict[int, int] = {}
    for seg in segs:
        length = len(seg)
        anchor_frames = [f for j, f in enumerate(seg) if (length - 1 - j) % p == 0]
        if len(anchor_frames) == length:  # single-frame segment or p = 1: per frame
            anchors.update({f: context[f] for f in seg})
            continue
        total = sum(context[f] for f in seg)
        caps = [frames_sizes[f] - salient[f] for f in anchor_frames]
        if exact:  # equal shares, the remainder to the earlier anchor frames
            split = apportion(total, [1.0] * len(anchor_frames), caps)
            spill = total - sum(split)
        else:  # published: `total // ceil(L / p)` each
            share = total // len(anchor_frames)
            split = [min(c, share) for c in caps]
            spill = share * len(anchor_frames) - sum(split)
        anchors.update(dict(zip(anchor_frames, split)))
        if spill > 0:  # the anchor frames are full: the rest become salient elsewhere
            room = [frames_sizes[f] - salient[f] - anchors.get(f, 0) for f in seg]
            for f, extra in zip(seg, apportion(spill, room, room)):
                salient[f] += extra
    return salient, anchors


def _merge(
    x: torch.Tensor, e: torch.Tensor, pool: torch.Tensor, anchors: torch.Tensor, beta: float
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """DTM: every token of `pool` goes to its most similar anchor (first maximum);
    `-> (merged rows [A, D], (each pool token's best cosine, its anchor position))`."""
    sims = e[pool] @ e[anchors].T
    owner = sims.argmax(dim=-1)
    best = sims.gather(1, owner[:, None]).squeeze(1)
    one_hot = torch.nn.functional.one_hot(owner, anchors.numel()).to(x.dtype)
    counts = one_hot.sum(dim=0)[:, None]
    w = (1.0 / (counts + 1.0)).clamp(min=beta)
    mean = (one_hot.T @ x[pool]) / counts.clamp(min=1.0)
    return w * x[anchors] + (1.0 - w) * mean, (best, owner)


@baseline(
    NAME,
    kind="merge",
    needs=("attention",),
    saliency=ATTENTION,
    description="FastVID (published OneVision code): dynamic segments, salient tokens + "
    "density-peak anchors merging segment tokens per anchor frame." + ATTENTION_NOTE,
)
def fastvid(
    features: torch.Tensor,
    coords: torch.Tensor,
    budget: Checked,
    importance: torch.Tensor | None,
    *,
    segments: int = 8,
    tau: float = 0.9,
    d: float = 0.4,
    p: int = 4,
    beta: float = 0.6,
    knn: int = 4,
    include_anchor: bool = True,
    exact_budget: bool = True,
) -> CompressionResult:
    """Keep salient tokens plus merged density-peak anchors (see the module docstring).

    Args:
        features: `[N, D]` one video's tokens; coords: `[N, 3]` `(t, h, w)`.
        importance: `[N]` attention received per token; the L2 norm is the proxy without it
            (`result.info["importance"]` says which ran).
        segments: `c`, the most segments cut at the lowest similarities.
        tau: cut wherever adjacent frames are less similar than this.
        d: share of each frame's budget given to density anchors (`int(k_f * d)`).
        p: anchor frames are every `p`-th frame of a segment, counted from its end.
        beta: floor of the anchor's own weight in its merge.
        knn: neighbours of the DPC-kNN density (self included).
        include_anchor: the anchor counts among its assigned tokens (LLaVA-OneVision code);
            False: the mean is over the other tokens only (LLaVA-Video code).
        exact_budget: exactly `max(1, floor(N / ratio))` tokens (default); False: the
            published per-frame `int(n_f / ratio)` (fewer tokens when that rounds down).

    Non-salient tokens of a frame that merges into no anchor (a zero context share) are
    dropped, as published; `assignment` points them at their most similar kept token.
    """
    check_settings(
        NAME, d=(d, "in [0, 1]"), p=(p, COUNT), segments=(segments, COUNT), knn=(knn, COUNT)
    )
    settings = dict(segments=segments, tau=tau, d=d, p=p, beta=beta, knn=knn)
    settings |= {"include_anchor": include_anchor, "exact_budget": exact_budget}
    scores, info, done = opening(NAME, features, coords, budget, importance, settings)
    if done is not None:
        return done
    k = budget.floor
    frames = frames_of(coords)
    x = features.float()
    e = normalized(x)
    segs = segment_frames(torch.stack([x[m].mean(dim=0) for m in frames.members]), segments, tau)
    salient, anchor_counts = _plan(frames.sizes, segs, k, budget.ratio, d, p, exact_budget)
    kept, rows, representative = _keep_and_merge(
        x, e, scores, frames.members, segs, salient, anchor_counts, (knn, include_anchor, beta)
    )
    info["segments"] = [len(s) for s in segs]
    return finish(NAME, features, coords, kept, representative, rows, info=info)


def _keep_and_merge(
    x: torch.Tensor,
    e: torch.Tensor,
    scores: torch.Tensor,
    members: list[torch.Tensor],
    segs: list[list[int]],
    salient: list[int],
    anchor_counts: dict[int, int],
    merging: tuple[int, bool, float],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The salient tokens of every frame, then each segment's anchors merging the rest.
    -> (kept `[K]`, their rows `[K, D]`, representative `[N]` of every token)."""
    n = x.shape[0]
    kept_parts, row_parts, rest = _salient(x, scores, members, salient)
    representative = torch.arange(n, device=x.device)
    best = torch.full((n,), -math.inf, device=x.device)  # similarity to the chosen anchor
    for seg in segs:
        anchors, rows = _segment_anchors(
            x, e, seg, rest, anchor_counts, merging, representative, best
        )
        kept_parts += anchors
        row_parts += rows
    kept = torch.cat(kept_parts)
    _adopt_unmerged(e, kept, representative, best)
    return kept, torch.cat(row_parts), representative


def _adopt_unmerged(
    e: torch.Tensor, kept: torch.Tensor, representative: torch.Tensor, best: torch.Tensor
) -> None:
    """Kept tokens represent themselves; a token that merged into no anchor (dropped, as
    published) points at its most similar kept token. Updates `representative` in place."""
    representative[kept] = kept
    merged = torch.isfinite(best)
    merged[kept] = True
    if not bool(merged.all()):
        lost = torch.nonzero(~merged).squeeze(1)
        representative[lost] = kept[most_similar(e[lost], e[kept])]


def _salient(
    x: torch.Tensor, scores: torch.Tensor, members: list[torch.Tensor], salient: list[int]
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Per frame: its `salient[f]` top-scored tokens (kept as they are) and the rest.
    -> (kept indices, their rows, the non-salient tokens, ascending) per frame."""
    kept_parts, row_parts, rest = [], [], []
    for f, frame in enumerate(members):
        pos = top_indices(scores[frame], salient[f])
        mask = torch.ones(frame.numel(), dtype=torch.bool, device=x.device)
        mask[pos] = False
        kept_parts.append(frame[pos])
        row_parts.append(x[frame[pos]])
        rest.append(frame[mask])
    return kept_parts, row_parts, rest


def _segment_anchors(
    x: torch.Tensor,
    e: torch.Tensor,
    seg: list[int],
    rest: list[torch.Tensor],
    anchor_counts: dict[int, int],
    merging: tuple[int, bool, float],
    representative: torch.Tensor,
    best: torch.Tensor,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One segment's density-peak anchors and their merged rows; updates `representative`
    and `best` (`[N]`: each token's similarity to the anchor it merged into) in place.
    `merging`: the settings `(knn, include_anchor, beta)`."""
    knn, include_anchor, beta = merging
    n = x.shape[0]
    per_frame = all(f in anchor_counts for f in seg)  # one frame, or p = 1
    chosen = {
        f: rest[f][density_peaks(x[rest[f]], anchor_counts[f], knn)]
        for f in seg
        if anchor_counts.get(f, 0) > 0
    }
    seg_pool = torch.cat([rest[f] for f in seg])
    if not include_anchor and chosen:  # LLaVA-Video: kept tokens do not merge
        is_anchor = torch.zeros(n, dtype=torch.bool, device=x.device)
        is_anchor[torch.cat(list(chosen.values()))] = True
    kept_parts, row_parts = [], []
    for f, anchors in chosen.items():
        pool = rest[f] if per_frame else seg_pool
        if not include_anchor:
            pool = pool[~is_anchor[pool]]
        row, rep = _merge(x, e, pool, anchors, beta)
        kept_parts.append(anchors)
        row_parts.append(row)
        if pool.numel():
            sims, owner = rep
            better = sims > best[pool]
            best[pool[better]] = sims[better]
            representative[pool[better]] = anchors[owner[better]]
    return kept_parts, row_parts
