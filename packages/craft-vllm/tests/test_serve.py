"""`vllm serve` as users run it: one command, the `openai` client, several videos in flight.

Checks, on 127.0.0.1 with the tiny model and a CRAFT checkpoint at ratio 4 (conftest's
`server`, shared with test_openai_payloads.py):
- three chat requests with videos of 8, 12 and 16 frames in flight together each get
  `floor(N / 4)` video tokens (`usage.prompt_tokens` = text + floor(N / ratio));
- a second question on the same video hits vLLM's prefix cache (the compression does not
  depend on the question): `prompt_tokens_details.cached_tokens` covers the video and
  `vllm:prefix_cache_hits` grows; a different video of the same length (the control) gets no
  hit past the text before the video;
- each bad video gets its own 400 naming what is wrong, and the server still serves.
"""

from __future__ import annotations

import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import engine
import numpy as np
import pytest
import tiny
from conftest import BLOCK, MAX_FRAMES, RATIO, free_port

from craft_adapters.video import write_video

openai = pytest.importorskip("openai")
_free_port = free_port  # benchmarks/load_serve.py's name


def _write_mp4(path: Path, frames: np.ndarray, fps: int = 2) -> Path:
    return write_video(path, frames, fps, options={"qscale": "1"})


def _metric(base: str, name: str) -> float:
    text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    values = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
    return sum(float(v) for v in values)


def _ask(base: str, model: str, video: Path, question: str):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none")
    return client.chat.completions.create(
        model=model,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "video_url", "video_url": {"url": f"file://{video}"}},
                    {"type": "text", "text": question},
                ],
            }
        ],
        max_tokens=4,
        temperature=0.0,
    )


def test_served_counts_and_prefix_cache(server, workdir) -> None:
    model = str(workdir / "model")
    lengths = [8, 12, 16]
    videos = [_write_mp4(workdir / f"v{n}.mp4", tiny.video(n, seed=10 + n)) for n in lengths]
    with ThreadPoolExecutor(len(videos)) as pool:  # all in flight together
        replies = list(pool.map(lambda v: _ask(server, model, v, engine.QUESTION), videos))
    text = engine.text_tokens()
    tokens = [n // 2 * 16 for n in lengths]  # frame pairs x 4 x 4 merged tokens
    assert [r.usage.prompt_tokens for r in replies] == [text + n // RATIO for n in tokens]

    hits = _metric(server, "vllm:prefix_cache_hits_total")
    second = _ask(server, model, videos[2], "And then?")
    cached = second.usage.prompt_tokens_details.cached_tokens
    before_video, after_video = engine.video_span(tokens[2] // RATIO)
    assert cached >= after_video // BLOCK * BLOCK > before_video  # blocks holding video rows
    assert _metric(server, "vllm:prefix_cache_hits_total") - hits >= cached
    # Control: another video of the same length shares only the text before the video.
    other = _write_mp4(workdir / "other16.mp4", tiny.video(16, seed=99))
    miss = _ask(server, model, other, "And then?")
    assert (miss.usage.prompt_tokens_details.cached_tokens or 0) < BLOCK


def _write_frameless_mp4(path: Path) -> Path:
    """An mp4 with a video stream and its header but no frame (`_write_mp4` of 0 frames
    writes no file at all: PyAV writes the header with the first packet)."""
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=2)
        stream.width, stream.height, stream.pix_fmt = tiny.FRAME, tiny.FRAME, "yuv420p"
        out.start_encoding()
        out.mux(stream.encode(None))
    return path


def bad_videos(folder: Path) -> dict[str, tuple[str, str]]:
    """Each bad kind: (its URL, a piece of the 400's message). Shared with the load test."""
    (folder / "corrupt.mp4").write_bytes(np.random.default_rng(0).bytes(4000))
    (folder / "empty.mp4").write_bytes(b"")
    _write_mp4(folder / "one.mp4", tiny.video(1, seed=5))
    _write_mp4(folder / "long.mp4", tiny.video(MAX_FRAMES + 8, seed=6))
    return {
        "corrupt": (f"file://{folder / 'corrupt.mp4'}", "Could not open video stream"),
        "empty": (f"file://{folder / 'empty.mp4'}", "Could not open video stream"),
        "no-frame": (f"file://{_write_frameless_mp4(folder / 'none.mp4')}", "Could not open"),
        "missing": (f"file://{folder / 'missing.mp4'}", "no video file named 'missing.mp4'"),
        "one-frame": (f"file://{folder / 'one.mp4'}", "has 1 frame(s): at least 2"),
        "too-long": (f"file://{folder / 'long.mp4'}", f"over this server's limit of {MAX_FRAMES}"),
        "ftp": ("ftp://127.0.0.1/v.mp4", "must be either a HTTP, data or file URL"),
    }


def test_bad_videos_get_their_own_400(server, workdir) -> None:
    model = str(workdir / "model")
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)
    for kind, (url, expected) in bad_videos(workdir).items():
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": [
                    {"type": "video_url", "video_url": {"url": url}},
                    {"type": "text", "text": engine.QUESTION},
                ]}],
                max_tokens=2,
            )  # fmt: skip
        assert expected in str(caught.value), (kind, str(caught.value))
    good = _write_mp4(workdir / "after.mp4", tiny.video(8, seed=7))
    assert _ask(server, model, good, engine.QUESTION).usage.prompt_tokens > 0
