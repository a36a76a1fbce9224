"""The recipe, measured: compress a folder of videos once, serve, ask three questions each.

`python benchmarks/recipe.py` (in `.nox/vllm`): the tests' tiny Qwen2.5-VL and a CRAFT
checkpoint in a temporary folder, VIDEOS mp4s of FRAMES frames in `videos/`;
1. `craft-compress --ratio 4` writes `library/` (payloads + index.jsonl), timed;
2. `python -m craft_vllm serve --enable-mm-embeds` (CRAFT at ratio 4 for raw videos);
3. each video is asked QUESTIONS in turn, once as the raw mp4 (`video_url`: decoding, vision
   tower and CRAFT in the server) and once as its payload (`chat_part`: rows only), one new
   token each, one request at a time: the seconds to that first answer, per question (the
   second and third questions of a video meet vLLM's prefix cache either way).
Prints the per-question medians over the videos, the compression's time and the load average.
"""

from __future__ import annotations

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
from conftest import trained_like
from craft_vllm.payload import chat_part

from craft_adapters import load_compressed_video

VIDEOS, FRAMES = 3, 16
BUDGET = ["--ratio", str(load_serve.RATIO)]  # the server's ratio: raw and payload keep the same K
QUESTIONS = ["What happens?", "Who is in the video?", "What colour is the background?"]


def compress(folder: Path) -> tuple[float, list[dict]]:
    """craft-compress on `folder/videos` -> (wall seconds, the index rows)."""
    command = [
        str(Path(sys.executable).with_name("craft-compress")),
        "--videos", str(folder / "videos"), "--model", str(folder / "model"),
        "--craft", str(folder / "craft"), "--output", str(folder / "library"),
        *BUDGET, "--device", "cpu", "--dtype", "float32", "--no-progress",
    ]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, check=True)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (folder / "library" / "index.jsonl").open()]
    return wall, sorted(rows, key=lambda r: r["source"])


def first_answer(client: openai.OpenAI, model: str, part: dict, question: str) -> float:
    """Seconds until the reply of one new token arrives."""
    start = time.perf_counter()
    client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": [part, {"type": "text", "text": question}]}],
        max_tokens=1,
        temperature=0.0,
    )
    return time.perf_counter() - start


def main() -> int:
    folder = Path(tempfile.mkdtemp(prefix="craft-recipe-"))
    tiny.build(folder / "model")
    trained_like(1).save_pretrained(folder / "craft")
    (folder / "videos").mkdir()
    for i in range(VIDEOS + 1):  # the last one warms the server up
        test_serve._write_mp4(folder / "videos" / f"v{i}.mp4", tiny.video(FRAMES, seed=20 + i))
    compress_s, rows = compress(folder)
    server, base = load_serve.start(folder, "--enable-mm-embeds")
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
        times = {kind: [[0.0] * VIDEOS for _ in QUESTIONS] for kind in ("raw", "payload")}
        for v, (raw, payload) in enumerate(parts):
            for q, question in enumerate(QUESTIONS):
                times["raw"][q][v] = first_answer(client, model, raw, question)
                times["payload"][q][v] = first_answer(client, model, payload, question)
    finally:
        server.terminate()
        server.wait(timeout=60)
    kept = [f"{r['tokens']}/{r['tokens_before']}" for r in rows[:VIDEOS]]
    print(f"craft-compress {' '.join(BUDGET)}: {VIDEOS + 1} videos in {compress_s:.1f} s (wall)")
    print(f"per video {[round(r['seconds'], 2) for r in rows]} s; kept {kept} tokens")
    print("| question | raw mp4 (ratio 4) s | payload s |")
    print("| --- | ---: | ---: |")
    for q, question in enumerate(QUESTIONS):
        raw_s, payload_s = (statistics.median(times[k][q]) for k in ("raw", "payload"))
        print(f"| {q + 1}. {question} | {raw_s:.3f} | {payload_s:.3f} |")
    print("load average:", Path("/proc/loadavg").read_text().split()[:3])
    return 0


if __name__ == "__main__":
    sys.exit(main())
