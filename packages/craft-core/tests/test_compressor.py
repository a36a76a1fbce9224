"""Behaviour of CraftCompressor: budgets, outputs, gradients, dtypes, persistence, batching."""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from craft_core import CompressionResult, CraftCompressor, CraftConfig
from craft_core.merge import round_embedding
from craft_core.selection import grid_projection, row_keys

DIM = 32


def tokens(n: int, dim: int = DIM, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(max(1, n // 10), dim, generator=gen)
    x = centres[torch.randint(0, centres.shape[0], (n,), generator=gen)]
    x = x + 0.3 * torch.randn(n, dim, generator=gen)
    coords = torch.stack(
        [torch.arange(n) // 16, (torch.arange(n) // 4) % 4, torch.arange(n) % 4], dim=1
    )
    return x, coords


@pytest.fixture
def compressor() -> CraftCompressor:
    torch.manual_seed(0)
    return CraftCompressor(CraftConfig(hidden_size=DIM), sim_block=64)


def check_structure(out: CompressionResult, x: torch.Tensor, coords: torch.Tensor) -> None:
    n = x.shape[0]
    kept = out.kept_index
    assert out.features.shape == (kept.numel(), x.shape[1])
    assert out.features.dtype == x.dtype
    assert torch.all(kept[1:] > kept[:-1]), "kept_index must be strictly ascending"
    assert torch.equal(out.coords, coords[kept])
    assert out.assignment.shape == (n,)
    assert int(out.assignment.min()) >= 0 and int(out.assignment.max()) < kept.numel()
    # A kept token sits in its own row, and every row holds at least its own token.
    assert torch.equal(out.assignment[kept], torch.arange(kept.numel()))
    assert torch.bincount(out.assignment, minlength=kept.numel()).min() >= 1


@pytest.mark.parametrize("n", [2, 3, 7, 64, 257, 600])
@pytest.mark.parametrize("ratio", [1.0, 1.5, 2.0, 8.0, 32.0, 1000.0])
def test_fixed_ratio_reaches_exact_count(compressor: CraftCompressor, n: int, ratio: float) -> None:
    x, coords = tokens(n, seed=n)
    out = compressor(x, coords, ratio=ratio)
    assert out.num_kept == max(1, math.floor(n / ratio))
    check_structure(out, x, coords)
    if ratio == 1.0:
        assert out.rounds == 0 and torch.equal(out.features, x)


@pytest.mark.parametrize("threshold", [0.5, 0.8, 0.95, 1.0])
def test_threshold_mode_stops_when_no_pair_is_similar_enough(
    compressor: CraftCompressor, threshold: float
) -> None:
    x, coords = tokens(400, seed=3)
    out = compressor(x, coords, threshold=threshold)
    check_structure(out, x, coords)
    floor = max(1, 400 // 128)
    assert out.num_kept >= floor
    if out.num_kept > floor:
        emb = row_keys(out.features, grid_projection(compressor.projection))[0]
        sims = emb @ emb.T
        sims.fill_diagonal_(-2.0)
        assert float(sims.max()) < threshold


def test_threshold_mode_respects_an_explicit_floor(compressor: CraftCompressor) -> None:
    x, coords = tokens(300, seed=4)
    out = compressor(x, coords, threshold=-0.99, min_tokens=37)
    assert out.num_kept == 37
    out = compressor(x, coords, threshold=-0.99)
    assert out.num_kept == max(1, 300 // 128)


def test_single_token_is_returned_unchanged(compressor: CraftCompressor) -> None:
    x, coords = tokens(1)
    for budget in ({"ratio": 8.0}, {"threshold": 0.5}):
        out = compressor(x, coords, **budget)
        assert out.rounds == 0
        assert torch.equal(out.features, x) and out.kept_index.tolist() == [0]
        assert out.assignment.tolist() == [0]


def test_target_reduce_keeps_original_rows(compressor: CraftCompressor) -> None:
    pruner = CraftCompressor(CraftConfig(hidden_size=DIM, reduce="target"))
    x, coords = tokens(200)
    out = pruner(x, coords, ratio=8.0)
    assert torch.equal(out.features, x[out.kept_index])


def test_fresh_gate_is_exactly_one_half(compressor: CraftCompressor) -> None:
    x, _ = tokens(10)
    phi = round_embedding(3, compressor.config.round_embed_dim, x.device)
    gate = compressor.merge.gate(x[:2], x[2:7], torch.tensor([0, 0, 1, 1, 1]), phi)
    assert torch.equal(gate, torch.full_like(gate, 0.5))


def test_fuse_groups_matches_the_formula(compressor: CraftCompressor) -> None:
    # Fresh gate (G = 0.5) with position-aware weights computed here from the definition.
    x, coords = tokens(6)
    merge = compressor.merge
    targets, sources = torch.tensor([0, 0, 0, 4]), torch.tensor([1, 2, 3, 5])
    sims = torch.tensor([0.9, 0.8, 0.7, 0.95])
    out = compressor.fuse_groups(x, coords, targets, sources, sims)

    def rope(v: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        r = v.shape[0]
        inv = 1.0 / (10000.0 ** (torch.arange(0, r, 2).float() / r))
        axis = [0] * 16 + [1] * 24 + [2] * 24
        ang = torch.stack([c[axis[p]].float() * inv[p] for p in range(r // 2)])
        a, b = v[: r // 2], v[r // 2 :]
        return torch.cat([a * ang.cos() - b * ang.sin(), b * ang.cos() + a * ang.sin()])

    k = rope(torch.nn.functional.normalize(merge.w_k.weight @ x[0], dim=0), coords[0])
    logits = torch.stack(
        [
            (
                rope(torch.nn.functional.normalize(merge.w_q.weight @ x[s], dim=0), coords[s]) @ k
                + sims[i]
            )
            / 0.1
            for i, s in enumerate([1, 2, 3])
        ]
    )
    w = torch.softmax(logits, dim=0)
    expected0 = x[0] - sum(w[i] * 0.5 * (x[0] - x[s]) for i, s in enumerate([1, 2, 3]))
    expected4 = x[4] - 0.5 * (x[4] - x[5])
    torch.testing.assert_close(out[0], expected0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[4], expected4, rtol=1e-5, atol=1e-5)
    for untouched in (1, 2, 3, 5):
        assert torch.equal(out[untouched], x[untouched])


def test_mean_reduce_gives_weighted_mean_of_sources() -> None:
    mean = CraftCompressor(CraftConfig(hidden_size=DIM, reduce="mean", weighting="uniform"))
    x, coords = tokens(5)
    out = mean.fuse_groups(x, coords, torch.tensor([0, 0]), torch.tensor([1, 2]), torch.ones(2))
    torch.testing.assert_close(out[0], (x[1] + x[2]) / 2)


def test_rope_scores_depend_only_on_relative_position(compressor: CraftCompressor) -> None:
    q = torch.nn.functional.normalize(torch.randn(1, 128), dim=1)
    k = torch.nn.functional.normalize(torch.randn(1, 128), dim=1)
    cq, ck = torch.tensor([[3, 1, 4]]), torch.tensor([[1, 5, 9]])
    shift = torch.tensor([[7, 2, 11]])
    rope = compressor.merge.rope3d
    a = (rope(q, cq) * rope(k, ck)).sum()
    b = (rope(q, cq + shift) * rope(k, ck + shift)).sum()
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # Moving only t changes only the first 16 rotary pairs (dims 0..15 and 64..79).
    moved = rope(q, cq + torch.tensor([[1, 0, 0]])) - rope(q, cq)
    changed = torch.nonzero(moved.abs()[0] > 0).squeeze(1).tolist()
    assert set(changed) <= set(range(16)) | set(range(64, 80)) and changed


def test_gradients_reach_every_parameter_through_several_rounds() -> None:
    torch.manual_seed(1)
    compressor = CraftCompressor(CraftConfig(hidden_size=DIM), sim_block=32)
    # Move the adaLN-Zero layers off zero, as one optimizer step would.
    with torch.no_grad():
        for layer in (compressor.merge.w_up, compressor.merge.w_mod):
            layer.weight.normal_(0, 0.05)
            layer.bias.normal_(0, 0.05)
    x, coords = tokens(300, seed=2)
    x.requires_grad_(True)
    out = compressor(x, coords, ratio=8.0)
    assert out.rounds >= 3
    (out.features**2).sum().backward()
    for name, param in compressor.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert float(param.grad.abs().sum()) > 0, name
    # Every input row reaches the output through the merges of every round.
    assert x.grad is not None
    assert bool((x.grad.abs().sum(dim=1) > 0).all())


def test_fresh_module_trains_w_up_first() -> None:
    compressor = CraftCompressor(CraftConfig(hidden_size=DIM))
    x, coords = tokens(100)
    compressor(x, coords, ratio=4.0).features.sum().backward()
    assert compressor.merge.w_up.weight.grad is not None
    assert float(compressor.merge.w_up.weight.grad.abs().sum()) > 0


def test_bf16_input_selects_like_float32(compressor: CraftCompressor) -> None:
    x, coords = tokens(256, seed=5)
    x16 = x.to(torch.bfloat16)
    out16 = compressor(x16, coords, ratio=8.0)
    out32 = compressor(x16.float(), coords, ratio=8.0)
    assert out16.features.dtype == torch.bfloat16
    assert torch.equal(out16.kept_index, out32.kept_index)
    assert torch.equal(out16.assignment, out32.assignment)
    # A module cast to bf16 keeps W_rand in float32.
    cast = CraftCompressor(CraftConfig(hidden_size=DIM)).to(torch.bfloat16)
    assert cast.projection.dtype == torch.float32
    assert torch.equal(cast.projection, compressor.projection)
    assert cast(x16, coords, ratio=8.0).features.dtype == torch.bfloat16


def test_same_seed_is_bit_identical_run_to_run() -> None:
    x, coords = tokens(300, seed=6)
    results = []
    for _ in range(2):
        torch.manual_seed(123)
        compressor = CraftCompressor(CraftConfig(hidden_size=DIM))
        results.append(compressor(x, coords, threshold=0.8))
    a, b = results
    assert torch.equal(a.features, b.features)
    assert torch.equal(a.kept_index, b.kept_index)
    assert torch.equal(a.assignment, b.assignment)
    assert a.rounds == b.rounds


def test_projection_is_fixed_by_seed_and_column_normalised() -> None:
    a = CraftCompressor(CraftConfig(hidden_size=DIM, seed=3)).projection
    b = CraftCompressor(CraftConfig(hidden_size=DIM, seed=3)).projection
    c = CraftCompressor(CraftConfig(hidden_size=DIM, seed=4)).projection
    assert a.shape == (DIM, 128)
    assert torch.equal(a, b) and not torch.equal(a, c)
    torch.testing.assert_close(a.norm(dim=0), torch.ones(128))
    # Restated: a sum of four seeded uniform integers per entry, exact column norms.
    gen = torch.Generator().manual_seed(3)
    raw = torch.randint(-4096, 4096, (4, DIM, 128), generator=gen).sum(0).double()
    assert torch.equal(a, (raw / raw.norm(dim=0)).float())
    assert raw.mean().abs() < 0.05 * raw.std()  # zero-mean entries


def test_parameter_count_matches_the_paper() -> None:
    count = sum(p.numel() for p in CraftCompressor(CraftConfig(hidden_size=2560)).parameters())
    assert 4.5e6 < count < 5.5e6


def test_save_and_load_round_trip(tmp_path, compressor: CraftCompressor) -> None:
    with torch.no_grad():
        compressor.merge.w_up.weight.normal_()
    compressor.save_pretrained(tmp_path / "ckpt")
    loaded = CraftCompressor.from_pretrained(tmp_path / "ckpt")
    assert loaded.config == compressor.config
    x, coords = tokens(128)
    a, b = compressor(x, coords, ratio=4.0), loaded(x, coords, ratio=4.0)
    assert torch.equal(a.features, b.features)
    with pytest.raises(ValueError, match="hidden_size"):
        CraftCompressor.from_pretrained(tmp_path / "ckpt", hidden_size=DIM * 2)
    with pytest.raises(FileNotFoundError, match="not a CRAFT checkpoint"):
        CraftCompressor.from_pretrained(tmp_path)


def test_checkpoint_of_another_width_is_rejected(tmp_path) -> None:
    CraftCompressor(CraftConfig(hidden_size=16)).save_pretrained(tmp_path / "a")
    CraftCompressor(CraftConfig(hidden_size=DIM)).save_pretrained(tmp_path / "b")
    shutil.copy(tmp_path / "b" / "model.safetensors", tmp_path / "a" / "model.safetensors")
    with pytest.raises(ValueError, match="wrong shapes"):
        CraftCompressor.from_pretrained(tmp_path / "a")
    loaded = CraftCompressor.from_pretrained(tmp_path / "b")
    x, coords = tokens(8, dim=16)
    with pytest.raises(ValueError, match="hidden_size"):
        loaded(x, coords, ratio=2.0)


def test_compress_many_equals_one_call_per_video(compressor: CraftCompressor) -> None:
    videos = [tokens(n, seed=n) for n in (50, 130, 7)]
    batch = compressor.compress_many([v[0] for v in videos], [v[1] for v in videos], ratio=4.0)
    for (x, coords), got in zip(videos, batch):
        single = compressor(x, coords, ratio=4.0)
        assert torch.equal(got.features, single.features)
        assert torch.equal(got.assignment, single.assignment)
    with pytest.raises(ValueError, match="coords holds"):
        compressor.compress_many([videos[0][0]], [], ratio=2.0)


@pytest.mark.parametrize(
    "make, budget, error, match",
    [
        (lambda x, c: (x[0], c), {"ratio": 2.0}, ValueError, "features must be \\[N, D\\]"),
        (lambda x, c: (x[:, :5], c), {"ratio": 2.0}, ValueError, "hidden_size"),
        (lambda x, c: (x[:0], c[:0]), {"ratio": 2.0}, ValueError, "N = 0"),
        (lambda x, c: (x, c.float()), {"ratio": 2.0}, TypeError, "coords must be an integer"),
        (lambda x, c: (x, c[:, :2]), {"ratio": 2.0}, ValueError, "coords must be \\[N, 3\\]"),
        (lambda x, c: (x, c[:-1]), {"ratio": 2.0}, ValueError, "coords must be \\[N, 3\\]"),
        (lambda x, c: (x.long(), c), {"ratio": 2.0}, TypeError, "features must be a floating"),
        (
            lambda x, c: (x.index_fill(0, torch.tensor([3]), float("nan")), c),
            {"ratio": 2.0},
            ValueError,
            "NaN",
        ),
        (
            lambda x, c: (x.index_fill(0, torch.tensor([3]), float("inf")), c),
            {"ratio": 2.0},
            ValueError,
            "inf",
        ),
        (lambda x, c: (x, c), {"ratio": 0.5}, ValueError, "ratio"),
        (lambda x, c: (x, c), {"ratio": float("nan")}, ValueError, "ratio"),
        (lambda x, c: (x, c), {"threshold": 1.5}, ValueError, "threshold"),
        (lambda x, c: (x, c), {"threshold": -1.0}, ValueError, "threshold"),
        (lambda x, c: (x, c), {"ratio": 2.0, "threshold": 0.5}, ValueError, "exactly one"),
        (lambda x, c: (x, c), {}, ValueError, "exactly one"),
        (lambda x, c: (x, c), {"threshold": 0.5, "min_tokens": 0}, ValueError, "min_tokens"),
        (lambda x, c: (x, c), {"ratio": "8"}, TypeError, "ratio"),
        (lambda x, c: (x.numpy(), c), {"ratio": 2.0}, TypeError, "features must be a torch"),
    ],
)
def test_bad_input_is_rejected_with_the_argument_named(
    compressor: CraftCompressor, make, budget, error, match
) -> None:
    x, coords = tokens(10)
    features, c = make(x, coords)
    with pytest.raises(error, match=match):
        compressor(features, c, **budget)


def test_bad_config_names_the_field() -> None:
    with pytest.raises(ValueError, match="rope_sections"):
        CraftConfig(hidden_size=8, rope_sections=(10, 10, 10))
    with pytest.raises(ValueError, match="hidden_size"):
        CraftConfig(hidden_size=0)
    with pytest.raises(ValueError, match="weighting"):
        CraftConfig(hidden_size=8, weighting="softmax")  # type: ignore[arg-type]


def test_training_after_an_inference_mode_call() -> None:
    """A compression under `torch.inference_mode()` (evaluation) must not leave cached inference
    tensors behind that a later training step cannot save for backward (the round embedding
    is cached across calls)."""
    from core_testkit import make_tokens

    torch.manual_seed(0)
    module = CraftCompressor(CraftConfig(hidden_size=24, round_embed_dim=16))
    features, coords = make_tokens(3, 64, 24)
    with torch.inference_mode():
        module(features, coords, ratio=4.0)
    out = module(features, coords, ratio=4.0)
    out.features.sum().backward()
    grads = [p.grad for p in module.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
