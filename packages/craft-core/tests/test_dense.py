"""The small-N pairing (`dense.DensePairing`) against the certified paths and the exact rule.

Every similarity of the dense path is an exact float64 product, so it must select exactly
what the plain round (`algorithm.compress`) and the two certified strategies select, and
fuse the same rows bit for bit, on inputs full of exact duplicates (static clips, letterbox
bars), with the gradient path too. `test_same_tokens.py` pins it to 0.3.0 as well.
"""

from __future__ import annotations

import pytest
import torch
from core_testkit import grid_coords
from test_certified import assert_plain, assert_same, clip, live, run

from craft_core import CraftCompressor, CraftConfig
from craft_core.dense import DENSE_MAX_TOKENS, DensePairing
from craft_core.selection import full_partners, grid_projection, make_projection, row_keys


@pytest.mark.parametrize("budget", [{"ratio": 8.0}, {"ratio": 1.5}, {"threshold": 0.8}])
@pytest.mark.parametrize("kind", ["static", "letterbox", "ulp", "drift"])
def test_dense_equals_exact_and_certified(kind: str, budget: dict) -> None:
    x, coords = clip(kind, seed=len(kind))
    dense = run(x, coords, budget, sim_block=40, pairing="dense")
    assert dense.info["pairing"] == "DensePairing"
    assert sum(dense.info["rows_rechecked"]) == 0 and dense.info["fallbacks"] == 0
    for pairing in ("incremental", "full"):
        assert_same(dense, run(x, coords, budget, sim_block=40, pairing=pairing))
    assert_plain(dense, x, coords, budget)


def test_dense_equals_incremental_with_a_gradient() -> None:
    # The autograd row store (`rows.PieceRows`) and a gradient that reaches the merge weights.
    x, coords = clip("letterbox", seed=9)
    results = []
    for pairing in ("dense", "incremental"):
        compressor = live(CraftConfig(hidden_size=x.shape[1]), pairing=pairing)
        out = compressor(x.clone().requires_grad_(True), coords, ratio=4.0)
        out.features.square().sum().backward()
        grads = [p.grad.clone() for p in compressor.merge.parameters()]
        results.append((out, grads))
    (dense, dense_grads), (incremental, incremental_grads) = results
    assert dense.features.requires_grad
    assert torch.equal(dense.features, incremental.features)
    assert dense.kept_index.tolist() == incremental.kept_index.tolist()
    assert all(torch.equal(a, b) for a, b in zip(dense_grads, incremental_grads))


def test_dense_matrix_holds_the_exact_partners_after_rounds() -> None:
    # After each update, the row maxima of the matrix are `full_partners` of the active set.
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(60, 16, generator=gen)
    x[30:] = x[:30]  # every token has an exact duplicate
    weight = grid_projection(make_projection(16, 8, 0))
    embed, _ = row_keys(x, weight)
    pairing = DensePairing(embed.clone())
    active = torch.arange(60)
    for step in range(4):
        sources = active[1 + step :: 5]
        targets = active[0 + step :: 7][: sources.numel()]
        targets = targets[~torch.isin(targets, sources)]
        active = active[~torch.isin(active, sources)]
        new_rows = x[targets] * (1.5 + step)
        x[targets] = new_rows
        new_embed, _ = row_keys(new_rows, weight)
        embed[targets] = new_embed
        pairing.update(targets, new_embed, active, sources)
        sim, partner = pairing.sims[active].max(dim=1)
        want_sim, want_pos = full_partners(embed[active], 7)
        assert torch.equal(sim, want_sim)
        assert torch.equal(partner, active[want_pos])


def test_auto_pairs_densely_up_to_the_limit_on_a_cpu() -> None:
    compressor = CraftCompressor(CraftConfig(hidden_size=8))
    for n, want in ((DENSE_MAX_TOKENS, "DensePairing"), (DENSE_MAX_TOKENS + 4, "PairingState")):
        x = torch.randn(n, 8, generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            out = compressor(x, grid_coords(n // 4, 2, 2), ratio=300.0)
        assert out.info["pairing"] == want


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copied_rows_store_like_slot_rows(dtype: torch.dtype) -> None:
    # The small-N row store (one copy, written in place) against the slot store it replaces.
    from craft_core.rows import CopiedRows, SlotRows

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(40, 6, generator=gen).to(dtype)
    copied, slots = CopiedRows(x), SlotRows(x)
    before = x.clone()
    for step in range(5):
        ids = torch.randperm(40, generator=gen)[: 4 + 3 * step]
        rows = torch.randn(ids.numel(), 6, generator=gen)
        copied.replace(ids, rows)
        slots.replace(ids, rows)
        probe = torch.randint(0, 40, (25,), generator=gen)
        assert torch.equal(copied.gather(probe), slots.gather(probe))
        assert copied.gather(probe).dtype == torch.float32
    assert torch.equal(x, before)  # the input is never written
