"""The published baselines as pure functions on one video's tokens (issue 5).

Each is a `craft_core.TokenCompressor`: it takes `features [N, D]`, `coords [N, 3]`
(t, h, w) and one budget (a `TokenBudget`, or `ratio=` fixed and exact, or `threshold=` for
the methods with an adaptive mode) and returns a `craft_core.CompressionResult`. Methods that score tokens by the vision tower's attention
take `importance=[N]` (attention received) and fall back to the L2 norm, recording which ran
in `result.info["importance"]`; they set `needs_attention = True`,
so craft-adapters hands them the vision tower's last-layer attention (craft_adapters.attention).

Each module registers its own method in `craft_eval.methods` (`@baseline(...)` on its
core, `_common.baseline`): adding a baseline is one new file here plus its test, no table
to edit. The registry imports every module of this package when it is first asked for a
method.
"""

from __future__ import annotations

from craft_eval.baselines._common import Baseline
from craft_eval.baselines.divprune import divprune
from craft_eval.baselines.dtd import dtd
from craft_eval.baselines.fastvid import fastvid
from craft_eval.baselines.flashvid import flashvid
from craft_eval.baselines.holitom import holitom
from craft_eval.baselines.scissor import SEARCH_STEPS, llava_scissor, scissor_plan
from craft_eval.baselines.scissor_merge import ScissorMergeMethod, scissor_merge
from craft_eval.baselines.tome import tome
from craft_eval.baselines.vidcom2 import vidcom2
from craft_eval.baselines.visionzip import visionzip

__all__ = [
    "SEARCH_STEPS",
    "Baseline",
    "ScissorMergeMethod",
    "divprune",
    "dtd",
    "fastvid",
    "flashvid",
    "holitom",
    "llava_scissor",
    "scissor_merge",
    "scissor_plan",
    "tome",
    "vidcom2",
    "visionzip",
]
