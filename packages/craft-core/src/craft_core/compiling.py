"""torch.compile settings shared by every compiled path of craft-core.

    from craft_core.compiling import inductor_options
    fn = torch.compile(fn, fullgraph=True, dynamic=False, options=inductor_options())

Inductor's on-disk cache keys a graph by its inductor config, not by the CPU instruction path
that ATen was started with (`ATEN_CPU_CAPABILITY`). A graph compiled on the default AVX-512
path and loaded later under `ATEN_CPU_CAPABILITY=default` then fails to build its C++
(`'at::vec' has not been declared`). Naming the vector width explicitly (`cpp.simdlen`, which
is part of the key and is what the generated C++ is written for) keys each path's graphs
apart: no run depends on what a run on another path left in the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# ATen's CPU capability -> the vector width inductor writes its C++ kernels for.
# Anything else (DEFAULT, and non-x86 paths) gets 1: scalar C++, no `at::vec`.
_SIMD_BITS = {"AVX512": 512, "AVX2": 256}


def inductor_options() -> dict[str, str | int | bool | Callable[..., Any]]:
    """Inductor options for `torch.compile(..., options=...)`, keyed by this process's
    `torch.backends.cpu.get_cpu_capability()` (see the module docstring)."""
    capability = torch.backends.cpu.get_cpu_capability()
    return {"cpp.simdlen": _SIMD_BITS.get(capability, 1)}
