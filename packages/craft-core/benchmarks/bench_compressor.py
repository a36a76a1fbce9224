"""Benchmark: CRAFT's whole compression against the irreducible work, measured in one run.

    uv run python packages/craft-core/benchmarks/bench_compressor.py [--quick] [--device cuda]

The irreducible work of one compression is ONE plain float32 pairing pass over all N tokens
(`normalize(X @ W_rand)`, blockwise products, row maxima: no exactness at all) plus ONE
batched evaluation of the gate MLP on all N - N_c merged pairs: no implementation of the
algorithm can do less. The printed ratio (whole compression / irreducible) is the overhead of
the round loop and of exactness; the target is at most 1.5 at N = 16,384, D = 2,560 and at
N = 8,192, D = 1,024, both budget modes, on a CPU in float32. Features are video-like
(scenes of slowly drifting patches), where the paper's loop needs several full pairing passes
because chain prevention defers many tokens. `rechk %` is the share of partner decisions
that the float32 pass could not certify (recomputed exactly), over all rounds; adversarial
inputs (a static clip, letterbox bars of identical tokens) are timed too. `--part merge`
states the cost of the merge's float64 arithmetic (the same rows on every CPU path) against
the same code in float32 (0.4's arithmetic, whose rows depend on the instruction set).
`--part precision` prints both precisions (`exact`, `fast`) beside DivPrune at N = 2,048 and
8,192, D = 1,024, ratio 8, with the float64 multiply-adds of a video (what `exact` costs on
a GPU with slow float64); `--part load` times one thread against two with a busy second
process on the same cores.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from craft_core import CraftCompressor, CraftConfig, target_token_count
from craft_core import merge as merge_module
from craft_core.algorithm import pair
from craft_core.certify import certified_partners
from craft_core.opcount import OpCounter
from craft_core.selection import grid_projection, row_keys


def video_like(
    frames: int, height: int, width: int, dim: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic video tokens `[F*H*W, D]` and raster-order coords `[F*H*W, 3]`.

    Each scene (a new one every 8 frames) is a grid of patches drawn around a few region
    centres (background, objects); frames of a scene repeat it with small drift and noise,
    and token norms vary, as projector outputs do.
    """
    gen = torch.Generator().manual_seed(seed)
    tokens = height * width
    scenes = []
    for _ in range((frames + 7) // 8):
        centres = torch.randn(6, dim, generator=gen)
        region = torch.randint(0, 6, (tokens,), generator=gen)
        scenes.append(centres[region] + 0.35 * torch.randn(tokens, dim, generator=gen))
    rows = []
    for t in range(frames):
        base = scenes[t // 8]
        drift = 0.05 * (t % 8) * torch.randn(tokens, dim, generator=gen)
        rows.append(base + drift + 0.1 * torch.randn(tokens, dim, generator=gen))
    features = torch.cat(rows)
    features = features * (0.5 + torch.rand(features.shape[0], 1, generator=gen))
    t, h, w = torch.meshgrid(
        torch.arange(frames), torch.arange(height), torch.arange(width), indexing="ij"
    )
    coords = torch.stack([t.reshape(-1), h.reshape(-1), w.reshape(-1)], dim=1)
    return features, coords


def timed_pair(
    first, second, repeats: int, device: torch.device
) -> tuple[list[float], list[float]]:  # type: ignore[no-untyped-def]
    """Seconds of `first()` and `second()`, interleaved `repeats` times after a warm-up.

    Interleaving makes each ratio compare two runs taken seconds apart, so a machine whose
    load drifts (CI runners, shared cores) biases both sides alike.
    """

    def once(fn) -> float:  # type: ignore[no-untyped-def]
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    first(), second()
    a, b = [], []
    for _ in range(repeats):
        a.append(once(first))
        b.append(once(second))
    return a, b


def adversarial(kind: str, frames: int, grid: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`static`: every frame an exact copy of the first (a still shot); `letterbox`: video-like
    frames whose top and bottom quarters are one identical black-bar token."""
    features, coords = video_like(frames, grid, grid, dim)
    per_frame = grid * grid
    if kind == "static":
        features = features[:per_frame].repeat(frames, 1)
    else:
        bar = torch.full((dim,), 0.01)
        rows = features.view(frames, grid, grid, dim)
        rows[:, : grid // 4] = bar
        rows[:, grid - grid // 4 :] = bar
    return features, coords


def plain_pass(features: torch.Tensor, projection: torch.Tensor, block: int) -> None:
    """One plain float32 pairing pass: no grids, no bound, no exact arithmetic."""
    embed = torch.nn.functional.normalize(features.float() @ projection, dim=1)
    for start in range(0, embed.shape[0], block):
        sims = embed[start : start + block] @ embed.T
        sims.diagonal(offset=start).fill_(float("-inf"))
        sims.max(dim=1)


def irreducible(compressor: CraftCompressor, features: torch.Tensor, kept: int) -> None:
    """One plain float32 pairing pass + one gate MLP evaluation on N - N_c pairs."""
    n = features.shape[0]
    # The same memory as the compressor's float32 blocks (2 x sim_block rows).
    plain_pass(features, compressor.projection, 2 * compressor.options.sim_block)
    merged = n - kept
    pairs = torch.cat([features[:merged], features[kept : kept + merged]], dim=1)
    merge = compressor.merge
    merge.gate_from_hidden(
        merge.w_down(pairs),
        merge_module.round_embedding(1, merge.config.round_embed_dim, features.device),
        torch.float32,
    )


def run_case(
    compressor: CraftCompressor,
    features: torch.Tensor,
    coords: torch.Tensor,
    repeats: int,
    **budget: float,
) -> dict[str, float]:
    device = features.device
    with torch.no_grad():
        out = compressor(features, coords, **budget)  # type: ignore[arg-type]
        kept = out.num_kept
        whole, floor = timed_pair(
            lambda: compressor(features, coords, **budget),  # type: ignore[arg-type]
            lambda: irreducible(compressor, features, kept),
            repeats,
            device,
        )
    return {
        "n": features.shape[0],
        "kept": kept,
        "rounds": out.rounds,
        "whole_s": statistics.median(whole),
        "irreducible_s": statistics.median(floor),
        "ratio": statistics.median(w / f for w, f in zip(whole, floor)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--huge", action="store_true", help="also time N = 65,536")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads (0: torch's default); 1 on shared cores",
    )
    parser.add_argument(
        "--part",
        choices=["all", "ratio", "cost", "ops", "small", "merge", "precision", "load", "train"],
        default="all",
        help="what to run",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dim = 256 if args.quick else 2560
    repeats = 1 if args.quick else args.repeats

    if args.part == "cost":
        return exactness_cost(device, dim, repeats)
    if args.part == "ops":
        return count_ops(device, args.quick)
    if args.part == "train":
        return training_step(repeats)
    if args.part == "small":
        return small_n(device, repeats)
    if args.part == "merge":
        return merge_cost(device, repeats)
    if args.part == "precision":
        return precision_table(device, repeats)
    if args.part == "load":
        return under_load(repeats)
    params = sum(p.numel() for p in CraftCompressor(CraftConfig(hidden_size=2560)).parameters())
    print(f"learnable parameters at D = 2560: {params:,} ({params / 1e6:.2f}M)")

    compressor = CraftCompressor(CraftConfig(hidden_size=dim)).to(device).eval()
    # (frames, grid) giving N = 4,096 / 16,384 / 65,536 at 16 x 16 tokens per frame.
    sizes = [(16, 16), (64, 16)] if args.quick else [(16, 16), (64, 16), (256, 16)]
    cases: list[tuple[str, tuple[int, int], dict[str, float]]] = [
        ("ratio 8", sizes[1], {"ratio": 8.0}),
        ("threshold 0.9", sizes[1], {"threshold": 0.9}),
        ("ratio 8", sizes[0], {"ratio": 8.0}),
    ]
    if args.huge:
        cases.append(("ratio 8", sizes[2], {"ratio": 8.0}))
    print(
        f"device {device}, float32, D = {dim}, sim_block = {compressor.options.sim_block}; "
        "irreducible = 1 plain float32 pairing pass + 1 gate MLP pass on the merged pairs"
    )
    header = (
        f"{'input':<10}{'budget':<14}{'N':>7}{'N_c':>7}{'rounds':>7}"
        f"{'whole s':>9}{'irred. s':>9}{'ratio':>7}"
    )
    print(header)
    print("-" * len(header))
    inputs = [("video", name, size, budget) for name, size, budget in cases]
    inputs += [(kind, "ratio 8", sizes[1], {"ratio": 8.0}) for kind in ("static", "letterbox")]
    for kind, name, (frames, grid), budget in inputs:
        if kind == "video":
            features, coords = video_like(frames, grid, grid, dim)
        else:
            features, coords = adversarial(kind, frames, grid, dim)
        features, coords = features.to(device), coords.to(device)
        r = run_case(compressor, features, coords, 1 if frames >= 256 else repeats, **budget)
        assert name.startswith("threshold") or r["kept"] == target_token_count(r["n"], 8.0)
        print(
            f"{kind:<10}{name:<14}{r['n']:>7}{r['kept']:>7}{r['rounds']:>7}"
            f"{r['whole_s']:>9.3f}{r['irreducible_s']:>9.3f}{r['ratio']:>7.2f}"
        )
    print(
        "ratio = median over interleaved repeats of (whole / irreducible); target <= 1.5 at N = 16,384"
    )
    if not args.quick:
        features, coords = video_like(32, 16, 16, 1024)
        small = CraftCompressor(CraftConfig(hidden_size=1024)).to(device).eval()
        for name, budget in (("ratio 8", {"ratio": 8.0}), ("threshold 0.9", {"threshold": 0.9})):
            r = run_case(small, features.to(device), coords.to(device), repeats, **budget)
            print(
                f"N = {r['n']:,}, D = 1,024, {name}: whole / irreducible = {r['ratio']:.2f} "
                f"({r['rounds']} rounds)"
            )
    if args.part == "all":
        exactness_cost(device, dim, repeats)
        count_ops(device, args.quick)
        training_step(repeats)
        small_n(device, repeats)
        merge_cost(device, repeats)
        precision_table(device, repeats)
        under_load(repeats)


def exactness_cost(device: torch.device, dim: int, repeats: int) -> None:
    """One pairing pass with exact results, float64 (0.2) and certified (0.3), against a
    plain float32 pass, N = 16,384; and the exact embedding (`row_keys`) alone."""
    features, _ = video_like(64, 16, 16, dim)
    features = features.to(device)
    compressor = CraftCompressor(CraftConfig(hidden_size=dim)).to(device)
    block = compressor.options.sim_block
    weight = grid_projection(compressor.projection)

    def exact() -> None:
        pair(row_keys(features, weight, block)[0], block)

    def certified() -> None:
        certified_partners(row_keys(features, weight, block)[0], block)

    def keys() -> None:
        row_keys(features, weight, block)

    def plain() -> None:
        plain_pass(features, compressor.projection, 2 * block)

    with torch.no_grad():
        for name, fn in (
            ("exact pass (float64 products, 0.2)", exact),
            ("certified pass (float32 + bound)", certified),
            ("exact embedding alone (row_keys)", keys),
        ):
            a, b = timed_pair(fn, plain, repeats, device)
            ratio = statistics.median(x / y for x, y in zip(a, b))
            print(f"{name} / plain float32 pass, N = 16,384: {ratio:.2f}")


def _counted(compressor: CraftCompressor, features: list, coords: list, **budget: float):  # type: ignore[no-untyped-def]
    """`(rounds of the longest video, ops, syncs)` of one `compress_many` call, warm."""
    with torch.no_grad():
        compressor.compress_many(features, coords, **budget)  # phi(m) cached per process
        with OpCounter() as count:
            outs = compressor.compress_many(features, coords, **budget)
    return max(o.rounds for o in outs), count.ops, count.syncs


def count_ops(device: torch.device, quick: bool = False) -> None:
    """ATen ops (views excluded) and host syncs per round (issue goal: <= 80 ops and <= 1
    sync a round at N = 16,384, D = 2,560, ratio 8, the same for a batch of 16), and the
    rounds on a panel of geometries (`geometry_panel`)."""
    n_frames, dim = (16, 256) if quick else (64, 2560)
    print(f"{'videos':<28}{'budget':<15}{'rounds':>7}{'ops/round':>11}{'syncs/round':>13}")
    cases = [(f"1 x N = {256 * n_frames:,}, D = {dim:,}", 1, n_frames, dim)]
    cases += [(f"{b} x N = 2,048, D = 1,024", b, 8, 1024) for b in (1, 16)]
    for label, batch, frames, width in cases:
        videos = [video_like(frames, 16, 16, width, seed=s) for s in range(batch)]
        features = [v[0].to(device) for v in videos]
        coords = [v[1].to(device) for v in videos]
        compressor = CraftCompressor(CraftConfig(hidden_size=width)).to(device).eval()
        for name, budget in (("ratio 8", {"ratio": 8.0}), ("threshold 0.9", {"threshold": 0.9})):
            rounds, ops, syncs = _counted(compressor, features, coords, **budget)
            print(f"{label:<28}{name:<15}{rounds:>7}{ops / rounds:>11.1f}{syncs / rounds:>13.2f}")
    print("syncs include one finiteness check per video per call (before the loop)")
    geometry_panel(device, quick)


def geometry_panel(device: torch.device, quick: bool = False) -> None:
    """Rounds, ops and time at ratio 8 on features of other geometries (N = 2,048, D =
    1,024): isotropic `randn`, `randn` plus one shared offset, uniform `rand` (both with a
    strong common direction: the norm-oriented rule serialises there), and the scene-like
    `video_like`. The world tower's own features: craft-world's benchmark."""
    n, dim = (512, 256) if quick else (2048, 1024)
    gen = torch.Generator().manual_seed(0)
    coords = video_like(n // 256, 16, 16, 8)[1]
    panel = {
        "randn": torch.randn(n, dim, generator=gen),
        "randn + shared offset": torch.randn(n, dim, generator=gen) + 3.0,
        "rand (uniform [0, 1))": torch.rand(n, dim, generator=gen),
        "video_like": video_like(n // 256, 16, 16, dim)[0],
    }
    compressor = CraftCompressor(CraftConfig(hidden_size=dim)).to(device).eval()
    print(f"{'features':<24}{'N':>6}{'rounds':>8}{'ops':>9}{'syncs':>7}{'ms':>9}")
    for name, features in panel.items():
        x, c = features.to(device), coords.to(device)
        rounds, ops, syncs = _counted(compressor, [x], [c], ratio=8.0)
        with torch.no_grad():
            start = time.perf_counter()
            compressor(x, c, ratio=8.0)
            ms = 1e3 * (time.perf_counter() - start)
        print(f"{name:<24}{n:>6}{rounds:>8}{ops:>9}{syncs:>7}{ms:>9.0f}")
    print("a shared direction serialises the paper's rule (docs/algorithm.md, 'Geometry')")


def training_step(repeats: int) -> None:
    """The training-shaped step (issue goal <= 120 ms): 16 videos of 144 tokens, D = 128,
    ratio 16, forward + backward through the merge, one `compress_many` call against one
    call per video, `exact` and `fast`, 1 thread, interleaved in one run."""
    gen = torch.Generator().manual_seed(0)
    videos = []
    for _ in range(16):
        centres = torch.randn(16, 128, generator=gen)
        pick = torch.randint(0, 16, (144,), generator=gen)
        videos.append(centres[pick] + 0.3 * torch.randn(144, 128, generator=gen))
    t = torch.arange(144)
    coords = torch.stack([t // 16, (t // 4) % 4, t % 4], dim=1)
    print(
        f"{'precision':<11}{'batched ms':>12}{'per video ms':>14}{'ops batched':>13}{'per video':>11}"
    )
    for precision in ("exact", "fast"):
        module = CraftCompressor(CraftConfig(hidden_size=128), precision=precision)
        for param in module.merge.parameters():
            param.data = 0.1 * torch.randn(param.shape, generator=gen)

        def batched(m: CraftCompressor = module) -> None:
            outs = m.compress_many(videos, [coords] * 16, ratio=16.0)
            sum((o.features**2).sum() for o in outs).backward()

        def one_by_one(m: CraftCompressor = module) -> None:
            outs = [m(v, coords, ratio=16.0) for v in videos]
            sum((o.features**2).sum() for o in outs).backward()

        together, apart = timed_pair(batched, one_by_one, repeats, torch.device("cpu"))
        ops = []
        for fn in (batched, one_by_one):
            with OpCounter() as count:
                fn()
            ops.append(count.ops)
        print(
            f"{precision:<11}{1e3 * statistics.median(together):>12.1f}"
            f"{1e3 * statistics.median(apart):>14.1f}{ops[0]:>13,}{ops[1]:>11,}"
        )


def _time_small(compressor, features, coords, repeats):  # type: ignore[no-untyped-def]
    """Rounds, and seconds of CRAFT / DivPrune / ToMe at ratio 8 (interleaved pairs)."""
    from craft_eval.baselines.divprune import divprune
    from craft_eval.baselines.tome import tome

    device = features.device
    rounds = compressor(features, coords, ratio=8.0).rounds
    craft, prune = timed_pair(
        lambda: compressor(features, coords, ratio=8.0),
        lambda: divprune(features, coords, ratio=8.0),
        repeats,
        device,
    )
    _, merge = timed_pair(
        lambda: compressor(features, coords, ratio=8.0),
        lambda: tome(features, coords, ratio=8.0),
        repeats,
        device,
    )
    return rounds, craft, prune, merge


def small_n(device: torch.device, repeats: int) -> None:
    """CRAFT's whole compression beside DivPrune and ToMe (craft-eval's), ratio 8, one run."""
    try:
        import craft_eval.baselines  # noqa: F401  (the baselines, installed by `nox -s bench`)
    except ImportError:
        print("small N: craft-eval is not installed here; DivPrune and ToMe not timed")
        return
    print(f"{'N':>6}{'D':>6}{'rounds':>7}{'CRAFT ms':>10}{'DivPrune ms':>13}{'ToMe ms':>9}", end="")
    print(f"{'CRAFT/DivPrune':>16}{'target':>8}  pairing        ops/round")
    for frames, grid, dim, target in ((4, 6, 128, 4.0), (8, 16, 1024, 1.5), (16, 16, 1024, 1.5)):
        features, coords = video_like(frames, grid, grid, dim)
        features, coords = features.to(device), coords.to(device)
        compressor = CraftCompressor(CraftConfig(hidden_size=dim)).to(device).eval()
        with torch.no_grad():
            rounds, craft, prune, merge = _time_small(compressor, features, coords, repeats)
        ratio = statistics.median(c / p for c, p in zip(craft, prune))
        ms = [1e3 * statistics.median(t) for t in (craft, prune, merge)]
        print(f"{features.shape[0]:>6}{dim:>6}{rounds:>7}{ms[0]:>10.1f}{ms[1]:>13.1f}", end="")
        with torch.no_grad(), OpCounter() as count:
            out = compressor(features, coords, ratio=8.0)
        print(f"{ms[2]:>9.1f}{ratio:>16.2f}{'<= ' + str(target):>8}  ", end="")
        print(f"{out.info['pairing']:<15}{count.ops / out.rounds:>9.1f}")


def merge_cost(device: torch.device, repeats: int) -> None:
    """Whole compression with the merge in float64 (`exact`: the same rows on every CPU path)
    against the same code in float32 (`fast`), N = 8,192, ratio 8, interleaved in one run."""
    for dim in (1024, 2560):
        _merge_row(dim, device, repeats)


def _merge_row(dim: int, device: torch.device, repeats: int) -> None:
    """`merge_cost` at one width."""
    features, coords = video_like(32, 16, 16, dim)
    features, coords = features.to(device), coords.to(device)
    exact, fast = precisions(dim, device)
    with torch.no_grad():
        wide, narrow = timed_pair(
            lambda: exact(features, coords, ratio=8.0),
            lambda: fast(features, coords, ratio=8.0),
            repeats,
            device,
        )
    ratio = statistics.median(a / b for a, b in zip(wide, narrow))
    print(
        f"merge arithmetic, N = {features.shape[0]:,}, D = {dim:,}, ratio 8: float64 "
        f"{statistics.median(wide):.3f} s, float32 {statistics.median(narrow):.3f} s, "
        f"float64 / float32 = {ratio:.2f}"
    )


def precisions(dim: int, device: torch.device) -> tuple[CraftCompressor, CraftCompressor]:
    """`exact` and `fast` compressors with the same weights."""
    exact = CraftCompressor(CraftConfig(hidden_size=dim)).to(device).eval()
    fast = CraftCompressor(CraftConfig(hidden_size=dim), precision="fast").to(device).eval()
    fast.load_state_dict(exact.state_dict())
    return exact, fast


class Float64Flops(TorchDispatchMode):
    """Floating-point operations of the matrix products (torch's FLOP formulas) dispatched
    inside the block, in `float64` and in all: the work a GPU with slow float64 pays."""

    def __init__(self) -> None:
        super().__init__()
        self.float64 = 0
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
            self.total += flops
            if any(isinstance(a, torch.Tensor) and a.dtype == torch.float64 for a in args):
                self.float64 += flops
        return out


def precision_table(device: torch.device, repeats: int) -> None:
    """Both precisions beside DivPrune, D = 1,024, ratio 8, interleaved in one run (median
    of `repeats`); the float64 matrix-product FLOPs of one video in each precision."""
    try:
        import craft_eval.baselines  # noqa: F401  (DivPrune, installed by `nox -s bench`)
    except ImportError:
        print("precision: craft-eval is not installed here; DivPrune not timed")
        return
    print(
        f"precision beside DivPrune, device {device}, {torch.get_num_threads()} threads, D = 1,024"
    )
    print(
        f"{'N':>6}{'exact ms':>10}{'fast ms':>9}{'DivPrune':>10}{'exact/DP':>10}{'fast/DP':>9}"
        f"{'fast/irr':>10}{'f64 GFLOP exact':>17}{'fast':>6}{'same tokens':>13}"
    )
    for frames in (8, 32):
        _precision_row(frames, device, repeats if frames == 8 else max(1, repeats // 2))
    print("goals: fast/DP <= 1.5 and exact/DP <= 2.0 at N = 2,048; fast/irr <= 1.5 at 8,192")


def _precision_row(frames: int, device: torch.device, runs: int) -> None:
    """One row of `precision_table`: N = 256 x `frames` tokens."""
    from craft_eval.baselines.divprune import divprune

    features, coords = video_like(frames, 16, 16, 1024)
    features, coords = features.to(device), coords.to(device)
    exact, fast = precisions(1024, device)
    with torch.no_grad():
        kept = exact(features, coords, ratio=8.0)
        quick = fast(features, coords, ratio=8.0)
        flops = []
        for module in (exact, fast):
            with Float64Flops() as count:
                module(features, coords, ratio=8.0)
            flops.append(count.float64 / 1e9)
        wide, narrow = timed_pair(
            lambda: exact(features, coords, ratio=8.0),
            lambda: fast(features, coords, ratio=8.0),
            runs,
            device,
        )
        _, prune = timed_pair(
            lambda: fast(features, coords, ratio=8.0),
            lambda: divprune(features, coords, ratio=8.0),
            runs,
            device,
        )
        _, floor = timed_pair(
            lambda: fast(features, coords, ratio=8.0),
            lambda: irreducible(fast, features, kept.num_kept),
            runs,
            device,
        )
    ms = [1e3 * statistics.median(t) for t in (wide, narrow, prune, floor)]
    same = torch.equal(kept.kept_index, quick.kept_index)
    print(
        f"{features.shape[0]:>6}{ms[0]:>10.1f}{ms[1]:>9.1f}{ms[2]:>10.1f}"
        f"{ms[0] / ms[2]:>10.2f}{ms[1] / ms[2]:>9.2f}{ms[1] / ms[3]:>10.2f}"
        f"{flops[0]:>17.2f}{flops[1]:>6.2f}{same!s:>13}"
    )


BUSY = """
import torch
torch.set_num_threads(2)
a = torch.randn(512, 512)
while True:
    a = (a @ a).tanh_()
"""


def under_load(repeats: int) -> None:
    """Eager CRAFT (`exact`), N = 2,048, D = 1,024, ratio 8, on 1 and 2 intra-op threads
    (the `threads` run option),
    quiet and beside a busy second process (2 threads of matrix products) on the same
    cores: the small-op loop waits at OpenMP barriers for a thread that is not scheduled."""
    features, coords = video_like(8, 16, 16, 1024)
    exact, _ = precisions(1024, torch.device("cpu"))

    def median_ms(threads: int) -> float:
        exact.configure(threads=threads)  # the run option (1 is the default)
        with torch.no_grad():
            exact(features, coords, ratio=8.0)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                exact(features, coords, ratio=8.0)
                times.append(time.perf_counter() - start)
        return 1e3 * statistics.median(times)

    try:
        quiet = {t: median_ms(t) for t in (1, 2)}
        busy = subprocess.Popen([sys.executable, "-c", BUSY])
        try:
            time.sleep(2.0)  # let it start
            loaded = {t: median_ms(t) for t in (1, 2)}
        finally:
            busy.kill()
            busy.wait()
    finally:
        exact.configure(threads=1)
    for t in (1, 2):
        print(
            f"N = 2,048, D = 1,024, exact, {t} thread(s): quiet {quiet[t]:.1f} ms, beside a "
            f"busy process {loaded[t]:.1f} ms ({loaded[t] / quiet[t]:.2f}x)"
        )


if __name__ == "__main__":
    main()
