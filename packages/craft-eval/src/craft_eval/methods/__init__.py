"""Every compression method behind one interface (see `craft_eval.methods.registry`).

Importing this package registers the CRAFT family, random and uniform; the published
baselines of `craft_eval.baselines` register themselves, each in its own module, when the
registry is first asked for a method (`registry.PLUGIN_PACKAGES`). Layering: baselines
import this package, never the reverse.
"""

from __future__ import annotations

from craft_eval.methods import craft as _craft
from craft_eval.methods import simple as _simple
from craft_eval.methods.base import fixed_budget, nearest_kept_assignment, prune_result
from craft_eval.methods.registry import (
    MethodInfo,
    TokenCompressor,
    get_method,
    get_method_info,
    list_methods,
    register_method,
)

del _craft, _simple

__all__ = [
    "MethodInfo",
    "TokenCompressor",
    "fixed_budget",
    "get_method",
    "get_method_info",
    "list_methods",
    "nearest_kept_assignment",
    "prune_result",
    "register_method",
]
