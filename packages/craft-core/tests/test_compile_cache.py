"""No run depends on what an earlier run left in Inductor's on-disk cache.

Two subprocesses share one cache folder: the first compiles on this machine's default path,
the second under `ATEN_CPU_CAPABILITY=default` (then `MKL_CBWR=AVX2`). With
`craft_core.compiling.inductor_options()` each path keys its own graphs; without them (0.4)
the second run loaded the AVX-512 graph and its C++ failed to build.

    uv run pytest packages/craft-core/tests/test_compile_cache.py -q -p no:cacheprovider
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

PATHS = [{}, {"ATEN_CPU_CAPABILITY": "default"}, {"MKL_CBWR": "AVX2"}]


COMPILE = textwrap.dedent(
    """
    import torch
    from craft_core.compiling import inductor_options

    def f(x):
        return torch.nn.functional.normalize(x * 2 + 1, dim=1).sum(1)

    x = torch.rand(64, 48, generator=torch.Generator().manual_seed(0))
    got = torch.compile(f, fullgraph=True, dynamic=False, options=inductor_options())(x)
    torch.testing.assert_close(got, f(x))
    """
)


@pytest.mark.slow
def test_a_cache_filled_on_one_path_is_not_read_on_another(tmp_path) -> None:
    # The 0.4 failure: a graph cached on the AVX-512 path, loaded under
    # ATEN_CPU_CAPABILITY=default, failed to build its C++ ('at::vec' has not been declared).
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path)  # one cache, shared by both runs
    for path in PATHS:
        done = subprocess.run(
            [sys.executable, "-c", COMPILE], capture_output=True, text=True, env={**env, **path}
        )
        assert done.returncode == 0, (path, done.stderr[-3000:])
    assert any(tmp_path.iterdir())  # the runs did use this cache
