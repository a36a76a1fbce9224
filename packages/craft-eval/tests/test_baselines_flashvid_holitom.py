"""FlashVID and HoliTom (before the language model) against slow re-statements of their
OFFICIAL code, written here with Python loops over tokens.

FlashVID: github.com/Fanziyang-v/FlashVID @ 1d37422c5afcaa15ee46b5355f5ba798fa93290a,
`flashvid/utils.py` (`segment`, `additional_segment`, `flashvid_compression`,
`segment_compression`, `spatiotemporal_compression`, `dpc_knn`) and
`flashvid/token_selection.py:attn_div_based_token_selection`.
HoliTom: github.com/cokeshao/HoliTom @ e9b2972f6895c9e7d7fe74eb8c3a2ecaab8056e0,
`holitom/llava_arch.py` (`select_static_windows`, `get_static_dynamic_features`, `holitom`,
`merge_tokens_by_attention_density`, `merge_tokens_by_density`,
`merge_tokens_by_clustering`, `cluster_dpc_knn`).

Each re-statement applies only the deviations craft-eval's docs/baselines.md lists (ties by index,
no random density noise; FlashVID's one-frame segments cluster unpicked tokens only;
HoliTom's D > 0 as meant). Videos: T = 16 frames of 8 x 8 or 14 x 14 tokens, D = 32 / 64,
with static places, moving places and a scene cut; the published settings at 10-25%
retention; the methods run with `exact_budget=False` (the official counts).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from craft_eval.baselines import flashvid, holitom


def make_video(t: int, side: int, dim: int, seed: int, static: float) -> torch.Tensor:
    """`[T, side * side, D]`: a `static` share of places holds still (noise 0.02), the rest
    drifts (noise 0.6), with a new scene at T // 2."""
    g = torch.Generator().manual_seed(seed)
    n = side * side
    still = torch.rand(n, generator=g) < static
    frames = []
    for f in range(t):
        if f in (0, t // 2):
            base = torch.randn(n, dim, generator=g)
        noise = torch.where(still[:, None], 0.02, 0.6) * torch.randn(n, dim, generator=g)
        base = base + torch.where(still[:, None], 0.0, 1.0) * noise
        frames.append(base + 0.02 * torch.randn(n, dim, generator=g))
    return torch.stack(frames)


def grid(t: int, side: int) -> torch.Tensor:
    tt, hh, ww = torch.meshgrid(
        torch.arange(t), torch.arange(side), torch.arange(side), indexing="ij"
    )
    return torch.stack([tt.flatten(), hh.flatten(), ww.flatten()], dim=1)


def attention(t: int, n: int, seed: int) -> torch.Tensor:
    return torch.softmax(3 * torch.randn(t, n, generator=torch.Generator().manual_seed(seed)), -1)


def rows_equal(result, expected: dict[int, torch.Tensor]) -> None:  # type: ignore[no-untyped-def]
    kept = result.kept_index.tolist()
    assert kept == sorted(expected), (len(kept), len(expected))
    want = torch.stack([expected[i] for i in kept])
    torch.testing.assert_close(result.features, want, rtol=1e-4, atol=1e-5)


def dpc_centres(rows: list[torch.Tensor], count: int, knn: int) -> list[int]:
    """`dpc_knn` / `cluster_dpc_knn`: the `count` highest `delta * density`; of equal
    densities the smaller index is the denser (the official code's random noise), equal
    scores go to the smaller index."""
    m, dim = len(rows), rows[0].numel()
    dist = distances(rows, rows, dim)
    density = [math.exp(-sum(v * v for v in sorted(row)[:knn]) / knn) for row in dist]
    biggest = max(max(row) for row in dist)
    score = []
    for i in range(m):
        higher = [
            dist[i][j]
            for j in range(m)
            if density[j] > density[i] or (density[j] == density[i] and j < i)
        ]
        score.append(min(higher, default=biggest) * density[i])
    return sorted(sorted(range(m), key=lambda i: (-score[i], i))[:count])


def distances(a: list[torch.Tensor], b: list[torch.Tensor], dim: int) -> list[list[float]]:
    """Euclidean distances / sqrt(dim), each pair on its own (cdist without the matmul)."""
    mode = "donot_use_mm_for_euclid_dist"
    return (torch.cdist(torch.stack(a), torch.stack(b), compute_mode=mode) / dim**0.5).tolist()


def nearest(rows: list[torch.Tensor], i: int, centres: list[int]) -> int:
    """Position in `centres` of the centre nearest row `i` (first minimum)."""
    dists = distances([rows[i]], [rows[c] for c in centres], 1)[0]
    return dists.index(min(dists))


def cosines(a: torch.Tensor, b: torch.Tensor) -> list[list[float]]:
    """`[n, m]` cosines of the rows of `a [n, D]` with those of `b [m, D]`, as lists."""
    return (F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T).tolist()


# -- FlashVID ------------------------------------------------------------------------------


def flashvid_segments(x: torch.Tensor, threshold: float, least: int) -> list[list[int]]:
    """`segment` + `additional_segment` (a cut chosen twice is cut once)."""
    t = x.shape[0]
    means = x.mean(dim=1)
    sims = [cosines(means[f : f + 1], means[f + 1 : f + 2])[0][0] for f in range(t - 1)]
    cuts = {f for f in range(t - 1) if sims[f] < threshold}
    if len(cuts) + 1 < least:
        filled = [1.0 if s < threshold else s for s in sims]
        order = sorted(range(t - 1), key=lambda f: (filled[f], f))
        cuts |= set(order[: min(least - len(cuts) - 1, t - 1)])
    bounds = [-1, *sorted(cuts), t - 1]
    return [list(range(a + 1, b + 1)) for a, b in itertools.pairwise(bounds)]


def adts_picks(x: torch.Tensor, attn: torch.Tensor, count: int) -> list[int]:
    """`attn_div_based_token_selection` on one frame."""
    n = x.shape[0]
    sim = cosines(x, x)
    dist = [[(1 - sim[i][j]) * float(attn[j]) * 1e6 for j in range(n)] for i in range(n)]
    second = [sorted(dist[i][j] for i in range(n))[1] for j in range(n)]
    picked = [second.index(max(second))]
    while len(picked) < count:
        gap = [-1.0 if j in picked else min(dist[i][j] for i in picked) for j in range(n)]
        picked.append(gap.index(max(gap)))
    return sorted(picked)


def tree_merge(x, frames_free, lower, threshold, tree_mean):  # type: ignore[no-untyped-def]
    """`spatiotemporal_compression` on one segment: `frames_free[f]` the unpicked places of
    frame f. -> ({(f, i): row of each survivor}, per frame the surviving places)."""
    t = x.shape[0]
    best = {}
    for f in range(t):
        for i in range(x.shape[1]):
            best[f, i] = (-1.0, None)
        if f == 0:
            continue
        table = cosines(x[f], x[f - 1])
        for i in frames_free[f]:
            sims = [table[i][j] for j in frames_free[f - 1]]
            if sims:
                top = max(sims)
                best[f, i] = (top, frames_free[f - 1][sims.index(top)])
    cut = threshold
    if sum(1 for v, _ in best.values() if not v > threshold) < lower:
        values = sorted((v for v, _ in best.values()), reverse=True)
        cut = max(values[len(values) - lower - 1], -1.0 + 1e-6)
    total = {key: x[key].clone() for key in best}
    count = dict.fromkeys(best, 1.0)
    for f in range(t - 1, 0, -1):
        for i in range(x.shape[1]):
            value, parent = best[f, i]
            if value > cut:
                total[f - 1, parent] = total[f - 1, parent] + total[f, i]
                count[f - 1, parent] += count[f, i] if tree_mean else 1.0
    survivors = [[i for i in frames_free[f] if not best[f, i][0] > cut] for f in range(t)]
    rows = {(f, i): total[f, i] / count[f, i] for f in range(t) for i in survivors[f]}
    return rows, survivors


def flashvid_official(x, attn, ratio, tree_mean, alpha=0.7, tth=0.8, sth=0.9, least=8):  # type: ignore[no-untyped-def]
    """`flashvid_compression` with `retention * expansion = 1 / ratio`: `{flat index: row}`."""
    _t, n, _ = x.shape
    budget = math.ceil(n * (1.0 / ratio))
    picks = math.ceil(budget * alpha)
    out: dict[int, torch.Tensor] = {}
    for seg in flashvid_segments(x, sth, least):
        xs, free = x[seg], []
        for k, f in enumerate(seg):
            chosen = adts_picks(xs[k], attn[f], picks)
            out.update({f * n + i: xs[k, i] for i in chosen})
            free.append([i for i in range(n) if i not in chosen])
        other = (budget - picks) * len(seg)
        if other <= 0:
            continue
        if len(seg) > 1:
            rows, survivors = tree_merge(xs, free, budget * len(seg), tth, tree_mean)
        else:
            rows, survivors = {(0, i): xs[0, i] for i in free[0]}, free
        c = other / sum(len(s) for s in survivors)
        for k, places in enumerate(survivors):
            members = [rows[k, i] for i in places]
            clusters = math.ceil(len(places) * c)
            if clusters == 0 or c >= 1.0:
                out.update({seg[k] * n + i: rows[k, i] for i in places})
                continue
            centres = dpc_centres(members, clusters, min(clusters, 7))
            groups: dict[int, list[torch.Tensor]] = {c_: [] for c_ in range(len(centres))}
            for i in range(len(places)):
                own = centres.index(i) if i in centres else nearest(members, i, centres)
                groups[own].append(members[i])
            for g, c_ in enumerate(centres):
                out[seg[k] * n + places[c_]] = torch.stack(groups[g]).mean(dim=0)
    return out


FLASHVID_CASES = [  # (side, dim, ratio, static share, seed): ratio 3.2 = 25% x expansion 1.25
    (8, 32, 3.2, 0.5, 0),
    (8, 32, 4.0, 0.3, 1),
    (8, 32, 10.0, 0.6, 2),
    (14, 64, 3.2, 0.5, 3),
    (14, 64, 6.4, 0.4, 4),
]


@pytest.mark.parametrize("tree_mean", [False, True])
@pytest.mark.parametrize(("side", "dim", "ratio", "static", "seed"), FLASHVID_CASES)
def test_flashvid_equals_official(
    side: int, dim: int, ratio: float, static: float, seed: int, tree_mean: bool
) -> None:
    x = make_video(16, side, dim, seed, static)
    attn = attention(16, side * side, seed)
    expected = flashvid_official(x, attn, ratio, tree_mean)
    result = flashvid(
        x.flatten(0, 1),
        grid(16, side),
        ratio=ratio,
        importance=attn.flatten(),
        exact_budget=False,
        tree_mean=tree_mean,
    )
    rows_equal(result, expected)


def test_flashvid_cases_exercise_every_branch() -> None:
    """The cases above hold one-frame and multi-frame segments, tree merges above the
    threshold and the lowered (`soft_threshold`) one."""
    lengths, merged, lowered = set(), 0, 0
    for side, dim, ratio, static, seed in FLASHVID_CASES:
        x = make_video(16, side, dim, seed, static)
        segs = flashvid_segments(x, 0.9, 8)
        lengths |= {min(len(s), 2) for s in segs}
        for seg in segs:
            sims = [cosines(x[f], x[f - 1]) for f in seg[1:]]
            above = sum(1 for table in sims for row in table if max(row) > 0.8)
            budget = math.ceil(side * side / ratio) * len(seg)
            merged += above
            lowered += len(seg) > 1 and len(seg) * side * side - above < budget
    assert lengths == {1, 2} and merged > 0 and lowered > 0


# -- HoliTom -------------------------------------------------------------------------------


def holitom_windows(sim: list[list[float]], tau: float) -> tuple[list[tuple[int, int]], float]:
    """`select_static_windows` (`max_window_size` 1024)."""
    t, n = len(sim) + 1, len(sim[0]) if sim else 0

    def saved(s: int, e: int) -> float:
        return (e - s) * sum(1 for j in range(n) if all(sim[f][j] > tau for f in range(s, e)))

    dp, prev = [0.0] * t, [0] * t
    for i in range(t):
        best, first = (dp[i - 1] if i > 0 else 0.0), i
        for size in range(2, i + 2):
            j = i - size
            value = (dp[j] if j >= 0 else 0.0) + saved(j + 1, i)
            if value > best:
                best, first = value, j + 1
        dp[i], prev[i] = best, first
    windows, i = [], t - 1
    while i >= 0:
        windows.append((prev[i], i))
        i = prev[i] - 1
    return windows[::-1], dp[-1]


def merged_centres(rows: list[torch.Tensor], count: int, beta: float) -> dict[int, torch.Tensor]:
    """`cluster_dpc_knn` + `merge_tokens_by_clustering` (K = 7): {position: row}."""
    centres = dpc_centres(rows, count, min(7, count))
    members: dict[int, list[torch.Tensor]] = {c: [] for c in centres}
    for i in range(len(rows)):
        if i not in centres:
            members[centres[nearest(rows, i, centres)]].append(rows[i])
    return {
        c: beta * rows[c] + (1 - beta) * torch.stack(m).mean(dim=0) if m else rows[c]
        for c, m in members.items()
    }


def holitom_official(x, attn, r, tau, d=0.0, beta=0.6):  # type: ignore[no-untyped-def]
    """HoliTom's `prepare_inputs_labels_for_multimodal` on one video: `{flat index: row}`
    (a static slot at its window's first frame)."""
    t, n, _ = x.shape
    sim = [
        [cosines(x[f, j : j + 1], x[f + 1, j : j + 1])[0][0] for j in range(n)]
        for f in range(t - 1)
    ]
    windows, reduced = holitom_windows(sim, tau)
    r = min(r / ((t * n - reduced) / (t * n)), 1)
    out: dict[int, torch.Tensor] = {}
    for first, last in windows:
        static = [
            j for j in range(n) if last > first and all(sim[f][j] > tau for f in range(first, last))
        ]
        dynamic = [j for j in range(n) if j not in static]
        for f in range(first, last + 1):
            keep = math.ceil(len(dynamic) * r)
            dominant = round(keep * (1 - d))
            top = sorted(sorted(dynamic, key=lambda j: (-float(attn[f, j]), j))[:dominant])
            out.update({f * n + j: x[f, j] for j in top})
            rest = [j for j in dynamic if j not in top]
            if keep - dominant > 0:
                rows = merged_centres([x[f, j] for j in rest], keep - dominant, beta)
                out.update({f * n + rest[c]: row for c, row in rows.items()})
        if static and round(len(static) * r) > 0:
            slots = [x[first : last + 1, j].mean(dim=0) for j in static]
            rows = merged_centres(slots, round(len(static) * r), beta)
            out.update({first * n + static[c]: row for c, row in rows.items()})
    return out


HOLITOM_CASES = [  # (side, dim, retention, tau, static share, seed): the published scripts
    (8, 32, 0.10, 0.65, 0.5, 0),
    (8, 32, 0.15, 0.80, 0.3, 1),
    (8, 32, 0.25, 0.80, 0.6, 2),
    (14, 64, 0.10, 0.65, 0.5, 3),
    (14, 64, 0.20, 0.80, 0.4, 4),
]


@pytest.mark.parametrize("d", [0.0, 0.3])
@pytest.mark.parametrize(("side", "dim", "retention", "tau", "static", "seed"), HOLITOM_CASES)
def test_holitom_equals_official(
    side: int, dim: int, retention: float, tau: float, static: float, seed: int, d: float
) -> None:
    x = make_video(16, side, dim, seed, static)
    attn = attention(16, side * side, seed)
    expected = holitom_official(x, attn, retention, tau, d=d)
    result = holitom(
        x.flatten(0, 1),
        grid(16, side),
        ratio=1.0 / retention,
        importance=attn.flatten(),
        tau=tau,
        d=d,
        exact_budget=False,
    )
    rows_equal(result, expected)


def test_holitom_centre_weights_are_beta() -> None:
    """`merge_tokens_by_clustering`'s weights on their own: a centre with members becomes
    `beta * centre + (1 - beta) * mean(members)`, one without stays as it is (the case has
    both, members of 2 and 4 rows); a plain mean of centre and members (the planted fault)
    is more than 0.05 away."""
    from craft_eval.baselines.holitom import merge_into_centres

    g = torch.Generator().manual_seed(5)
    rows = torch.cat(
        [c + 0.3 * torch.randn(n, 8, generator=g) for c, n in ((0, 1), (3, 2), (-3, 5))]
    )
    rows = torch.cat([rows, torch.randn(4, 8, generator=g)])
    centres, merged, owner = merge_into_centres(rows, 4, 7, 0.6)
    members = [
        [i for i in range(rows.shape[0]) if int(owner[i]) == c and i != int(centre)]
        for c, centre in enumerate(centres.tolist())
    ]
    assert sorted(len(m) for m in members) == [0, 2, 2, 4], members
    want = torch.stack(
        [
            0.6 * rows[centre] + 0.4 * rows[m].mean(dim=0) if m else rows[centre]
            for centre, m in zip(centres.tolist(), members, strict=True)
        ]
    )
    torch.testing.assert_close(merged, want, rtol=0, atol=1e-6)
    mean = torch.stack(
        [
            rows[[centre, *m]].mean(dim=0)
            for centre, m in zip(centres.tolist(), members, strict=True)
        ]
    )
    assert (mean - want).abs().max() > 0.05
