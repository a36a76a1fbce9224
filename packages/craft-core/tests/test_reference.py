"""The fast compressor against a slow, obvious re-statement of algorithm.md written here.

The reference shares no code with craft_core. It computes the exact similarity rule in
Python integers (features rounded to 23 bits of the row's largest entry, W_rand to 2^-16,
the projection to 22 bits, E to 2^-23, similarities as integer dot products via numpy int64),
recomputes every similarity every round, and walks the selection rules one token at a time.
Inputs carry planted exact duplicates and static frames, where a floating-point similarity
would round equal values differently by path. Every combination of budget, reduce, weighting
and sim_block is covered over more than 200 cases.
"""

from __future__ import annotations

import math
from collections import defaultdict
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from core_testkit import Case, case_id, noise, reference_cases, run_reference_case

from craft_core import CraftCompressor, CraftConfig


def _scaled_round(values: list[float], bits: int) -> list[int]:
    """Round each value times 2^(bits - 1 - floor(log2 max|v|)) to the nearest integer (even)."""
    top = max(abs(v) for v in values)
    if top == 0:
        return [0] * len(values)
    _, exponent = math.frexp(top)  # top = f * 2^exponent, f in [0.5, 1)
    shift = bits - exponent  # = bits - 1 - floor(log2 top)
    return [round(Fraction(v) * Fraction(2) ** shift) for v in values]


def ref_embed(row: torch.Tensor, w_int: list[list[int]]) -> list[int]:
    """E of one row as integers on the grid 2^-23."""
    q = _scaled_round([float(v) for v in row.tolist()], 23)
    projected = [sum(q[k] * w_int[k][c] for k in range(len(q))) for c in range(len(w_int[0]))]
    p = _scaled_round([float(v) for v in projected], 22)
    norm = math.sqrt(sum(v * v for v in p))  # exact integer in, correctly rounded out
    if norm == 0:
        return [0] * len(p)
    return [round(v / norm * 2.0**23) for v in p]


def ref_square_norm(row: torch.Tensor) -> Fraction:
    """Squared norm of the row rounded to 19 bits of its largest entry, exactly."""
    values = [float(v) for v in row.tolist()]
    q = _scaled_round(values, 19)
    top = max(abs(v) for v in values)
    if top == 0:
        return Fraction(0)
    _, exponent = math.frexp(top)
    return Fraction(sum(v * v for v in q)) / Fraction(2) ** (2 * (19 - exponent))


def ref_rope(x: torch.Tensor, coord: list[int], theta: float, sections: tuple) -> torch.Tensor:
    """M-RoPE, rotate-half convention: pair p turns by coord[axis(p)] * theta^(-2p/r)."""
    r = x.shape[0]
    axes = [a for a, count in enumerate(sections) for _ in range(count)]
    out = x.clone()
    for p in range(r // 2):
        angle = coord[axes[p]] * theta ** (-2 * p / r)
        c, s = math.cos(angle), math.sin(angle)
        out[p] = x[p] * c - x[p + r // 2] * s
        out[p + r // 2] = x[p + r // 2] * c + x[p] * s
    return out


def ref_fuse(module, config, rows, coords, t, sources, sims, round_index) -> torch.Tensor:
    """x_t - sum_i w_i G_i (x_t - x_i), written out term by term."""
    x_t = rows[t]
    if config.reduce == "target":
        return x_t
    if config.weighting == "uniform" or len(sources) == 1:
        w = [1.0 / len(sources)] * len(sources)
    else:
        merge = module.merge
        k = ref_rope(
            F.normalize(merge.w_k.weight @ x_t, dim=0),
            coords[t],
            config.rope_theta,
            config.rope_sections,
        )
        logits = []
        for s, sim in zip(sources, sims):
            q = ref_rope(
                F.normalize(merge.w_q.weight @ rows[s], dim=0),
                coords[s],
                config.rope_theta,
                config.rope_sections,
            )
            logits.append((float(q @ k) + sim) / config.temperature)
        w = torch.softmax(torch.tensor(logits), dim=0).tolist()
    if config.reduce == "mean":
        return sum(wi * rows[s] for wi, s in zip(w, sources))
    merge = module.merge
    half = config.round_embed_dim // 2
    freqs = [math.exp(-math.log(10000.0) * i / half) for i in range(half)]
    phi = torch.tensor(
        [math.cos(round_index * f) for f in freqs] + [math.sin(round_index * f) for f in freqs]
    )
    gamma, beta = (merge.w_mod.weight @ phi + merge.w_mod.bias).chunk(2)
    out = x_t.clone()
    for wi, s in zip(w, sources):
        h = F.gelu(merge.w_down.weight @ torch.cat([x_t, rows[s]]) + merge.w_down.bias)
        h = (h - h.mean()) / torch.sqrt(h.var(unbiased=False) + config.layer_norm_eps)
        gate = torch.sigmoid(merge.w_up.weight @ (h * (1 + gamma) + beta) + merge.w_up.bias)
        out = out - wi * gate * (x_t - rows[s])
    return out


def reference_compress(module, features, coords, floor, threshold):
    """Returns (kept ascending, representative of every token, output rows, rounds)."""
    config = module.config
    n = features.shape[0]
    w_int = [[round(float(v) * 2**16) for v in row] for row in module.projection.tolist()]
    rows = [features[i].float().clone() for i in range(n)]
    emb = {i: ref_embed(rows[i], w_int) for i in range(n)}
    coord_list = coords.tolist()
    active, owner, rounds = list(range(n)), list(range(n)), 0
    while len(active) > floor:
        matrix = np.array([emb[i] for i in active], dtype=np.int64)
        sims = matrix @ matrix.T  # exact integers (|entry| <= 2^46 * 16)
        best: dict[int, tuple[int, int]] = {}
        for a, i in enumerate(active):
            best_sim, best_j = None, -1
            for b, j in enumerate(active):
                if j != i and (best_sim is None or sims[a, b] > best_sim):  # ties: smaller j
                    best_sim, best_j = int(sims[a, b]), j
            best[i] = (best_sim, best_j)
        scale = 2.0**46
        candidates = [i for i in active if threshold is None or best[i][0] / scale >= threshold]
        k = min(len(active) - floor, len(active) // 2, len(candidates))
        if k <= 0:
            break
        candidates.sort(key=lambda i: (-best[i][0], i))
        edges: dict[tuple[int, int], int] = {}
        for i in candidates[:k]:
            s, j = best[i]
            ni, nj = ref_square_norm(rows[i]), ref_square_norm(rows[j])
            t, src = (i, j) if (ni > nj or (ni == nj and i < j)) else (j, i)
            edges[(t, src)] = s
        targets = {t for t, _ in edges}
        edges = {e: s for e, s in edges.items() if e[1] not in targets}
        chosen: dict[int, tuple[int, int]] = {}
        for (t, src), s in sorted(edges.items()):
            if src not in chosen or s > chosen[src][1]:
                chosen[src] = (t, s)
        rounds += 1
        groups: dict[int, list[int]] = defaultdict(list)
        for src, (t, _) in sorted(chosen.items()):
            groups[t].append(src)
        updates = {}
        with torch.no_grad():
            for t, sources in groups.items():
                sims_t = [chosen[s][1] / scale for s in sources]
                updates[t] = ref_fuse(module, config, rows, coord_list, t, sources, sims_t, rounds)
        for t, v in updates.items():
            rows[t] = v.float()
            emb[t] = ref_embed(rows[t], w_int)
        for src, (t, _) in chosen.items():
            owner = [t if o == src else o for o in owner]
        active = [i for i in active if i not in chosen]
    return active, owner, torch.stack([rows[i] for i in active]), rounds


def check_against_reference(case: Case):
    config, n, budget = case.config, case.n, case.budget
    compressor, x, coords, out = run_reference_case(case)
    floor = max(1, math.floor(n / budget["ratio"])) if "ratio" in budget else max(1, n // 128)
    kept, owner, rows, rounds = reference_compress(
        compressor, x, coords, floor, budget.get("threshold")
    )
    assert out.kept_index.tolist() == kept
    assert out.rounds == rounds
    assert [kept[r] for r in out.assignment.tolist()] == owner
    torch.testing.assert_close(out.features.detach(), rows, rtol=1e-4, atol=1e-4)
    if config.reduce == "target":
        assert torch.equal(out.features, x[out.kept_index])


@pytest.mark.parametrize("case", reference_cases(), ids=case_id)
def test_compressor_equals_reference(case: Case) -> None:
    check_against_reference(case)


def test_reference_agrees_on_a_larger_video_like_input() -> None:
    # Enough tokens that the incremental re-pairing takes both its paths (partners kept
    # against the changed targets only, and full re-pairs) many times.
    dim, n = 16, 240
    gen = torch.Generator().manual_seed(7)
    base = noise(30, dim, generator=gen)
    x = base.repeat(8, 1) + 0.15 * noise(n, dim, generator=gen)
    x[60:90] = x[30:60]  # a static frame
    coords = torch.randint(0, 9, (n, 3), generator=gen)
    compressor = CraftCompressor(
        CraftConfig(hidden_size=dim, sim_dim=16, weighting="uniform", reduce="mean"), sim_block=64
    )
    out = compressor(x, coords, ratio=6.0)
    kept, owner, rows, rounds = reference_compress(compressor, x, coords, n // 6, None)
    assert out.kept_index.tolist() == kept
    assert out.rounds == rounds
    assert [kept[r] for r in out.assignment.tolist()] == owner
    torch.testing.assert_close(out.features, rows, rtol=1e-5, atol=1e-5)
