"""Benchmark: the padded loop (`compile=True`, `cuda_graphs=True`) against eager CRAFT and
DivPrune.

    uv run python packages/craft-core/benchmarks/bench_compiled.py [--quick] [--threads 1]
        [--sizes 2048,8192,16384] [--dims 1024,2560] [--repeats 3] [--device cuda]
        [--runners compiled,graphed]

Per (N, D) and runner, ratio 8, video-like tokens (`bench_compressor.video_like`): the first
call (Inductor compiles, or CUDA graphs are captured, in this process), then warm times of
the runner, eager CRAFT,
DivPrune and the irreducible work (`bench_compressor.irreducible`), measured interleaved in
one run, the minimum of `--repeats` (shared cores: the quietest sample). Goals on a CPU:
compiled CRAFT <= 1.5x DivPrune at N = 2,048, compiled whole / irreducible <= 1.5 at
N = 8,192, D = 1,024. The float64 gate MLP alone on a video's merged edges is timed beside
DivPrune (`gate_floor`: the cost of the same-rows promise). Then, for one size, the compile
seconds of a fresh process with an empty Inductor cache (cold) and with the cache that run
left (disk), and the fused kernels + extern calls of each compiled round graph (on CUDA each
is a launch). With `--device cuda`, the CUDA graph captures (count, host ms) and the host
launch calls of one video (the profiler's count of kernel, graph, copy and memset launches)
of eager, the runner and DivPrune. N = 144 is printed,
labelled: no longer a goal (a few ms beside a model's prefill). On a CPU the compressor
refuses both (no CUDA graphs; compiled, slower than eager: this benchmark is the evidence)
unless built with the run option `allow_cpu=True`, which it sets to time the padded rounds
there.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import torch
from bench_compressor import irreducible, timed_pair, video_like
from torch._inductor.utils import run_and_get_code

from craft_core import CraftCompressor, CraftConfig

RUNNERS = {
    "compiled": {"compile": True, "allow_cpu": True},
    "graphed": {"cuda_graphs": True, "allow_cpu": True},
}
"""The padded loop's two launchers: Inductor-fused (`compile=True`) or its own kernels
captured as CUDA graphs (`cuda_graphs=True`; on a CPU, allowed by `allow_cpu=True`, the
padded rounds run as they are)."""


def variant(eager: CraftCompressor, runner: str) -> CraftCompressor:
    """A compressor with `eager`'s weights that runs the padded loop with `runner`."""
    module = CraftCompressor(eager.config, **RUNNERS[runner]).to(eager.projection.device)
    module.load_state_dict(eager.state_dict())
    return module.eval()


def frames_for(n: int) -> tuple[int, int]:
    """(frames, grid) of a video of n tokens: 16 x 16 per frame, or 4 frames of 6 x 6."""
    return (n // 256, 16) if n % 256 == 0 else (n // 36, 6)


def time_size(n: int, dim: int, repeats: int, device: torch.device, runners: list[str]) -> None:
    frames, grid = frames_for(n)
    features, coords = video_like(frames, grid, grid, dim)
    features, coords = features.to(device), coords.to(device)
    eager = CraftCompressor(CraftConfig(hidden_size=dim)).to(device).eval()
    for name in runners:
        with torch.no_grad():
            _runner_row(name, variant(eager, name), eager, (features, coords), repeats)


def _runner_row(
    name: str,
    module: CraftCompressor,
    eager: CraftCompressor,
    video: tuple[torch.Tensor, torch.Tensor],
    repeats: int,
) -> None:
    """One runner's first call and warm times against eager, DivPrune and the floor."""
    from craft_eval.baselines.divprune import divprune

    (features, coords), device = video, video[0].device
    n, dim = features.shape

    def run_padded() -> None:
        module(features, coords, ratio=8.0)

    _sync(device)
    start = time.perf_counter()
    out, codes = run_and_get_code(lambda: module(features, coords, ratio=8.0))
    _sync(device)
    first = time.perf_counter() - start
    want = eager(features, coords, ratio=8.0)
    tokens = torch.equal(out.kept_index, want.kept_index) and torch.equal(
        out.assignment, want.assignment
    )
    same = tokens and torch.equal(out.features, want.features)
    others = (
        lambda: eager(features, coords, ratio=8.0),
        lambda: divprune(features, coords, ratio=8.0),
        lambda: irreducible(eager, features, out.num_kept),
    )
    timed = [timed_pair(run_padded, other, repeats, device) for other in others]
    best = [1e3 * min(t) for t in (timed[0][0], *(b for _, b in timed))]
    label = "  (small N: not a goal)" if n < 1024 else ""
    print(
        f"{n:>7}{dim:>6}{name:>10}{out.rounds:>7}{first:>9.2f}{best[0]:>10.1f}{best[1]:>10.1f}"
        f"{best[2]:>11.1f}{best[3]:>10.1f}{best[0] / best[2]:>10.2f}{best[0] / best[3]:>9.2f}"
        f"{best[1] / best[0]:>9.2f}{same!s:>6}{label}"
    )
    if name == "compiled":
        print(f"{'':>13}round graphs compiled: {kernel_counts(codes)}; tokens equal: {tokens}")
    if device.type == "cuda":
        runner = next(iter(module._runners.values()))
        captures = getattr(runner, "capture_seconds", [])
        calls = [launch_calls(fn) for fn in (others[0], run_padded, others[1])]
        print(
            f"{'':>13}{len(captures)} CUDA graph captures, {1e3 * sum(captures):.1f} ms in "
            f"all; host launch calls a video, eager / {name} / DivPrune: {calls}"
        )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


LAUNCHES = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaGraphLaunch",
    "cudaMemcpyAsync",
    "cudaMemsetAsync",
)
"""The CUDA runtime and driver calls that each start work on the GPU (a graph launch is one)."""


def launch_calls(fn) -> int:  # type: ignore[no-untyped-def]
    """Host calls of `LAUNCHES` that one `fn()` makes, counted by the profiler (CUDA)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.key in LAUNCHES)


def kernel_counts(codes: list[str]) -> str:
    """`fused kernels + extern calls` of each generated round graph (each a launch on CUDA)."""
    counts = []
    for code in codes:
        call = code[code.index("def call(") :]
        kernels = len(re.findall(r"^\s+cpp_fused_\w+\(", call, re.M))
        kernels += len(re.findall(r"\.run\(", call))  # Triton kernels on CUDA
        extern = len(re.findall(r"extern_kernels\.\w+\(|torch\.ops\.aten\.\w+", call))
        counts.append(f"{kernels}+{extern}")
    return ", ".join(counts) or "none (all buckets already compiled)"


def gate_floor(n: int, dim: int, repeats: int, device: torch.device) -> None:
    """The float64 gate MLP alone on the `N - N/8` edges a video merges at ratio 8, against
    DivPrune and against the same MLP in float32: what the same-rows promise (the merge in
    float64, rounded once) costs every compression, compiled or eager, before any pairing."""
    import torch.nn.functional as F

    from craft_core.merge import round_embedding
    from craft_eval.baselines.divprune import divprune

    frames, grid = frames_for(n)
    features, coords = video_like(frames, grid, grid, dim)
    features, coords = features.to(device), coords.to(device)
    merge = CraftCompressor(CraftConfig(hidden_size=dim)).to(device).merge
    kept = n // 8
    group = torch.arange(n - kept, device=device) % kept
    phi = round_embedding(1, merge.config.round_embed_dim, device)
    targets, sources = features[:kept], features[kept:]

    def float32_gate() -> None:
        weight = merge.w_down.weight
        hidden = F.linear(targets, weight[:, :dim])[group]
        hidden = hidden + F.linear(sources, weight[:, dim:], merge.w_down.bias)
        hidden = F.layer_norm(F.gelu(hidden), (hidden.shape[-1],))
        torch.sigmoid(merge.w_up(hidden))

    with torch.no_grad():
        gate, prune = timed_pair(
            lambda: merge.gate(targets, sources, group, phi),
            lambda: divprune(features, coords, ratio=8.0),
            repeats,
            device,
        )
        _, single = timed_pair(lambda: None, float32_gate, repeats, device)
    best = [1e3 * min(t) for t in (gate, prune, single)]
    print(
        f"float64 gate MLP alone on the {n - kept:,} edges of N = {n:,}, D = {dim:,}: "
        f"{best[0]:.1f} ms = {best[0] / best[1]:.2f}x DivPrune ({best[1]:.1f} ms); "
        f"in float32 {best[2]:.1f} ms"
    )


CHILD = """
import sys, time, torch
sys.path.insert(0, {here!r})
from bench_compressor import video_like
from craft_core import CraftCompressor, CraftConfig
features, coords = video_like({frames}, {grid}, {grid}, {dim})
compressor = CraftCompressor(CraftConfig(hidden_size={dim}), compile=True, allow_cpu=True)
with torch.no_grad():
    start = time.perf_counter()
    compressor(features, coords, ratio=8.0)
print(time.perf_counter() - start)
"""


def disk_cache_seconds(n: int, dim: int) -> None:
    """First-call seconds of a fresh process reading the Inductor cache this run filled (the
    `first s` column is the cold figure: this run started with an empty cache)."""
    frames, grid = frames_for(n)
    script = CHILD.format(here=os.path.dirname(__file__), frames=frames, grid=grid, dim=dim)
    done = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True
    )
    print(
        f"first call, N = {n:,}, D = {dim:,}, new process, graphs from the disk cache: "
        f"{float(done.stdout.split()[-1]):.1f} s (compile + one run; cold: `first s` above)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 2,048, D = 256, one repeat")
    parser.add_argument("--sizes", default="144,2048,8192,16384")
    parser.add_argument("--dims", default="1024,2560")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--runners",
        default="compiled,graphed",
        help="padded-loop runners to time: compiled (Inductor, ~100 s cold compile a size "
        "on a GPU), graphed (CUDA graphs of the round's own kernels)",
    )
    args = parser.parse_args()
    runners = args.runners.split(",")
    if not runners or any(r not in RUNNERS for r in runners):
        parser.error(f"--runners takes a comma-separated subset of {sorted(RUNNERS)}")
    # A cache of our own, empty: `first s` is the cold compile; the child process then
    # inherits it (`disk_cache_seconds`).
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="craft-bench-inductor-")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sizes = [2048] if args.quick else [int(s) for s in args.sizes.split(",")]
    dims = [256] if args.quick else [int(d) for d in args.dims.split(",")]
    repeats = 1 if args.quick else args.repeats
    print(
        f"device {device}, {torch.get_num_threads()} threads, ratio 8, ms = min of "
        f"{repeats} interleaved repeats, warm; first s = first call (compiles or captures)"
    )
    print(
        f"{'N':>7}{'D':>6}{'runner':>10}{'rounds':>7}{'first s':>9}{'ms':>10}{'eager':>10}"
        f"{'DivPrune':>11}{'irred.':>10}{'r/DivPr':>10}{'r/irred':>9}{'speedup':>9}{'same':>6}"
    )
    for dim in dims:
        for n in sizes:
            time_size(n, dim, repeats, device, runners)
    print("goals: r/DivPr <= 1.5 at N = 2,048; r/irred <= 1.5 at N = 8,192, D = 1,024")
    gate_floor(2048 if 2048 in sizes else sizes[0], dims[0], repeats, device)
    if device.type == "cpu" and "compiled" in runners:  # the child runs on the CPU
        disk_cache_seconds(sizes[0], dims[0])


if __name__ == "__main__":
    main()
