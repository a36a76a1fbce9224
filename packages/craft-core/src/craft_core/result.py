"""CompressionResult: what every compressor in the CRAFT project returns.

CRAFT and every baseline (craft-eval) return this one type, so adapters and evaluation code
never care which method ran.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from craft_core.budget import Budget


@dataclass
class CompressionResult:
    """The compressed tokens of ONE video.

    Attributes:
        features: `[N_c, D]`, the output tokens in ascending order of `kept_index`, in the
            dtype of the input features.
        coords: `[N_c, 3]` long, the ORIGINAL `(t, h, w)` of each kept (representative) token.
        kept_index: `[N_c]` long, ascending: the original index of each kept token.
        assignment: `[N]` long: for every input token, the output row it ended up in (in
            `[0, N_c)`; a kept token's own row: `assignment[kept_index[j]] == j`).
        rounds: number of select-then-fuse rounds that ran (0 for single-shot methods).
        info: free-form details of the run (method name, proxies used, ...).
    """

    features: torch.Tensor
    coords: torch.Tensor
    kept_index: torch.Tensor
    assignment: torch.Tensor
    rounds: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_input(self) -> int:
        """N, the number of input tokens."""
        return int(self.assignment.shape[0])

    @property
    def num_kept(self) -> int:
        """N_c, the number of output tokens."""
        return int(self.kept_index.shape[0])

    @property
    def ratio(self) -> float:
        """Realized compression ratio N / N_c."""
        return self.num_input / max(1, self.num_kept)


def loop_result(
    features: torch.Tensor,
    coords: torch.Tensor,
    final: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    rounds: int,
    budget: Budget,
    started: float,
    loop_info: dict[str, object],
) -> CompressionResult:
    """The loop's result, eager or compiled: `final` = (kept rows `[K, D]`, kept ids `[K]`
    sorted, owner `[N]`: the token each input token ended in); `loop_info` the loop's own
    fields after the common ones."""
    rows, kept, owner = final
    info: dict[str, object] = {
        "method": "craft",
        "mode": "ratio" if budget.threshold is None else "threshold",
        "floor": budget.floor,
        "seconds": time.perf_counter() - started,
        **loop_info,
    }
    return CompressionResult(
        features=rows.to(features.dtype),
        coords=coords[kept],
        kept_index=kept,
        assignment=torch.searchsorted(kept, owner),
        rounds=rounds,
        info=info,
    )
