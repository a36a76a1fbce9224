"""FlashVID's stage before the language model: scenes, attention-diversity picks, a tree merge
along time, then density-peak clusters.

Fan et al., "FlashVID", ICLR 2026 (arXiv 2602.08024). Re-stated from the official code,
github.com/Fanziyang-v/FlashVID at commit 1d37422c5afcaa15ee46b5355f5ba798fa93290a:

1. `flashvid/utils.py:segment` / `additional_segment`: cut after every adjacent pair of frame
   means (the frame's mean token) whose cosine is below `segment_threshold`; with fewer than
   `min_segment_num` segments, also cut at the lowest remaining cosines.
2. `flashvid/utils.py:flashvid_compression`: each frame's budget `B = ceil(n_f / ratio)`
   (the official `ceil(n * retention * expansion)`: `ratio = 1 / (retention * expansion)`),
   `ceil(B * alpha)` of them picked by ADTS, the rest (`B - ceil(B * alpha)` per frame,
   summed over the segment) left for the merge.
3. `flashvid/token_selection.py:attn_div_based_token_selection` (ADTS, per frame): distance
   `(1 - cos(i, j)) * a_j` (a = attention received); the first pick is the token whose
   second-smallest distance over the column is largest, then repeatedly the token whose
   smallest distance to the picked ones is largest (picked ones set to -1).
4. `flashvid/utils.py:spatiotemporal_compression` (the tree merge, per multi-frame segment):
   each unpicked token of frame f > 0 finds its most similar unpicked token of frame f - 1
   (cosine of the original features); it merges into it when the cosine exceeds
   `temporal_threshold`, lowered (`soft_threshold`) when fewer than the segment's budget
   would survive; merging runs from the last frame back, a token's row being the sum of its
   subtree divided by its count.
5. `flashvid/utils.py:segment_compression` + `dpc_knn`: the surviving unpicked tokens of
   each frame are clustered by DPC-kNN (`k = min(clusters, 7)`) into `ceil(m_f * c)`
   clusters, `c` = the segment's merge budget over its survivors (all kept when `c >= 1`),
   each cluster the mean of its members, placed at its centre.

Deliberate deviations (craft-eval's docs/baselines.md, FlashVID): `tree_mean=True` (default) divides a
merged tree by the number of tokens in it, where the official code counts each merged
child as 1 whatever it carried (`tree_mean=False` runs that); a one-frame segment clusters
its unpicked tokens only (the official code clusters all of them, picked ones again, so an
index can be kept twice); duplicated cuts (videos shorter than `min_segment_num`) are cut
once; ties go to the smaller index where the official code adds `rand * 1e-6` to the
density; the budget is exact by default (`exact_budget=True`: the `floor(N / ratio)` tokens
split over frames by size, each segment's merge budget over its frames' survivors by
largest remainder). The stage inside the language model is `flashvid-llm`
(`craft_eval.baselines.in_model`).
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

NAME = "flashvid"


def flashvid_segments(
    frame_means: torch.Tensor, threshold: float, min_segments: int
) -> list[list[int]]:
    """Frame indices of each segment (`flashvid/utils.py:segment`). `frame_means [T, D]`."""
    t = frame_means.shape[0]
    if t == 1:
        return [[0]]
    g = normalized(frame_means)
    sim = (g[:-1] * g[1:]).sum(dim=-1)
    cuts = set(torch.nonzero(sim < threshold).squeeze(1).tolist())
    missing = min_segments - (len(cuts) + 1)
    if missing > 0:
        filled = torch.where(sim < threshold, torch.ones_like(sim), sim)
        cuts |= set(top_indices(filled, min(missing, t - 1), largest=False).tolist())
    bounds = [0, *(c + 1 for c in sorted(cuts)), t]
    return [list(range(a, b)) for a, b in itertools.pairwise(bounds)]


def adts(x: torch.Tensor, scores: torch.Tensor, count: int) -> torch.Tensor:
    """Attention-and-diversity picks of one frame: `count` positions of `x [n, D]`, ascending.

    `dist[i, j] = (1 - cos(x_i, x_j)) * scores[j]`; first the column with the largest
    second-smallest entry, then the token farthest (min over the picked rows) from the
    picked set. Ties: the smaller position.
    """
    n = x.shape[0]
    count = min(count, n)
    if count <= 0:
        return torch.zeros(0, dtype=torch.long, device=x.device)
    e = normalized(x)
    dist = (1.0 - e @ e.T) * (scores.float() * 1e6)[None, :]
    first = torch.sort(dist, dim=0).values[min(1, n - 1)]
    picked = [int(torch.argmax(first))]
    nearest = dist[picked[0]].clone()
    for _ in range(1, count):
        nearest = torch.minimum(nearest, dist[picked[-1]])
        gap = nearest.clone()
        gap[picked] = -1.0
        picked.append(int(torch.argmax(gap)))
    return torch.sort(torch.tensor(picked, device=x.device)).values


def tree_merge(
    x: torch.Tensor,
    e: torch.Tensor,
    frames: list[torch.Tensor],
    free: list[torch.Tensor],
    floor: int,
    settings: tuple[float, bool],
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """The tree merge along time of one segment (`spatiotemporal_compression`).

    Args:
        frames: the segment's frames, each `[n_f]` token indices; free: each frame's
            unpicked tokens (ascending). floor: the segment's budget (picks included).
        settings: `(temporal_threshold, tree_mean)`.

    Returns: the surviving unpicked tokens per frame, every token's parent (`[N]`, itself
    for a survivor or a token outside the segment) and the rows `[N, D]` of the survivors.
    """
    threshold, tree_mean = settings
    best = torch.full((x.shape[0],), -1.0, device=x.device)
    parent = torch.arange(x.shape[0], device=x.device)
    for f in range(1, len(frames)):
        if free[f].numel() and free[f - 1].numel():
            sims = e[free[f]] @ e[free[f - 1]].T
            value, arg = sims.max(dim=-1)
            best[free[f]], parent[free[f]] = value, free[f - 1][arg]
    segment = torch.cat(frames)
    merges = best[segment] > threshold
    if int((~merges).sum()) < floor:  # official `soft_threshold`
        room = segment.numel() - floor
        soft = torch.sort(best[segment], descending=True).values[room - 1] if room > 0 else 1.0
        merges = best[segment] > max(float(soft), -1.0 + 1e-6)
    merged = torch.zeros_like(best, dtype=torch.bool)
    merged[segment[merges]] = True
    parent[~merged] = torch.arange(x.shape[0], device=x.device)[~merged]
    total, count = x.clone(), torch.ones(x.shape[0], device=x.device)
    for f in range(len(frames) - 1, 0, -1):
        moving = frames[f][merged[frames[f]]]
        total.index_add_(0, parent[moving], total[moving])
        weight = count[moving] if tree_mean else torch.ones_like(count[moving])
        count.index_add_(0, parent[moving], weight)
    survivors = [fr[~merged[fr]] for fr in free]
    return survivors, parent, total / count[:, None]


def density_peaks(rows: torch.Tensor, count: int, knn: int) -> torch.Tensor:
    """DPC-kNN centres (`flashvid/utils.py:dpc_knn`, HoliTom's `cluster_dpc_knn`): the
    `count` rows of `rows [m, D]` with the highest `delta * density`, ascending.

    `dist = cdist / sqrt(D)`, computed pair by pair (the same bits on every machine);
    density `exp(-mean of the knn smallest dist^2)` (the zero self-distance included);
    `delta` the distance to the nearest denser row, the largest distance for the densest.
    Equal densities (a mutual-nearest pair has them) are ordered by index, the smaller
    denser, where the official code adds `rand * 1e-6`; equal scores go to the smaller index.
    """
    m, dim = rows.shape
    dist = torch.cdist(rows, rows, compute_mode="donot_use_mm_for_euclid_dist") / dim**0.5
    nearest = torch.topk(dist, min(knn, m), dim=-1, largest=False).values
    density = torch.exp(-(nearest**2).mean(dim=-1))
    index = torch.arange(m, device=rows.device)
    denser = (density[None, :] > density[:, None]) | (
        (density[None, :] == density[:, None]) & (index[None, :] < index[:, None])
    )
    delta = torch.where(denser, dist, dist.max()).min(dim=-1).values
    return top_indices(delta * density, min(count, m))


def cluster(rows: torch.Tensor, count: int, knn: int) -> tuple[torch.Tensor, torch.Tensor]:
    """DPC-kNN of `rows [m, D]` into `count` clusters (`flashvid/utils.py:dpc_knn`).

    Returns the centre positions (ascending) and each row's cluster `[m]` (index into the
    centres: the nearest, a centre its own).
    """
    centres = density_peaks(rows, count, min(count, knn))
    dist = torch.cdist(rows, rows[centres], compute_mode="donot_use_mm_for_euclid_dist")
    owner = dist.argmin(dim=-1)
    owner[centres] = torch.arange(centres.numel(), device=rows.device)
    return centres, owner


@baseline(
    NAME,
    kind="merge",
    needs=("attention",),
    saliency=ATTENTION,
    description="FlashVID (official code, before the LLM): scene segments, attention-diversity "
    "picks per frame, a tree merge along time, DPC-kNN clusters." + ATTENTION_NOTE,
)
def flashvid(
    features: torch.Tensor,
    coords: torch.Tensor,
    budget: Checked,
    importance: torch.Tensor | None,
    *,
    alpha: float = 0.7,
    temporal_threshold: float = 0.8,
    segment_threshold: float = 0.9,
    min_segments: int = 8,
    knn: int = 7,
    tree_mean: bool = True,
    exact_budget: bool = True,
) -> CompressionResult:
    """FlashVID before the language model (see the module docstring).

    Args:
        features: `[N, D]` one video's tokens; coords: `[N, 3]` `(t, h, w)`.
        importance: `[N]` attention received per token (L2-norm proxy without it).
        alpha: share of each frame's budget picked by ADTS (`ceil(B * alpha)`).
        temporal_threshold: cosine above which a token merges into the previous frame.
        segment_threshold: cut between frames whose mean tokens are less similar.
        min_segments: at least this many segments (cut at the lowest similarities).
        knn: the most neighbours of the DPC-kNN density (`min(clusters, knn)`).
        tree_mean: a merged tree is the mean of its tokens; False: the official count.
        exact_budget: exactly `max(1, floor(N / ratio))` tokens; False: the official counts.
    """
    check_settings(
        NAME, alpha=(alpha, "in [0, 1]"), min_segments=(min_segments, COUNT), knn=(knn, COUNT)
    )
    settings = dict(alpha=alpha, temporal_threshold=temporal_threshold, knn=knn)
    settings |= dict(segment_threshold=segment_threshold, min_segments=min_segments)
    settings |= dict(tree_mean=tree_mean, exact_budget=exact_budget)
    scores, info, done = opening(NAME, features, coords, budget, importance, settings)
    if done is not None:
        return done
    frames = frames_of(coords).members
    x = features.float()
    segs = flashvid_segments(
        torch.stack([x[m].mean(dim=0) for m in frames]), segment_threshold, min_segments
    )
    sizes = [int(m.numel()) for m in frames]
    per_frame = (
        apportion(budget.floor, sizes, sizes)
        if exact_budget
        else [min(s, math.ceil(s * (1.0 / budget.ratio))) for s in sizes]
    )
    picks = [min(b, math.ceil(b * alpha)) for b in per_frame]
    kept, rows, representative = _compress(x, scores, frames, segs, (per_frame, picks), settings)
    info["segments"] = [len(s) for s in segs]
    return finish(NAME, features, coords, kept, representative, rows, info=info)


def _compress(
    x: torch.Tensor,
    scores: torch.Tensor,
    frames: list[torch.Tensor],
    segs: list[list[int]],
    plan: tuple[list[int], list[int]],
    settings: dict,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Picks, tree merge and clusters of every segment.
    -> (kept `[K]`, their rows `[K, D]`, representative `[N]`)."""
    per_frame, picks = plan
    e = normalized(x)
    picked = [m[adts(x[m], scores[m], p)] for m, p in zip(frames, picks, strict=True)]
    kept, rows = list(picked), [x[p] for p in picked]
    representative = torch.arange(x.shape[0], device=x.device)
    for seg in segs:
        members = [frames[f] for f in seg]
        free = [_unpicked(frames[f], picked[f]) for f in seg]
        budget = sum(per_frame[f] - picks[f] for f in seg)
        if budget <= 0 or settings["temporal_threshold"] >= 1.0:
            continue
        if len(seg) > 1:
            floor = sum(per_frame[f] for f in seg)
            tree = (settings["temporal_threshold"], settings["tree_mean"])
            free, parent, merged_rows = tree_merge(x, e, members, free, floor, tree)
            _follow(parent, representative, members)
        else:
            merged_rows = x
        for centres, centre_rows, owner, pool in _segment_clusters(
            merged_rows, free, budget, settings
        ):
            kept.append(centres)
            rows.append(centre_rows)
            representative[pool] = centres[owner]
    representative = representative[representative]  # tree roots into their clusters
    kept_all = torch.cat(kept)
    _adopt_dropped(e, kept_all, representative)
    return kept_all, torch.cat(rows), representative


def _unpicked(frame: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    """The tokens of `frame [n_f]` not in `picked`, ascending."""
    return frame[~torch.isin(frame, picked)]


def _follow(parent: torch.Tensor, representative: torch.Tensor, frames: list[torch.Tensor]) -> None:
    """Point every token of the segment at the root of its tree (in place); frames in
    order, so a parent's root is known before its children's."""
    for frame in frames:
        representative[frame] = representative[parent[frame]]


def _segment_clusters(
    rows: torch.Tensor, free: list[torch.Tensor], budget: int, settings: dict
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Each frame's survivors clustered: `[(centres [c], their rows [c, D], owner [m], the
    survivors [m])]`, the counts `ceil(m_f * budget / sum m)` (official) or apportioned."""
    sizes = [int(f.numel()) for f in free]
    total = sum(sizes)
    if total == 0:
        return []
    if settings["exact_budget"]:
        counts = apportion(budget, sizes, sizes)
    elif budget >= total:
        counts = sizes
    else:
        counts = [math.ceil(m * (budget / total)) for m in sizes]
    out = []
    for pool, count in zip(free, counts, strict=True):
        if count <= 0 or pool.numel() == 0:
            continue
        if count >= pool.numel():
            out.append((pool, rows[pool], torch.arange(pool.numel(), device=pool.device), pool))
            continue
        centres, owner = cluster(rows[pool], count, settings["knn"])
        one_hot = torch.nn.functional.one_hot(owner, centres.numel()).to(rows.dtype)
        means = (one_hot.T @ rows[pool]) / one_hot.sum(dim=0)[:, None]
        out.append((pool[centres], means, owner, pool))
    return out


def _adopt_dropped(e: torch.Tensor, kept: torch.Tensor, representative: torch.Tensor) -> None:
    """A token in no kept row (a frame whose merge budget is 0: dropped, as the official
    code does) points at its most similar kept token. In place."""
    is_kept = torch.zeros(e.shape[0], dtype=torch.bool, device=e.device)
    is_kept[kept] = True
    lost = torch.nonzero(~is_kept[representative]).squeeze(1)
    if lost.numel():
        representative[lost] = kept[most_similar(e[lost], e[kept])]
