"""Helpers shared by the simple methods here and by the baselines (craft_eval.baselines)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from craft_core import CompressionResult, TokenBudget, budget_of, check_tokens


def fixed_budget(
    features: torch.Tensor, coords: torch.Tensor, budget: TokenBudget, *, method: str
) -> int:
    """Validate one video's tokens against a FIXED-ratio budget; return the token count to keep.

    Methods with no adaptive mode call this: a threshold raises a ValueError naming the method.
    """
    check_tokens(features, coords)
    if budget.ratio is None:
        raise ValueError(
            f"method {method!r} has no threshold mode; give ratio=... (a fixed token budget)"
        )
    return budget.resolve(int(features.shape[0])).floor


@dataclass(frozen=True)
class Request:
    """One compressor call: a video's tokens, its budget (checked) and the importance.

    Attributes:
        features: `[N, D]` floating; coords: `[N, 3]` integer `(t, h, w)`.
        budget: the call's budget (checked once, where the user spelled it).
        importance: `[N]` attention received per token, or None.
    """

    features: torch.Tensor
    coords: torch.Tensor
    budget: TokenBudget
    importance: torch.Tensor | None = None


class Method:
    """Base of the registered compressors: a `craft_core.TokenCompressor`.

    The call takes the budget as a `TokenBudget` (what the packages pass along), or as the
    user's keywords (`ratio=` or `threshold=`, `min_tokens=`), turned into one here
    (`craft_core.budget_of`); `attention=` is another name for `importance=`. Subclasses
    implement `compress`; `extras` are the call's method settings (a baseline's options).
    """

    #: True when the method ranks tokens by the vision tower's received attention
    needs_attention: bool = False

    def __call__(
        self,
        features: torch.Tensor,
        coords: torch.Tensor,
        budget: TokenBudget | None = None,
        *,
        importance: torch.Tensor | None = None,
        ratio: float | None = None,
        threshold: float | None = None,
        min_tokens: int | None = None,
        attention: torch.Tensor | None = None,
        **extras: Any,
    ) -> CompressionResult:
        budget = budget_of(budget, ratio=ratio, threshold=threshold, min_tokens=min_tokens)
        importance = importance if importance is not None else attention
        return self.compress(Request(features, coords, budget, importance), **extras)

    def compress(self, request: Request, **extras: Any) -> CompressionResult:
        """Compress one video to its budget."""
        raise NotImplementedError


def nearest_kept_assignment(num_tokens: int, kept_index: torch.Tensor) -> torch.Tensor:
    """`assignment [N]` for a pruning method: each token points at the kept token NEAREST
    in original index (ties: the earlier one); a kept token points at its own row.

    Tokens are in raster order over (t, h, w), so the nearest index is the neighbouring
    patch of the same frame row in nearly all cases. O(N log N_c); no similarity needed.
    """
    kept = kept_index.to(torch.long)
    positions = torch.arange(num_tokens, device=kept.device)
    right = torch.searchsorted(kept, positions).clamp(max=kept.numel() - 1)
    left = (right - 1).clamp(min=0)
    dist_right = (kept[right] - positions).abs()
    dist_left = (kept[left] - positions).abs()
    return torch.where(dist_left <= dist_right, left, right)


def prune_result(
    features: torch.Tensor,
    coords: torch.Tensor,
    kept_index: torch.Tensor,
    *,
    assignment: torch.Tensor | None = None,
    output_features: torch.Tensor | None = None,
    rounds: int = 0,
    info: dict[str, Any] | None = None,
) -> CompressionResult:
    """A `CompressionResult` from the kept indices (sorted here).

    Args:
        kept_index: original indices of the survivors, any order, no duplicates.
        assignment: `[N]` output row of every input token, in the order of the SORTED
            kept indices; default: `nearest_kept_assignment`.
        output_features: `[N_c, D]` rows in sorted-kept order; default: the kept input rows
            (pure pruning).
    """
    kept_sorted, _ = torch.sort(kept_index.to(device=features.device, dtype=torch.long))
    if output_features is None:
        output_features = features.index_select(0, kept_sorted)
    if assignment is None:
        assignment = nearest_kept_assignment(int(features.shape[0]), kept_sorted)
    return CompressionResult(
        features=output_features.to(features.dtype),
        coords=coords.index_select(0, kept_sorted).to(torch.long),
        kept_index=kept_sorted,
        assignment=assignment.to(torch.long),
        rounds=rounds,
        info=dict(info or {}),
    )
