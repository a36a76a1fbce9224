"""Bounded load test of `python -m craft_vllm serve` (issue 32): fixed count, fixed time.

    VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 python packages/craft-vllm/benchmarks/load_serve.py
    (or `nox -s load`, not in the default sessions)

Starts the server on 127.0.0.1 with the tests' tiny Qwen2.5-VL and a CRAFT checkpoint at ratio
4, answers each good video alone first (the reference), warms up, then sends REQUESTS requests
from CLIENTS concurrent clients, good videos mixed with every bad kind of
`test_serve.bad_videos` (corrupt bytes, an empty file, an mp4 with no frame, a missing file,
one frame, more frames than `max_frames`, an ftp:// URL). Checks, and exits 1 naming each
failure:
- every bad request gets a 400 carrying its own message;
- every good request's greedy tokens equal the tokens of its run alone;
- the server never restarts (same pid, /health answers) and its process tree's resident
  memory after the run is within 10% of the memory after the warm-up.
Prints p50 / p95 latency of good and bad requests. Every request has a timeout and the whole
run a deadline (DEADLINE_S): it stops by itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import engine
import numpy as np
import test_serve
import tiny
from conftest import trained_like

CLIENTS, REQUESTS, RATIO, NEW_TOKENS = 32, 96, 4, 8
GOOD_FRAMES = [8, 12, 16]
DEADLINE_S, REQUEST_TIMEOUT_S, START_TIMEOUT_S = 900, 300, 400


def start(folder: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """The tiny model in `folder` served on 127.0.0.1 (CRAFT at RATIO; `extra`: more of
    vLLM's arguments) -> (the server's process, its base URL), once /health answers."""
    port = test_serve._free_port()
    command = [
        sys.executable, "-m", "craft_vllm", "serve", str(folder / "model"),
        "--host", "127.0.0.1", "--port", str(port),
        "--hf-overrides", json.dumps(engine.overrides(folder / "craft", RATIO)),
        "--dtype", "float32", "--enforce-eager", "--max-model-len", "2048",
        "--allowed-local-media-path", str(folder),
        "--media-io-kwargs", json.dumps({"video": {"max_frames": test_serve.MAX_FRAMES}}),
        "--limit-mm-per-prompt", '{"video": 1, "image": 0}', *extra,
    ]  # fmt: skip
    log = open(folder / "serve.log", "w")  # noqa: SIM115 - lives as long as the server
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    # A session of its own: killing it kills vLLM's engine and worker processes too (a plain
    # kill of the API server leaves them holding the model's memory).
    server = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + START_TIMEOUT_S
    while not healthy(base):
        if server.poll() is not None or time.monotonic() > deadline:
            kill(server)
            sys.exit(f"the server did not start: {(folder / 'serve.log').read_text()[-2000:]}")
        time.sleep(1)
    return server, base


def healthy(base: str) -> bool:
    try:
        return urllib.request.urlopen(f"{base}/health", timeout=5).status == 200
    except OSError:
        return False


def tree_rss_mb(pid: int) -> float:
    """Resident memory of `pid` and all its descendants (MB), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        total += next((int(x.split()[1]) for x in status.splitlines() if x.startswith("VmRSS")), 0)
    return total / 1024


def ask(base: str, model: str, url: str) -> tuple[int, object, float]:
    """One chat request: (HTTP status, greedy token strings or the error message, seconds)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": url}},
            {"type": "text", "text": engine.QUESTION},
        ]}],
        "max_tokens": NEW_TOKENS, "temperature": 0.0, "logprobs": True,
    }  # fmt: skip
    request = urllib.request.Request(
        f"{base}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    began = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as reply:
            content = json.loads(reply.read())["choices"][0]["logprobs"]["content"]
            return reply.status, [t["token"] for t in content], time.perf_counter() - began
    except urllib.error.HTTPError as error:
        message = json.loads(error.read())["error"]["message"]
        return error.code, message, time.perf_counter() - began


def check(results: list, plan: list, alone: dict, bad: dict) -> list[str]:
    """The failures of the run, one line each (empty: all good)."""
    failures = []
    for (kind, url), (status, answer, _) in zip(plan, results):
        if kind in bad and (status != 400 or bad[kind][1] not in str(answer)):
            failures.append(f"{kind}: {status} {answer!r} (wanted 400 with {bad[kind][1]!r})")
        if kind not in bad and (status != 200 or answer != alone[url]):
            failures.append(f"{kind}: {status} {answer!r} != alone {alone[url]!r}")
    return failures


def main() -> int:
    began = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="craft_load_"))
    tiny.build(folder / "model")
    trained_like(1).save_pretrained(folder / "craft")
    good = {
        f"good{n}": f"file://{test_serve._write_mp4(folder / f'g{n}.mp4', tiny.video(n, seed=n))}"
        for n in GOOD_FRAMES
    }
    bad = test_serve.bad_videos(folder)
    server, base = start(folder)
    watchdog = threading.Timer(DEADLINE_S, stop, (server,))  # the run stops by itself
    watchdog.daemon = True
    watchdog.start()
    model = str(folder / "model")
    try:
        alone = {url: ask(base, model, url)[1] for url in good.values()}  # one at a time
        kinds = [*good.items(), *((k, u) for k, (u, _) in bad.items())]
        with ThreadPoolExecutor(CLIENTS) as pool:  # warm-up: every kind, concurrently
            list(pool.map(lambda ku: ask(base, model, ku[1]), kinds * 2))
        rss_before = tree_rss_mb(server.pid)
        plan = [kinds[i % len(kinds)] for i in np.random.default_rng(0).permutation(REQUESTS)]
        with ThreadPoolExecutor(CLIENTS) as pool:
            results = list(pool.map(lambda ku: ask(base, model, ku[1]), plan))
        rss_after = tree_rss_mb(server.pid)
        failures = check(results, plan, alone, bad)
        if server.poll() is not None or not healthy(base):
            failures.append("the server is gone or unhealthy after the run")
        if abs(rss_after - rss_before) > 0.1 * rss_before:
            failures.append(f"RSS {rss_before:.0f} MB -> {rss_after:.0f} MB (over 10%)")
        report(results, plan, bad, rss_before, rss_after, time.monotonic() - began)
    finally:
        watchdog.cancel()
        server.terminate()
        server.wait(timeout=60)
    for line in failures:
        print("FAIL", line)
    return 1 if failures or time.monotonic() - began > DEADLINE_S else 0


def stop(server: subprocess.Popen) -> None:
    print(f"FAIL the run passed its deadline of {DEADLINE_S} s: stopped", flush=True)
    kill(server)
    os._exit(1)


def kill(server: subprocess.Popen) -> None:
    """Kill the server and every process of its session (engine core, workers)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait()


def report(results: list, plan: list, bad: dict, before: float, after: float, wall: float) -> None:
    for name, keep in [("good", lambda k: k not in bad), ("bad", lambda k: k in bad)]:
        seconds = [r[2] for (k, _), r in zip(plan, results) if keep(k)]
        p50, p95 = np.percentile(seconds, [50, 95])
        print(f"{name}: {len(seconds)} requests, p50 {p50:.2f} s, p95 {p95:.2f} s")
    print(
        f"{CLIENTS} clients, {len(plan)} requests; server tree RSS {before:.0f} -> {after:.0f} MB"
    )
    print(f"wall {wall:.0f} s; /proc/loadavg: {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    sys.exit(main())
