"""Helpers shared by craft-core's tests: path-independent noise, grid coords, live weights.

Imported by the test modules (`from core_testkit import noise`); pytest puts this folder on
`sys.path`. Nothing here is a test.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from craft_core import CompressionResult, CraftCompressor, CraftConfig


def noise(*shape: int, generator: torch.Generator) -> torch.Tensor:
    """Zero-mean noise of about unit scale that is the same bits on every CPU path.

    (`torch.randn` is not: its vectorised Box-Muller rounds differently with AVX2/AVX-512.)
    """
    return (torch.rand(4, *shape, generator=generator) - 0.5).sum(0) * 1.7


def grid_coords(frames: int, height: int, width: int) -> torch.Tensor:
    """Raster-order `(t, h, w)` of every token of a `frames x height x width` clip: `[F*H*W, 3]`."""
    t, h, w = torch.meshgrid(
        torch.arange(frames), torch.arange(height), torch.arange(width), indexing="ij"
    )
    return torch.stack([t.flatten(), h.flatten(), w.flatten()], dim=1)


def make_tokens(seed: int, n: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Frames of 4 tokens from a few clusters, with static (copied) frames and duplicates."""
    gen = torch.Generator().manual_seed(seed)
    centres = noise(max(1, n // 8), dim, generator=gen)
    pick = torch.randint(0, centres.shape[0], (n,), generator=gen)
    x = centres[pick] + 0.4 * noise(n, dim, generator=gen)
    frames = n // 4
    for f in range(1, frames):
        if torch.rand(1, generator=gen).item() < 0.35:  # a static frame repeats the last one
            x[4 * f : 4 * f + 4] = x[4 * f - 4 : 4 * f]
    if n >= 6:
        x[n - 1] = x[1]
        x[n - 2] = x[1]
    positions = torch.arange(n)
    coords = torch.stack([positions // 4, (positions // 2) % 2, positions % 2], dim=1)
    return x, coords


SIZES = [2, 3, 5, 8, 12, 17, 20, 24, 33, 40, 48, 56, 64, 77, 90, 100]
BUDGETS = [{"ratio": 4.0}, {"ratio": 1.7}, {"threshold": 0.6}]
BLOCKS = [16, 5]


def live_weights(compressor: CraftCompressor, seed: int, scale: float = 0.2) -> CraftCompressor:
    """Give every merge parameter path-independent, non-trivial values (a live gate)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in compressor.merge.parameters():
            param.copy_(scale * noise(*param.shape, generator=gen))
    return compressor


def reference_gate(compressor: CraftCompressor, seed: int) -> CraftCompressor:
    """The reference cases' gate: W_up and W_mod at 0.3 x seeded noise (a gate that varies
    per channel and round), the rest as initialised."""
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for layer in (compressor.merge.w_up, compressor.merge.w_mod):
            layer.weight.copy_(0.3 * noise(*layer.weight.shape, generator=gen))
            layer.bias.copy_(0.3 * noise(*layer.bias.shape, generator=gen))
    return compressor


class Case(NamedTuple):
    """A reference case: the config, its run options (sim_block), the seed, N, the budget and
    whether autograd is on."""

    config: CraftConfig
    options: dict[str, Any]
    seed: int
    n: int
    budget: dict
    grad: bool


def reference_cases() -> list[Case]:
    """The 216 reference cases of `test_reference.py` (and pinned by `test_same_tokens.py`):
    uniform weighting with the target/mean fusions on every size, and position weights with
    the gate. `grad` alternates the row stores (in place without autograd, stitched pieces
    with it); sim_block 16 and 5 force several blocks even at these sizes (before 1.1 the two
    copies were the two pairing strategies; their pins were equal and are kept, renamed)."""
    out = []
    for block in BLOCKS:
        options = {"sim_block": block}
        for reduce in ["target", "mean"]:
            for n in SIZES:
                for budget in BUDGETS:
                    config = CraftConfig(
                        hidden_size=24, sim_dim=16, weighting="uniform", reduce=reduce
                    )
                    seed = 100 * n + len(str(budget))
                    out.append(Case(config, options, seed, n, budget, n % 2 == 0))
    for n in [8, 17, 33, 64]:
        for budget in BUDGETS:
            for block in BLOCKS:
                config = CraftConfig(
                    hidden_size=24,
                    sim_dim=16,
                    rank=8,
                    rope_sections=(2, 1, 1),
                    gate_hidden=16,
                    round_embed_dim=8,
                )
                options = {"sim_block": block}
                out.append(Case(config, options, 7 * n, n, budget, n % 2 == 1))
    return out


def case_id(case: Case) -> str:
    """`blockB/reduce/weighting/n/budget`: a reference case's name (its pin's key)."""
    config = case.config
    block = case.options["sim_block"]
    return f"block{block}/{config.reduce}/{config.weighting}/{case.n}/{case.budget}"


def run_reference_case(
    case: Case, **options: Any
) -> tuple[CraftCompressor, torch.Tensor, torch.Tensor, CompressionResult]:
    """One reference case run as `test_reference.py` checks it and `test_same_tokens.py`
    pins it (`options` replace the case's run options): the seeded compressor (with the
    reference gate for `reduce="gate"`), its tokens `x` [n, D] and `coords` [n, 3], and its
    output at the case's budget (autograd on when `grad`)."""
    config = case.config
    torch.manual_seed(case.seed)
    compressor = CraftCompressor(config, **{**case.options, **options})
    if config.reduce == "gate":  # a trained-looking gate, not the constant 0.5 of a fresh one
        reference_gate(compressor, case.seed)
    x, coords = make_tokens(case.seed, case.n, config.hidden_size)
    with torch.set_grad_enabled(case.grad):
        out = compressor(x, coords, **case.budget)
    return compressor, x, coords, out


def equals_the_plain_round(
    out: CompressionResult,
    compressor: CraftCompressor,
    x: torch.Tensor,
    coords: torch.Tensor,
    budget: dict[str, float],
) -> bool:
    """Whether `out` (the compressor's result on `x`, `coords` at `budget`, a `TokenBudget`'s
    keywords) has the plain round's tokens, owners, rounds and rows (bit for bit)."""
    from craft_core import resolve_budget
    from craft_core.algorithm import compress

    resolved = resolve_budget(x.shape[0], **budget)
    kept, owner, rows, rounds = compress(compressor, x, coords, resolved)
    return (
        out.kept_index.tolist() == kept
        and [kept[i] for i in out.assignment.tolist()] == owner
        and out.rounds == rounds
        and torch.equal(out.features.detach(), rows)
    )
