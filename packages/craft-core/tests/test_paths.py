"""The same ROWS, bit for bit, on every CPU instruction path (not only the same tokens).

Hidden-style cases of the kind real video has: static frames that are exact copies of the
previous one, exact duplicate tokens inside a frame, D = 48, ratio 4 and 8 and threshold 0.8,
the merge module at its initialisation (G = 0.5, position weights) and with a live gate, each
video alone and the five in one `compress_many` batch. The same script runs in three subprocesses (this machine's default
path, `ATEN_CPU_CAPABILITY=default`, `MKL_CBWR=AVX2`) and prints a digest of each case's
`(kept_index, assignment, rounds)` and of its output rows' bytes; the three lists must be
equal. On 0.4 (float32 merge arithmetic) the rows differed on this AVX-512 CPU in every case.

    uv run pytest packages/craft-core/tests/test_paths.py -q -p no:cacheprovider
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

SCRIPT = textwrap.dedent(
    """
    import hashlib, json, sys, torch
    sys.path.insert(0, {tests!r})
    from core_testkit import grid_coords, live_weights, noise
    from craft_core import CraftCompressor, CraftConfig

    def video(seed, frames=8, grid=6, dim=48):
        gen = torch.Generator().manual_seed(seed)
        rows = [noise(grid * grid, dim, generator=gen)]
        for t in range(1, frames):
            if t % 3 == 1:
                rows.append(rows[-1].clone())  # a static frame: a copy of the previous one
            else:
                rows.append(rows[-1] + 0.3 * noise(grid * grid, dim, generator=gen))
            rows[-1][[3, 7, 11]] = rows[-1][0].clone()  # exact duplicates inside a frame
        return torch.cat(rows), grid_coords(frames, grid, grid)

    def digest(data):
        return hashlib.sha256(data).hexdigest()[:16]

    def selection(result):
        return [result.kept_index.tolist(), result.assignment.tolist(), result.rounds]

    out = {{}}
    for seed in range(5):
        x, coords = video(seed)
        config = CraftConfig(hidden_size=48)
        for live in (False, True):
            torch.manual_seed(seed)
            compressor = CraftCompressor(config, sim_block=64)
            if live:
                live_weights(compressor, seed)
            for budget in ({{"ratio": 4.0}}, {{"ratio": 8.0}}, {{"threshold": 0.8}}):
                with torch.no_grad():
                    result = compressor(x, coords, **budget)
                key = f"{{seed}}/{{'live' if live else 'init'}}/{{budget}}"
                out[key] = [digest(json.dumps(selection(result)).encode()),
                            digest(result.features.contiguous().numpy().tobytes())]
    # The five videos in one batch (other shapes of the same products), one compressor.
    videos = [video(seed) for seed in range(5)]
    for live in (False, True):
        torch.manual_seed(0)
        compressor = CraftCompressor(CraftConfig(hidden_size=48), sim_block=64)
        if live:
            live_weights(compressor, 0)
        for budget in ({{"ratio": 4.0}}, {{"threshold": 0.8}}):
            with torch.no_grad():
                results = compressor.compress_many(*zip(*videos), **budget)
            for seed, result in enumerate(results):
                key = f"batch/{{seed}}/{{'live' if live else 'init'}}/{{budget}}"
                out[key] = [digest(json.dumps(selection(result)).encode()),
                            digest(result.features.contiguous().numpy().tobytes())]
    print(json.dumps(out))
    """
)

PATHS = {"default": {}, "aten-default": {"ATEN_CPU_CAPABILITY": "default"}}
PATHS["mkl-avx2"] = {"MKL_CBWR": "AVX2"}


def run_on(path: dict) -> dict[str, list[str]]:
    """The script's digests in a subprocess on one instruction path."""
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(tests=os.path.dirname(__file__))],
        capture_output=True,
        text=True,
        env={**env, **path},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.slow
def test_rows_and_tokens_are_the_same_bits_on_every_cpu_path() -> None:
    results = {name: run_on(path) for name, path in PATHS.items()}
    baseline = results["default"]
    assert len(baseline) == 50  # 30 videos alone, 20 in batches
    for name in ("aten-default", "mkl-avx2"):
        assert set(results[name]) == set(baseline), name
        tokens = [k for k in baseline if results[name][k][0] != baseline[k][0]]
        rows = [k for k in baseline if results[name][k][1] != baseline[k][1]]
        assert not tokens and not rows, (
            f"{name}: tokens differ in {len(tokens)}, rows in {len(rows)} of 50 cases: "
            f"{(tokens or rows)[:5]}"
        )


def _merge_inputs(dim: int, seed: int = 0):
    """A live gate, 600 lone targets and 100 targets of 2 sources (`E = 800`, D = dim)."""
    from core_testkit import live_weights, noise

    from craft_core import CraftCompressor, CraftConfig
    from craft_core.merge import group_edges

    gen = torch.Generator().manual_seed(seed)
    compressor = live_weights(CraftCompressor(CraftConfig(hidden_size=dim)), seed)
    layout = group_edges(torch.cat([torch.arange(600), torch.arange(600, 700).repeat(2)]))
    edges, targets = layout.group.numel(), layout.targets.numel()
    args = (
        noise(targets, dim, generator=gen),
        noise(edges, dim, generator=gen),
        torch.randint(0, 16, (targets, 3), generator=gen),
        torch.randint(0, 16, (edges, 3), generator=gen),
        torch.rand(edges, generator=gen),
    )
    return compressor.merge, layout, args


@pytest.mark.slow
def test_the_merge_compiled_whole_gives_the_eager_rows_bit_for_bit() -> None:
    # Compiled kernels reorder reductions; the float64 arithmetic rounded once absorbs that
    # (0.4's float32 merge gave other rows here).
    from craft_core.compiling import inductor_options

    merge, layout, args = _merge_inputs(256)

    def fuse(*tensors):  # type: ignore[no-untyped-def]
        return merge(tensors[0], tensors[1], layout, *tensors[2:], 3)

    with torch.no_grad():
        want = fuse(*args)
        compiled = torch.compile(fuse, fullgraph=True, dynamic=False, options=inductor_options())
        got = compiled(*args)
    assert torch.equal(got, want)
