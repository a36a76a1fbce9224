"""The GPU session in one script: compression alone at real size, then Table 2 end to end.

    python packages/craft-eval/benchmarks/bench_gpu.py --out DIR            # on a GPU
    uv run python packages/craft-eval/benchmarks/bench_gpu.py --quick --device cpu --out /tmp/g

A lent GPU comes for minutes, so everything a session measures runs here in one go, each
part writing its JSON to `--out` as soon as it is done (a run cut short keeps what it had).

Part 1, compression alone: video-like bf16 tokens (`bench_compressor.video_like`), ratio 8
(and `--compress-ratios`' others at the smallest N), N x D from `--sizes` x `--dims`, and
`--batch` videos of the smallest N in ONE `compress_many` call (per video: time, launches,
the same tokens and rows as alone). Each `--variant NAME=opt=value,...` is a `CraftCompressor`
built with those run options (`exact` and `fast` by default; `--variant graphs=cuda_graphs=true`
for the captured round; `compile=true` variants run only
at `--compile-size`, since each new video length pays a compile). Per variant: the first
call (context, cuBLAS and any compile or capture), the median warm time, and the host launch
calls of one video (the profiler's count of kernel, graph, copy and memset launches). Beside
them DivPrune (craft-eval's baseline) and one plain pairing pass: `normalize(X) @ X^T` in
float32 blocks with row maxima, the one product no implementation can skip.

Part 2, end to end (`measure_efficiency`): the language models of `--archs` at real size with
random weights (bf16, sdpa), `--frames` frames; uncompressed, CRAFT at `--ratios` (each
variant without `compile`) and DivPrune: compression ms + prefill ms to the first token, KV
MB and the analytical FLOPs reduction. The paper's Table 2 (Qwen3.5-4B, H100): prefill
249.2 ms uncompressed, 64.8 ms at 9.30x, compression included.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "craft-core" / "benchmarks"))
from bench_compiled import launch_calls
from bench_compressor import timed_pair, video_like

from craft_core import CraftCompressor, CraftConfig
from craft_eval.baselines.divprune import divprune


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """`fast=precision=fast` -> ("fast", {"precision": "fast"}); `exact=` -> ("exact", {})."""
    name, _, rest = text.partition("=")
    options: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--variant {text!r}: {item!r} is not key=value")
        lowered = value.lower()
        options[key] = (
            lowered == "true"
            if lowered in ("true", "false")
            else int(value)
            if value.isdigit()
            else value
        )
    if not name:
        raise SystemExit(f"--variant {text!r}: give it a name, e.g. fast=precision=fast")
    return name, options


def first_call(fn: Any, device: torch.device) -> float:
    """Seconds of the first `fn()` (context, cuBLAS, any compile or capture)."""
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def pairing_pass(features: torch.Tensor, block: int = 4096) -> None:
    """One plain float32 pairing pass: every token's most similar other token."""
    embed = torch.nn.functional.normalize(features.float(), dim=1)
    for start in range(0, embed.shape[0], block):
        sims = embed[start : start + block] @ embed.T
        sims.diagonal(offset=start).fill_(float("-inf"))
        sims.max(dim=1)


def compression_rows(args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    """Part 1: one row per (N, D, ratio, runner); `--batch` videos in one `compress_many`
    call beside the one-video runners (at the smallest N)."""
    rows: list[dict[str, Any]] = []
    for dim in args.dims:
        weights = CraftCompressor(CraftConfig(hidden_size=dim)).state_dict()
        for n in args.sizes:
            for ratio in args.compress_ratios:
                if ratio != args.compress_ratios[0] and n != args.sizes[0]:
                    continue  # the second ratio at the smallest size only (device time)
                rows += _compression_cell(args, device, (n, dim, ratio), weights)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return rows


def _compression_cell(
    args: argparse.Namespace,
    device: torch.device,
    shape: tuple[int, int, float],
    weights: dict[str, torch.Tensor],
) -> list[dict[str, Any]]:
    """The rows of one (N, D, ratio): every variant, DivPrune, one pairing pass, a batch."""
    n, dim, ratio = shape
    features, coords = video_like(n // 256, 16, 16, dim)
    features, coords = features.to(device, torch.bfloat16), coords.to(device)
    runners: dict[str, Any] = {
        "DivPrune": lambda f=features, c=coords: divprune(f, c, ratio=ratio),
        "pairing pass": lambda f=features: pairing_pass(f),
    }
    modules = {}
    for name, options in args.variant:
        if options.get("compile") and n != args.compile_size:
            continue
        module = CraftCompressor(CraftConfig(hidden_size=dim), **options)
        module.load_state_dict(weights)
        modules[name] = module.to(device).eval()
        runners[name] = lambda m=modules[name], f=features, c=coords: m(f, c, ratio=ratio)
    batch: list[torch.Tensor] = []
    if args.batch > 1 and n == args.sizes[0] and "exact" in modules:
        videos = [video_like(n // 256, 16, 16, dim, seed=s) for s in range(args.batch)]
        batch = [v[0].to(device, torch.bfloat16) for v in videos]
        batch_coords = [v[1].to(device) for v in videos]
        runners[f"exact, {args.batch} videos in one call"] = lambda: modules["exact"].compress_many(
            batch, batch_coords, ratio=ratio
        )
    rows, kept = [], {}
    for name, fn in runners.items():
        with torch.inference_mode():
            first = first_call(fn, device)
            times = timed_pair(fn, lambda: None, args.repeats, device)[0]
            out = fn()
            launches = launch_calls(fn) if device.type == "cuda" else None
        if hasattr(out, "kept_index") and name != "DivPrune":
            kept[name] = out.kept_index.cpu()
        row = {
            "N": n,
            "D": dim,
            "ratio": ratio,
            "runner": name,
            "first_s": round(first, 3),
            "ms": round(1e3 * statistics.median(times), 2),
            "launches": launches,
        }
        if isinstance(out, list):  # the batch: per video, and the same tokens as alone
            row["ms_per_video"] = round(row["ms"] / len(out), 2)
            row["launches_per_video"] = None if launches is None else launches / len(out)
            alone = modules["exact"](batch[0], batch_coords[0], ratio=ratio)
            row["first_video_same_as_alone"] = bool(
                torch.equal(out[0].kept_index, alone.kept_index)
                and torch.equal(out[0].features, alone.features)
            )
        if name in kept:
            row["same_tokens_as_first_variant"] = bool(
                torch.equal(kept[name], next(iter(kept.values())))
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def end_to_end(args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    """Part 2: `measure_efficiency` per arch, CRAFT in each eager variant, DivPrune once."""
    from craft_eval.efficiency import format_efficiency, measure_efficiency

    overrides = json.loads(args.override) if args.override else None
    results = []
    for arch in args.archs:
        plans: list[tuple[tuple[str, ...], dict[str, Any]]] = [
            (("craft", "divprune") if i == 0 else ("craft",), options)
            for i, (_, options) in enumerate(v for v in args.variant if not v[1].get("compile"))
        ]
        for methods, options in plans:
            try:
                result = measure_efficiency(
                    arch,
                    num_frames=args.frames,
                    ratios=args.ratios,
                    methods=methods,
                    device=device,
                    dtype=torch.bfloat16 if device.type == "cuda" else torch.float32,
                    warmup=2,
                    repeats=args.repeats,
                    overrides=overrides,
                    progress=False,
                    method_options=options,
                )
            except Exception as error:  # one arch failing must not cost the others' figures
                print(f"{arch} {options}: FAILED: {type(error).__name__}: {error}", flush=True)
                continue
            print(format_efficiency(result), flush=True)
            results.append(result)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON files")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a dry run on a CPU)")
    parser.add_argument("--sizes", default="6272,16384,65536")
    parser.add_argument("--compress-ratios", default="8,16")
    parser.add_argument("--batch", type=int, default=8, help="videos in one compress_many call")
    parser.add_argument("--dims", default="2560,3584")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variant", action="append", type=parse_variant, default=None)
    parser.add_argument("--compile-size", type=int, default=16384)
    parser.add_argument("--archs", default="qwen3.5-4b,qwen2.5-vl-7b")
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--ratios", default="8,16")
    parser.add_argument("--override", default=None, help="JSON text-config overrides")
    parser.add_argument("--parts", default="compression,end_to_end")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here (use --device cpu for a dry run)")
    if args.quick:
        args.sizes, args.dims, args.repeats, args.frames = "512,1024", "64", 2, 4
        args.batch = 3
        args.override = args.override or json.dumps(
            {
                "num_hidden_layers": 4,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
            }
        )
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.dims = [int(d) for d in args.dims.split(",")]
    args.archs = args.archs.split(",")
    args.ratios = [float(r) for r in args.ratios.split(",")]
    args.compress_ratios = [float(r) for r in args.compress_ratios.split(",")]
    args.variant = args.variant or [("exact", {}), ("fast", {"precision": "fast"})]
    args.compile_size = args.sizes[1] if args.quick else args.compile_size
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}, variants {args.variant}", flush=True)
    for part in args.parts.split(","):
        rows = {"compression": compression_rows, "end_to_end": end_to_end}[part](args, device)
        (args.out / f"{part}.json").write_text(json.dumps({"device": name, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
