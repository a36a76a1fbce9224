"""Serving cost of CRAFT inside vLLM on the CPU: requests/s and time to first token.

    uv run nox -s bench            # or: nox -s vllm -- bench   (the vLLM environment)
    python packages/craft-vllm/benchmarks/bench_serving.py [--videos 8] [--frames 64]

One run, one machine, the tiny Qwen2.5-VL of the tests (random weights, head size 64) and a
random CRAFT checkpoint; every configuration gets a fresh in-process engine (float32, eager,
prefix caching off so every request pays its prefill). Rows:

- uncompressed;
- EVS (vLLM's `--video-pruning-rate`) at the retained count of CRAFT 4x and 8x (EVS cannot
  keep fewer than one frame's tokens, so it has no 16x row at this frame size);
- CRAFT 4x, 8x, 16x.

TTFT = median wall time of a one-token request, one video at a time (vision tower +
compression + prefill); requests/s = `--videos` requests of 16 greedy tokens, one batch.
The tiny language model costs almost nothing, so these figures show vLLM's and the
compressor's overheads, not the prefill savings of a real-size model. `--real LAYERS`:
Qwen2.5-VL-3B's language-model shapes (width 2048, 16 heads, MLP 11008) with LAYERS of its
36 layers in bfloat16, 280 x 280 frames (the tiny vision tower, projecting to 2048), CRAFT
4x/8x: where compression starts to pay. Every row prints the load average and thread
settings it ran under: on a shared machine they move the figures (README).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import engine
import tiny

REAL_LM = {  # Qwen2.5-VL-3B's language model (the smallest Qwen2.5-VL), random weights
    "hidden_size": 2048,
    "intermediate_size": 11008,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
}


def _conditions() -> str:
    """What a figure depends on besides the code: load, threads (printed with every row)."""
    import torch

    load = Path("/proc/loadavg").read_text().split()[:3]
    env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND")}
    return f"loadavg {' '.join(load)}, torch threads {torch.get_num_threads()}, {env}"


def _measure(llm, videos: list, ttft_videos: list) -> tuple[float, float, int]:
    from vllm import SamplingParams

    text = engine.prompt()

    def request(v):
        return {"prompt": text, "multi_modal_data": {"video": engine.video_item(v)}}

    one = SamplingParams(max_tokens=1, temperature=0.0)
    llm.generate([request(ttft_videos[0])], one, use_tqdm=False)  # warm-up
    times = []
    for v in ttft_videos[1:]:
        batch = [request(v)]
        start = time.perf_counter()
        out = llm.generate(batch, one, use_tqdm=False)
        times.append(time.perf_counter() - start)
    length = len(out[0].prompt_token_ids)
    many = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    batch = [request(v) for v in videos]
    start = time.perf_counter()
    llm.generate(batch, many, use_tqdm=False)
    rate = len(videos) / (time.perf_counter() - start)
    return rate, statistics.median(times), length


def _compress_ms(llm, frames: int, side: int, ratio: float) -> float:
    """Median time of the served model's own CRAFT module on one video's rows (random), in
    the engine's process (its thread settings): the compression's part of a TTFT."""
    import torch
    from craft_vllm.positions import grid_positions

    coords = torch.from_numpy(grid_positions(frames // 2, side, side)).T.contiguous()

    def timed(model) -> float:
        dtype = next(model.parameters()).dtype
        rows = torch.randn(coords.shape[0], model.craft.config.hidden_size, dtype=dtype)
        times = []
        with torch.inference_mode():
            for _ in range(4):
                start = time.perf_counter()
                model.craft(rows, coords, ratio=ratio)
                times.append(time.perf_counter() - start)
        return statistics.median(times[1:]) * 1000

    return float(llm.apply_model(timed)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=int, default=8, help="requests in the throughput batch")
    parser.add_argument("--frames", type=int, default=64, help="frames per video (even)")
    parser.add_argument(
        "--real",
        type=int,
        default=0,
        metavar="LAYERS",
        help="Qwen2.5-VL-3B's language-model shapes with this many of its 36 layers (bfloat16, "
        "280 x 280 frames: 100 tokens per frame pair) instead of the tiny model",
    )
    args = parser.parse_args()
    if args.videos < 1 or args.frames < 2 or args.frames % 2 or args.real < 0:
        parser.error("--videos must be >= 1, --frames an even number >= 2, --real >= 0")
    from conftest import small_config, trained_like

    from craft_core import CraftCompressor

    frame, dtype = (280, "bfloat16") if args.real else (tiny.FRAME, "float32")
    n_tokens = args.frames // 2 * (frame // 28) ** 2
    ratios = (4, 8) if args.real else (4, 8, 16)
    rows = [("uncompressed", {}, {}, None)]
    for ratio in (4, 8):
        rows.append((f"EVS {ratio}x", {}, {"video_pruning_rate": 1 - 1 / ratio}, None))
    with tempfile.TemporaryDirectory() as tmp:
        if args.real:
            import torch

            sizes = {**REAL_LM, "num_hidden_layers": args.real}
            model = tiny.build(Path(tmp) / "model", frame=frame, dtype=torch.bfloat16, **sizes)
            CraftCompressor(small_config(2048)).save_pretrained(Path(tmp) / "craft")
        else:
            model = tiny.build(Path(tmp) / "model")
            trained_like(1).save_pretrained(Path(tmp) / "craft")
        for ratio in ratios:
            over = engine.overrides(Path(tmp) / "craft", ratio)
            rows.append((f"CRAFT {ratio}x", over, {}, ratio))
        videos = [tiny.video(args.frames, seed=100 + i, size=frame) for i in range(args.videos)]
        ttft_videos = [tiny.video(args.frames, seed=200 + i, size=frame) for i in range(4)]
        results = []
        for name, overrides, kwargs, ratio in rows:

            def work(llm, ratio=ratio):
                rate, ttft, length = _measure(llm, videos, ttft_videos)
                ms = _compress_ms(llm, args.frames, frame // 28, ratio) if ratio else 0.0
                return rate, ttft, length, ms

            rate, ttft, length, ms = engine.run(
                model, overrides, work, dtype=dtype, enable_prefix_caching=False, **kwargs
            )
            results.append((name, length - engine.text_tokens(), rate, ttft, ms))
            print(f"{name}: done ({_conditions()})", flush=True)
    _table(results, args, n_tokens)


def _table(results: list, args: argparse.Namespace, n_tokens: int) -> None:
    base_rate, base_ttft = results[0][2], results[0][3]
    what = f"Qwen2.5-VL-3B LM shapes, {args.real} layers" if args.real else "tiny Qwen2.5-VL"
    print(
        f"\nvLLM {__import__('vllm').__version__} on the CPU, {what}, "
        f"{args.frames} frames = {n_tokens} video tokens, {args.videos} requests, "
        f"{os.cpu_count()} cores; {_conditions()}"
    )
    head = f"{'config':<14} {'video tokens':>12} {'req/s':>8} {'x':>6} {'TTFT ms':>9} {'x':>6}"
    print(f"{head} {'CRAFT ms':>9} {'share':>6}")
    for name, kept, rate, ttft, ms in results:
        print(
            f"{name:<14} {kept:>12} {rate:>8.2f} {rate / base_rate:>6.2f} "
            f"{ttft * 1000:>9.0f} {ttft / base_ttft:>6.2f} {ms:>9.0f} {ms / (ttft * 1000):>6.0%}"
        )


if __name__ == "__main__":
    main()
