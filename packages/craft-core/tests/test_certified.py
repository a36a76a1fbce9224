"""The certified fast path (float32 + bound + exact rechecks: the padded loop's pairing)
against the exact rule, and the eager loop on the same adversarial input.

The independent references are the plain round (`algorithm.compress`: every similarity an
exact float64 product, recomputed every round) and, for one pass, its pairing
`algorithm.pair`. Inputs are adversarial for a float32 pass: static clips (every token has
many exact duplicates), letterbox bars (hundreds of identical tokens), rows 1 ulp apart,
bf16 input. A forced recheck of every row must give the same answer too, and the bound
itself is checked against several summation orders.
"""

from __future__ import annotations

import pytest
import torch
from core_testkit import equals_the_plain_round, grid_coords, live_weights, noise

from craft_core import CraftCompressor, CraftConfig
from craft_core.algorithm import pair
from craft_core.certify import (
    NORM_MAX,
    buffered_partners,
    certified_partners,
    similarity_bound,
)
from craft_core.selection import grid_projection, make_projection, row_keys


def clip(kind: str, seed: int, frames: int = 12, grid: int = 6, dim: int = 32):
    """`[frames * grid^2, dim]` adversarial tokens and their coords.

    static: every frame the same; letterbox: drifting frames whose first and last rows of
    patches are one identical token; ulp: frames that alternate between a base and the base
    moved by one float32 ulp in one channel (scenes of 6 frames: more near-equal candidates
    than a row lists); drift: ordinary drifting scenes.
    """
    gen = torch.Generator().manual_seed(seed)
    per_frame = grid * grid
    base = noise(per_frame, dim, generator=gen)
    rows = []
    for t in range(frames):
        if kind != "static" and t % (6 if kind == "ulp" else 3) == 2:
            base = base + 0.2 * noise(per_frame, dim, generator=gen)
        frame = base.clone()
        if kind == "letterbox":
            frame.view(grid, grid, dim)[[0, grid - 1]] = 0.05
        if kind == "ulp" and t % 2:
            frame[:, 0] = torch.nextafter(frame[:, 0], torch.full_like(frame[:, 0], 10.0))
        rows.append(frame)
    return torch.cat(rows), grid_coords(frames, grid, grid)


def live(config: CraftConfig, **options) -> CraftCompressor:
    """A compressor with path-independent, non-trivial merge weights (a live gate)."""
    torch.manual_seed(0)
    return live_weights(CraftCompressor(config, **options), 1)


def run(x, coords, budget, *, sim_dim=128, reduce="gate", **options):
    """Compress with a live compressor: `sim_dim`, `reduce` are config fields, `options`
    run options (sim_block, precision)."""
    config = CraftConfig(hidden_size=x.shape[1], sim_dim=sim_dim, reduce=reduce)
    with torch.no_grad():
        return live(config, **options)(x, coords, **budget)


def assert_plain(result, x, coords, budget, *, sim_dim=128, reduce="gate", **options) -> None:
    """`result` (of `run` with these arguments) equals the plain round's tokens and rows."""
    config = CraftConfig(hidden_size=x.shape[1], sim_dim=sim_dim, reduce=reduce)
    assert equals_the_plain_round(result, live(config, **options), x, coords, budget)


def assert_same(a, b) -> None:
    assert a.kept_index.tolist() == b.kept_index.tolist()
    assert a.assignment.tolist() == b.assignment.tolist()
    assert a.rounds == b.rounds
    assert torch.equal(a.features, b.features)  # the same rows, bit for bit


@pytest.mark.parametrize("budget", [{"ratio": 8.0}, {"threshold": 0.8}])
@pytest.mark.parametrize("kind", ["static", "letterbox", "ulp", "drift"])
def test_eager_loop_equals_exact_on_adversarial_input(kind: str, budget: dict) -> None:
    # Exact ties everywhere (static frames, letterbox bars, rows 1 ulp apart): the batched
    # loop's incremental pairing must still give the plain round's answer, alone and beside
    # the other kinds in one batch.
    x, coords = clip(kind, seed=len(kind))
    alone = run(x, coords, budget, sim_block=40)
    assert_plain(alone, x, coords, budget, sim_block=40)
    kinds = ["static", "letterbox", "ulp", "drift"]
    clips = [clip(other, seed=len(other)) for other in kinds]
    config = CraftConfig(hidden_size=x.shape[1])
    with torch.no_grad():
        batch = live(config, sim_block=40).compress_many(
            [c[0] for c in clips], [c[1] for c in clips], **budget
        )
    assert_same(batch[kinds.index(kind)], alone)


def test_bf16_input_equals_exact_and_upcast() -> None:
    x, coords = clip("ulp", seed=5)
    low = x.to(torch.bfloat16)  # the ulp moves mostly vanish: exact duplicates in bf16
    common = {"sim_block": 40}
    result = run(low, coords, {"ratio": 6.0}, **common)
    assert result.features.dtype == torch.bfloat16
    assert_plain(result, low, coords, {"ratio": 6.0}, **common)
    upcast = run(low.float(), coords, {"ratio": 6.0}, **common)
    assert result.kept_index.tolist() == upcast.kept_index.tolist()
    assert torch.equal(result.features, upcast.features.to(torch.bfloat16))


def grid_embedding(n: int, dim: int, seed: int) -> torch.Tensor:
    """`[n, dim]` exact embeddings (on the 2^-23 grid) of clustered, duplicated tokens."""
    gen = torch.Generator().manual_seed(seed)
    centres = noise(max(1, n // 64), 16, generator=gen)
    x = centres[torch.randint(0, centres.shape[0], (n,), generator=gen)]
    x = x + 0.05 * noise(n, 16, generator=gen) * (torch.rand(n, 1, generator=gen) < 0.5)
    weight = grid_projection(torch.nn.functional.normalize(noise(16, dim, generator=gen), dim=0))
    return row_keys(x, weight)[0]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 300])
@pytest.mark.parametrize("block", [1, 7, 4096])
def test_certified_pass_equals_the_exact_pass(n: int, block: int) -> None:
    embed = grid_embedding(n, 16, seed=n + block)
    sim, pos = pair(embed, block)
    for recheck_all in (False, True):
        fast_sim, fast_pos, rechecked = certified_partners(embed, block, recheck_all=recheck_all)
        assert torch.equal(fast_pos, pos)
        assert torch.equal(fast_sim, sim)  # the exact float64 similarity, not the fast one
        if recheck_all:
            assert rechecked == n


def test_rows_one_grid_step_apart_are_decided_exactly() -> None:
    # Near-ties one grid step (2^-23 in one coordinate) apart: exact similarities differ by
    # about 2^-24, far below the float32 bound, so only the exact recheck can order them.
    gen = torch.Generator().manual_seed(0)
    unit = torch.nn.functional.normalize(noise(4, 32, generator=gen), dim=1).double()
    base = torch.round(unit * 0.9 * 2.0**23) * 2.0**-23  # on the grid, norm about 0.9
    rows = base.repeat(50, 1)
    step = torch.zeros_like(rows)
    step[torch.arange(rows.shape[0]), torch.randint(0, 32, (rows.shape[0],), generator=gen)] = 1
    rows = rows + step * 2.0**-23 * torch.randint(-1, 2, (rows.shape[0], 1), generator=gen)
    sim, pos = pair(rows, 16)
    fast_sim, fast_pos, rechecked = certified_partners(rows, 16)
    assert rechecked > 0
    assert torch.equal(fast_pos, pos) and torch.equal(fast_sim, sim)


@pytest.mark.parametrize("dim", [16, 128, 512])
def test_the_bound_holds_for_every_summation_order(dim: int) -> None:
    """|fl32(a.b) - a.b| <= delta for matmul, blocked partial sums (split-K), a reversed
    sequential sum and pairwise halves, on exact embeddings with large cancellations."""
    embed = grid_embedding(128, dim, seed=dim)
    exact = embed @ embed.T  # float64: exact on the grid
    a = embed.float()
    orders = [a @ a.T]
    for parts in (2, 7):  # split-K: float32 partial products, added in float32 afterwards
        chunks = torch.tensor_split(torch.arange(dim), parts)
        partial = [a[:, c] @ a[:, c].T for c in chunks]
        orders.append(torch.stack(partial).sum(0))
    products = a.unsqueeze(1) * a.unsqueeze(0)  # [n, n, d] float32
    sequential = torch.zeros_like(orders[0])
    for k in reversed(range(dim)):
        sequential = sequential + products[:, :, k]
    orders.append(sequential)
    delta = similarity_bound(dim)
    assert delta < 4 * dim * 2.0**-24 * NORM_MAX**2  # not vacuous: about d u
    for fast in orders:
        assert float((fast.double() - exact).abs().max()) <= delta
    assert float(embed.norm(dim=1).max()) <= NORM_MAX


def test_a_looser_matmul_precision_widens_the_bound() -> None:
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")  # bf16 inputs allowed: a much wider bound
        loose = similarity_bound(128)
    finally:
        torch.set_float32_matmul_precision(before)
    assert loose > 100 * similarity_bound(128)
    mkldnn = torch.backends.mkldnn.matmul
    before = mkldnn.fp32_precision
    try:
        mkldnn.fp32_precision = "bf16"  # the per-backend API: bf16 on CPU (oneDNN)
        loose = similarity_bound(128)
    finally:
        mkldnn.fp32_precision = before
    assert loose > 100 * similarity_bound(128)


@pytest.mark.slow
def test_certified_equals_exact_at_16384_tokens() -> None:
    # One big static-frame video, 16,384 tokens (8 similarity blocks), a few rounds, on the
    # padded loop (its pairing is the certified one: `buffered_partners`, and
    # `certified_partners` in its eager fallback rounds), run on the CPU as test_graphed does;
    # and on the eager loop. (65,536 tokens took 805 s here, nearly all in the plain
    # reference round; the bound depends on D, not N; test_gpu.py runs N = 65,536 on CUDA.)
    x, coords = clip("letterbox", seed=9, frames=256, grid=8, dim=8)
    common = {"sim_dim": 16, "sim_block": 2048, "reduce": "target"}
    certified = run(x, coords, {"ratio": 1.5}, cuda_graphs=True, allow_cpu=True, **common)
    assert certified.info["pairing"] == "graphed"
    assert_plain(certified, x, coords, {"ratio": 1.5}, **common)
    eager = run(x, coords, {"ratio": 1.5}, **common)
    assert_same(eager, certified)
    assert torch.equal(eager.features, certified.features)


def test_certified_pass_at_16384_tokens_of_a_static_clip() -> None:
    # Every token has 63 exact duplicates: every row is in doubt and rechecked.
    x, _ = clip("static", seed=4, frames=64, grid=16, dim=8)
    weight = grid_projection(make_projection(8, 16, seed=0))
    embed = row_keys(x, weight)[0]
    sim, pos = pair(embed, 2048)
    fast_sim, fast_pos, rechecked = certified_partners(embed, 2048)
    assert rechecked == x.shape[0]
    assert torch.equal(fast_pos, pos) and torch.equal(fast_sim, sim)


def _in_doubt(embed: torch.Tensor) -> torch.Tensor:
    """Rows the float32 pass cannot decide (`[n]` bool), from the module's own helper."""
    from craft_core.certify import _fast_listed

    return _fast_listed(embed, 64, 3, similarity_bound(embed.shape[1]))[2]


@pytest.mark.parametrize("spare", [0, 1, 5, 64])
@pytest.mark.parametrize("n", [12, 300])
def test_buffered_pass_is_exact_when_the_doubt_fits(spare: int, n: int) -> None:
    embed = grid_embedding(n, 32, seed=n + spare)
    embed[n // 2 : n // 2 + 6] = embed[0]  # 7 exact copies: more than a row lists
    exact_sim, exact_pos = pair(embed, 64)
    _, _, rechecked = certified_partners(embed, 64)
    sim, pos, in_doubt = buffered_partners(embed, 64, similarity_bound(32), spare)
    assert int(in_doubt) == rechecked > 0
    if rechecked <= spare:
        assert torch.equal(pos, exact_pos) and torch.equal(sim, exact_sim)
    else:  # the caller reads the count and falls back; rows that fit are still exact
        fits = torch.nonzero(~_in_doubt(embed)).squeeze(1)
        assert torch.equal(pos[fits], exact_pos[fits])
