"""Every compression method behind one interface (see `craft_eval.methods.registry`).

Importing this package registers the CRAFT family, random and uniform, and then the
published baselines of `craft_eval.baselines` when that package is present.
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

try:  # the published baselines register themselves on import (issue 5)
    import craft_eval.baselines as _baselines  # noqa: F401
except ModuleNotFoundError as error:  # only a MISSING baselines package is tolerated
    if error.name not in ("craft_eval.baselines",):
        raise

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
