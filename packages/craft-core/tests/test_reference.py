"""The fast compressor against a slow, obvious re-statement of algorithm.md written here.

The reference loops over tokens in Python, recomputes every similarity every round and
shares no code with craft_core except the fixed projection matrix W_rand (a buffer the
algorithm defines). Both budget modes, `reduce="target"` and `reduce="mean"`.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch

from craft_core import CraftCompressor, CraftConfig


def reference_compress(
    features: torch.Tensor,
    projection: torch.Tensor,
    floor: int,
    threshold: float | None,
    reduce: str,
) -> tuple[list[int], list[int], torch.Tensor, int]:
    """Returns (kept ascending, representative of every token, output rows, rounds)."""
    n = features.shape[0]
    rows = [features[i].float().clone() for i in range(n)]

    def embed(v: torch.Tensor) -> torch.Tensor:
        p = v @ projection
        return p / p.norm()

    emb = [embed(r) for r in rows]
    active = list(range(n))
    owner = list(range(n))
    rounds = 0
    while len(active) > floor:
        best: dict[int, tuple[float, int]] = {}
        for i in active:
            best_sim, best_j = -math.inf, -1
            for j in active:
                if j == i:
                    continue
                s = float(emb[i] @ emb[j])
                if s > best_sim:  # strictly greater: ties keep the smaller j
                    best_sim, best_j = s, j
            best[i] = (best_sim, best_j)
        candidates = [i for i in active if threshold is None or best[i][0] >= threshold]
        k = min(len(active) - floor, len(active) // 2, len(candidates))
        if k <= 0:
            break
        candidates.sort(key=lambda i: (-best[i][0], i))
        edges: dict[tuple[int, int], float] = {}
        for i in candidates[:k]:
            s, j = best[i]
            ni, nj = float(rows[i].norm()), float(rows[j].norm())
            t, src = (i, j) if (ni > nj or (ni == nj and i < j)) else (j, i)
            edges[(t, src)] = max(edges.get((t, src), -math.inf), s)
        targets = {t for t, _ in edges}
        edges = {e: s for e, s in edges.items() if e[1] not in targets}
        chosen: dict[int, tuple[int, float]] = {}
        for (t, src), s in sorted(edges.items()):
            cur = chosen.get(src)
            if cur is None or s > cur[1]:
                chosen[src] = (t, s)
        assert chosen, "a round with candidates must merge something"
        rounds += 1
        groups: dict[int, list[int]] = defaultdict(list)
        for src, (t, _) in chosen.items():
            groups[t].append(src)
        updates = {}
        for t, sources in groups.items():
            if reduce == "target":
                continue
            w = 1.0 / len(sources)
            shift = sum(w * (rows[t] - rows[s]) for s in sources)
            updates[t] = rows[t] - shift
        for t, v in updates.items():
            rows[t] = v
            emb[t] = embed(v)
        for src, (t, _) in chosen.items():
            owner = [t if o == src else o for o in owner]
        active = [i for i in active if i not in chosen]
    return active, owner, torch.stack([rows[i] for i in active]), rounds


def make_tokens(seed: int, n: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    # A few clusters so that merges chain across rounds, plus exact duplicates for ties.
    centres = torch.randn(max(1, n // 8), dim, generator=gen)
    pick = torch.randint(0, centres.shape[0], (n,), generator=gen)
    x = centres[pick] + 0.4 * torch.randn(n, dim, generator=gen)
    if n >= 6:
        x[n - 1] = x[1]
        x[n - 2] = x[1]
        x[n // 2] = x[0] * 1.0
    coords = torch.randint(0, 5, (n, 3), generator=gen)
    return x, coords


CASES = [(seed, n) for seed, n in enumerate([2, 3, 5, 8, 17, 33, 64, 90, 120, 64, 77, 100])]


@pytest.mark.parametrize("reduce", ["target", "mean"])
@pytest.mark.parametrize("seed,n", CASES)
@pytest.mark.parametrize("budget", [{"ratio": 4.0}, {"ratio": 1.7}, {"threshold": 0.6}])
def test_fast_path_equals_reference(seed: int, n: int, reduce: str, budget: dict) -> None:
    dim = 24
    # sim_block 16 forces several blocks even at these sizes.
    config = CraftConfig(
        hidden_size=dim, sim_dim=16, sim_block=16, weighting="uniform", reduce=reduce
    )
    compressor = CraftCompressor(config)
    x, coords = make_tokens(seed, n, dim)
    # Both row stores: in place without autograd, stitched pieces with it.
    with torch.set_grad_enabled(seed % 2 == 0):
        out = compressor(x, coords, **budget)
    if "ratio" in budget:
        floor = max(1, math.floor(n / budget["ratio"]))
    else:
        floor = max(1, n // 128)
    kept, owner, rows, rounds = reference_compress(
        x, compressor.projection, floor, budget.get("threshold"), reduce
    )
    assert out.kept_index.tolist() == kept
    assert out.rounds == rounds
    assert [kept[r] for r in out.assignment.tolist()] == owner
    torch.testing.assert_close(out.features, rows, rtol=1e-5, atol=1e-5)
    if reduce == "target":
        assert torch.equal(out.features, x[out.kept_index])


def test_reference_agrees_on_a_larger_video_like_input() -> None:
    # Enough tokens that the incremental pairing takes both its paths (list hits and
    # full recomputes) many times.
    dim, n = 16, 300
    gen = torch.Generator().manual_seed(7)
    base = torch.randn(30, dim, generator=gen)
    x = base.repeat(10, 1) + 0.15 * torch.randn(n, dim, generator=gen)
    coords = torch.randint(0, 9, (n, 3), generator=gen)
    compressor = CraftCompressor(
        CraftConfig(hidden_size=dim, sim_dim=16, sim_block=64, weighting="uniform", reduce="mean")
    )
    out = compressor(x, coords, ratio=6.0)
    kept, owner, rows, rounds = reference_compress(x, compressor.projection, n // 6, None, "mean")
    assert out.kept_index.tolist() == kept
    assert out.rounds == rounds
    assert [kept[r] for r in out.assignment.tolist()] == owner
    torch.testing.assert_close(out.features, rows, rtol=1e-5, atol=1e-5)
