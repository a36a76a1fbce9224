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
compressor's overheads, not the prefill savings of a real-size model.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=int, default=8, help="requests in the throughput batch")
    parser.add_argument("--frames", type=int, default=64, help="frames per video (even)")
    args = parser.parse_args()
    if args.videos < 1 or args.frames < 2 or args.frames % 2:
        parser.error("--videos must be >= 1 and --frames an even number >= 2")
    from conftest import trained_like

    n_tokens = args.frames // 2 * 16
    rows = [("uncompressed", {}, {})]
    for ratio in (4, 8):
        rows.append((f"EVS {ratio}x", {}, {"video_pruning_rate": 1 - 1 / ratio}))
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny.build(Path(tmp) / "model")
        trained_like(1).save_pretrained(Path(tmp) / "craft")
        for ratio in (4, 8, 16):
            rows.append((f"CRAFT {ratio}x", engine.overrides(Path(tmp) / "craft", ratio), {}))
        videos = [tiny.video(args.frames, seed=100 + i) for i in range(args.videos)]
        ttft_videos = [tiny.video(args.frames, seed=200 + i) for i in range(6)]
        results = []
        for name, overrides, kwargs in rows:
            rate, ttft, length = engine.run(
                model,
                overrides,
                lambda llm: _measure(llm, videos, ttft_videos),
                enable_prefix_caching=False,
                **kwargs,
            )
            results.append((name, length - engine.text_tokens(), rate, ttft))
            print(f"{name}: done", flush=True)
    base_rate, base_ttft = results[0][2], results[0][3]
    print(
        f"\nvLLM {__import__('vllm').__version__} on the CPU, tiny Qwen2.5-VL, "
        f"{args.frames} frames = {n_tokens} video tokens, {args.videos} requests, "
        f"{os.cpu_count()} cores"
    )
    print(f"{'config':<14} {'video tokens':>12} {'req/s':>8} {'x':>6} {'TTFT ms':>9} {'x':>6}")
    for name, kept, rate, ttft in results:
        print(
            f"{name:<14} {kept:>12} {rate:>8.2f} {rate / base_rate:>6.2f} "
            f"{ttft * 1000:>9.0f} {ttft / base_ttft:>6.2f}"
        )


if __name__ == "__main__":
    main()
