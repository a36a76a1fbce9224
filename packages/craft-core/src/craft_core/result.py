"""CompressionResult: what every compressor in the CRAFT project returns.

CRAFT and every baseline (craft-eval) return this one type, so adapters and evaluation code
never care which method ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


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
