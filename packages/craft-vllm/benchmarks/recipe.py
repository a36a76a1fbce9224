"""The recipe, measured: compress a folder of videos once, serve, ask three questions each.

`python benchmarks/recipe.py` (in `.nox/vllm`): the tests' tiny Qwen2.5-VL and a CRAFT
checkpoint in a temporary folder, VIDEOS mp4s of FRAMES frames in `videos/`;
1. `craft-compress --ratio 4` writes `library/` (payloads + index.jsonl), timed;
2. `python -m craft_vllm serve --enable-mm-embeds` (CRAFT at ratio 4 for raw videos);
3. each video is asked QUESTIONS in turn, once as the raw mp4 (`video_url`: decoding, vision
   tower and CRAFT in the server) and once as its payload (`chat_part`: rows only), one new
   token each, one request at a time: the seconds to that first answer, per question, and
   the prompt tokens the server prefilled (`usage.prompt_tokens` less vLLM's own count of
   those served from its prefix cache, `prompt_tokens_details.cached_tokens`): the second
   and third questions of a video meet the prefix cache, raw and payload alike.
Prints the per-question medians over the videos, the compression's time and the load average.

`--real`: the same steps at Qwen2.5-VL-3B's shape, random weights in bfloat16: its language
model (hidden 2048, 36 layers, 16 heads, 2 KV heads, MLP 11,008, M-RoPE sections 16/24/24,
theta 1e6) and its vision tower (32 layers of width 1,280, windows of 112 px, full attention
in layers 7/15/23/31), the tiny vocabulary (2.7B parameters in all), a fresh paper-size CRAFT
module at D = 2048; REAL_VIDEOS videos of FRAMES frames of REAL_FRAME px (2,048 patches, 512
video tokens each, 128 kept). About 6 GB a process; minutes on 2 cores. `--real --layers L`:
the same widths with L of the 36 language-model layers and L * 32 // 36 of the tower's
(full attention in every fourth of them), for a machine that cannot hold or wait for the
whole (times scale about linearly with L; the tokens prefilled do not depend on it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))

import engine
import load_serve
import openai
import test_serve
import tiny
import torch
from conftest import trained_like
from craft_vllm.payload import chat_part

from craft_adapters import load_compressed_video
from craft_core import CraftCompressor, CraftConfig

VIDEOS, FRAMES = 3, 16
BUDGET = ["--ratio", str(load_serve.RATIO)]  # the server's ratio: raw and payload keep the same K
QUESTIONS = ["What happens?", "Who is in the video?", "What colour is the background?"]
REAL_VIDEOS, REAL_FRAME = 2, 224  # 224 px: 8 x 8 merged tokens per frame pair
REAL_TEXT = {  # Qwen2.5-VL-3B's language model (its config.json), random weights
    "hidden_size": 2048,
    "intermediate_size": 11008,
    "num_hidden_layers": 36,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
}
REAL_VISION = {  # Qwen2.5-VL-3B's vision tower (its config.json), random weights
    "depth": 32,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
}


def build_real(folder: Path, layers: int = REAL_TEXT["num_hidden_layers"]) -> None:
    """Qwen2.5-VL-3B's shape with random bfloat16 weights (`layers` of its 36 language-model
    layers, the tower's depth scaled alike), and a fresh CRAFT at D = 2048."""
    config = tiny.config(**{**REAL_TEXT, "num_hidden_layers": layers})
    depth = max(4, REAL_VISION["depth"] * layers // REAL_TEXT["num_hidden_layers"])
    full = [i for i in range(3, depth, 4)]  # Qwen2.5-VL-3B: every fourth layer, 7/15/23/31
    vision = {**REAL_VISION, "depth": depth, "fullatt_block_indexes": full}
    if depth == REAL_VISION["depth"]:
        vision["fullatt_block_indexes"] = REAL_VISION["fullatt_block_indexes"]
    for name, value in vision.items():
        setattr(config.vision_config, name, value)
    tiny.save_random(
        folder / "model",
        config,
        tiny.processor(REAL_FRAME),
        lambda m: [m.model.visual.merger.mlp[2].weight],
        dtype=torch.bfloat16,
    )
    CraftCompressor(CraftConfig(hidden_size=REAL_TEXT["hidden_size"])).save_pretrained(
        folder / "craft"
    )


def compress(folder: Path, dtype: str) -> tuple[float, list[dict]]:
    """craft-compress on `folder/videos` -> (wall seconds, the index rows)."""
    command = [
        str(Path(sys.executable).with_name("craft-compress")),
        "--videos", str(folder / "videos"), "--model", str(folder / "model"),
        "--craft", str(folder / "craft"), "--output", str(folder / "library"),
        *BUDGET, "--device", "cpu", "--dtype", dtype, "--no-progress",
    ]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, check=True)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (folder / "library" / "index.jsonl").open()]
    return wall, sorted(rows, key=lambda r: r["source"])


def first_answer(
    client: openai.OpenAI, model: str, part: dict, question: str
) -> tuple[float, int, int]:
    """(seconds until the reply of one new token arrives, prompt tokens, of them prefilled:
    not served from vLLM's prefix cache)."""
    start = time.perf_counter()
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": [part, {"type": "text", "text": question}]}],
        max_tokens=1,
        temperature=0.0,
    )
    seconds = time.perf_counter() - start
    prompt = reply.usage.prompt_tokens
    return seconds, prompt, prompt - (reply.usage.prompt_tokens_details.cached_tokens or 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--real", action="store_true", help="a real-size language model (bf16)")
    parser.add_argument(
        "--layers",
        type=int,
        default=REAL_TEXT["num_hidden_layers"],
        help="--real: language-model layers (of 36; the tower's depth scaled alike)",
    )
    args = parser.parse_args(argv)
    real = args.real
    if not 1 <= args.layers <= REAL_TEXT["num_hidden_layers"]:
        parser.error(f"--layers must be 1-{REAL_TEXT['num_hidden_layers']}, got {args.layers}")
    videos, dtype = (REAL_VIDEOS, "bfloat16") if real else (VIDEOS, "float32")
    folder = Path(tempfile.mkdtemp(prefix="craft-recipe-"))
    if real:
        build_real(folder, args.layers)
    else:
        tiny.build(folder / "model")
        trained_like(1).save_pretrained(folder / "craft")
    (folder / "videos").mkdir()
    size = REAL_FRAME if real else tiny.FRAME
    for i in range(videos + 1):  # the last one warms the server up
        clip = tiny.video(FRAMES, seed=20 + i, size=size)
        test_serve._write_mp4(folder / "videos" / f"v{i}.mp4", clip)
    compress_s, rows = compress(folder, dtype)
    extra = ["--enable-mm-embeds", "--dtype", dtype, "--enable-prompt-tokens-details"]
    if real:  # vLLM's encoder profiling runs a longest video through the real-size tower:
        extra.append("--skip-mm-profiling")  # minutes on one core, nothing measured
        load_serve.START_TIMEOUT_S = 1200  # loading 5 GiB of weights and one profile run
    server, base = load_serve.start(folder, *extra)
    try:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        model = str(folder / "model")
        parts = []
        for row in rows:
            raw = {"type": "video_url", "video_url": {"url": f"file://{row['source']}"}}
            video = load_compressed_video(folder / "library" / row["output"])
            parts.append((raw, chat_part(video)))
        *parts, warm = parts
        for part in warm:
            first_answer(client, model, part, engine.QUESTION)
        blank = (0.0, 0, 0)
        times = {kind: [[blank] * videos for _ in QUESTIONS] for kind in ("raw", "payload")}
        for v, (raw, payload) in enumerate(parts):
            for q, question in enumerate(QUESTIONS):
                times["raw"][q][v] = first_answer(client, model, raw, question)
                times["payload"][q][v] = first_answer(client, model, payload, question)
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            load_serve.kill(server)
    kept = [f"{r['tokens']}/{r['tokens_before']}" for r in rows[:videos]]
    shape = f"Qwen2.5-VL-3B shape (bf16, {args.layers}/36 LM layers)" if real else "tiny (float32)"
    print(f"{shape}; craft-compress {' '.join(BUDGET)}: {videos + 1} videos in {compress_s:.1f} s")
    print(f"per video {[round(r['seconds'], 2) for r in rows]} s; kept {kept} tokens")
    print(
        "| question | raw mp4 (ratio 4) s | payload s | prefilled / prompt tokens: raw, payload |"
    )
    print("| --- | ---: | ---: | --- |")
    for q, question in enumerate(QUESTIONS):
        raw_s, payload_s = (statistics.median(t[0] for t in times[k][q]) for k in times)
        tokens = [", ".join(f"{t[2]}/{t[1]}" for t in times[k][q]) for k in times]
        print(f"| {q + 1}. {question} | {raw_s:.3f} | {payload_s:.3f} | {tokens[0]}; {tokens[1]} |")
    print("load average:", Path("/proc/loadavg").read_text().split()[:3])
    return 0


if __name__ == "__main__":
    sys.exit(main())
