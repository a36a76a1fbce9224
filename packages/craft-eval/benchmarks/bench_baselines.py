"""Benchmark: every baseline's compression time next to CRAFT's, measured in one run.

    uv run python packages/craft-eval/benchmarks/bench_baselines.py [--quick] [--device cuda]

One video of N = 64 frames x 196 tokens = 12,544 tokens of width D = 3,584 (LLaVA-OV-7B at
64 frames), CPU float32 by default, fixed ratio 8 (1,568 tokens out) for every method;
LLaVA-Scissor also runs in its own threshold mode (tau = 0.9). The features are video-like:
scenes of a few regions that drift slowly over 8 frames, token norms varying. No vision
attention is at hand, so VisionZip and FastVID run on the L2-norm proxy. CRAFT is a fresh
`CraftCompressor` (an untrained gate costs what a trained one does). Each method runs once
after a warm-up on a small clip; the printed ratio is its time over CRAFT's.
`--quick` shrinks the video (16 frames, D = 512) to check the script end to end.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable

import torch

from craft_core import CompressionResult, CraftCompressor, CraftConfig, target_token_count
from craft_eval.baselines import (
    divprune,
    dtd,
    fastvid,
    llava_scissor,
    scissor_merge,
    tome,
    vidcom2,
    visionzip,
)

RATIO = 8.0


def video_like(
    frames: int, height: int, width: int, dim: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """`[F*H*W, D]` tokens with temporal redundancy and raster-order `(t, h, w)` coords.

    A new scene every 8 frames: a grid of patches drawn around 6 region centres; the frames
    of a scene repeat it with growing drift and fresh noise; token norms vary by up to 3x.
    """
    gen = torch.Generator().manual_seed(seed)
    tokens = height * width
    rows = []
    for t in range(frames):
        if t % 8 == 0:
            centres = torch.randn(6, dim, generator=gen)
            region = torch.randint(0, 6, (tokens,), generator=gen)
            scene = centres[region] + 0.35 * torch.randn(tokens, dim, generator=gen)
        drift = 0.05 * (t % 8) * torch.randn(tokens, dim, generator=gen)
        rows.append(scene + drift + 0.1 * torch.randn(tokens, dim, generator=gen))
    features = torch.cat(rows)
    features = features * (0.5 + torch.rand(features.shape[0], 1, generator=gen))
    grid = torch.meshgrid(
        torch.arange(frames), torch.arange(height), torch.arange(width), indexing="ij"
    )
    return features, torch.stack([axis.reshape(-1) for axis in grid], dim=1)


def methods(dim: int, device: torch.device) -> dict[str, Callable[..., CompressionResult]]:
    """name -> `(features, coords) -> result`, CRAFT first."""
    craft = CraftCompressor(CraftConfig(hidden_size=dim)).to(device).eval()

    def run_craft(x: torch.Tensor, c: torch.Tensor) -> CompressionResult:
        with torch.no_grad():
            return craft(x, c, ratio=RATIO)

    return {
        "craft": run_craft,
        "tome": lambda x, c: tome(x, c, ratio=RATIO),
        "divprune": lambda x, c: divprune(x, c, ratio=RATIO),
        "visionzip": lambda x, c: visionzip(x, c, ratio=RATIO),
        "vidcom2": lambda x, c: vidcom2(x, c, ratio=RATIO),
        "fastvid": lambda x, c: fastvid(x, c, ratio=RATIO),
        "llava-scissor": lambda x, c: llava_scissor(x, c, ratio=RATIO),
        "llava-scissor (tau 0.9)": lambda x, c: llava_scissor(x, c, threshold=0.9),
        "dtd": lambda x, c: dtd(x, c, ratio=RATIO),
        "scissor-merge": lambda x, c: scissor_merge(x, c, compressor=craft, ratio=RATIO),
    }


def timed(fn: Callable[[], CompressionResult], device: torch.device) -> tuple[float, int]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, result.num_kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 frames, D = 512")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", nargs="*", help="run only these methods (plus craft)")
    args = parser.parse_args()
    device = torch.device(args.device)
    frames, dim = (16, 512) if args.quick else (64, 3584)
    features, coords = video_like(frames, 14, 14, dim)
    features, coords = features.to(device), coords.to(device)
    n = features.shape[0]
    table = methods(dim, device)
    if args.only:
        table = {k: v for k, v in table.items() if k == "craft" or k in args.only}
    warm_x, warm_c = video_like(2, 4, 4, dim, seed=1)
    warm_x, warm_c = warm_x.to(device), warm_c.to(device)
    print(
        f"N = {n} ({frames} frames x 196), D = {dim}, {device.type} float32, ratio {RATIO:g} "
        f"-> {target_token_count(n, RATIO)} tokens; torch threads: {torch.get_num_threads()}"
    )
    times: dict[str, tuple[float, int]] = {}
    for name, fn in table.items():
        fn(warm_x, warm_c)
        times[name] = timed(functools.partial(fn, features, coords), device)
        print(f"  measured {name}: {times[name][0]:.2f} s", flush=True)
    base = times["craft"][0]
    print("\n| method | tokens out | seconds | x CRAFT |\n| --- | ---: | ---: | ---: |")
    for name, (seconds, kept) in times.items():
        print(f"| {name} | {kept} | {seconds:.2f} | {seconds / base:.2f} |")


if __name__ == "__main__":
    main()
