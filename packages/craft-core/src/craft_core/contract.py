"""The compressor contract every package shares: `TokenCompressor` and `budget_of`.

A token compressor takes ONE video's tokens and a checked budget and returns a
`CompressionResult`:

    result = compressor(features, coords, budget)            # budget: a TokenBudget

`features` are `[N, D]` floating, `coords` `[N, 3]` integer `(t, h, w)`; `importance=[N]`
(the attention each token receives in the vision tower) is handed over by craft-adapters
when the compressor sets `needs_attention = True`. CRAFT (`CraftCompressor`) and every
craft-eval method implement it directly; craft-adapters asks `isinstance(c, TokenCompressor)`
and `c.needs_attention`, never a signature.

Many videos go through ONE call, `compress_many(compressor, features, coords, budget)`: a
compressor with a batched entry of its own (CRAFT's `CraftCompressor.compress_many`: every
video advances through each round together, each video's tokens and rows the same bits as
alone) runs it; any other is called once per video. Every package that holds several videos
at once (a batch of prompts, a training step, a served forward) calls this one function.

The packages pass the `TokenBudget` object among themselves, unopened, parsed once where the
user spelled it (a command-line option, a config key, `wrap(ratio=...)`). The protocol takes
nothing else. The user's keywords (`ratio=`, `threshold=`, `min_tokens=`) stay on the calls
a person types: `CraftCompressor(...)(f, c, ratio=8)` and a craft-eval method looked up by
name accept them too and turn them into one `TokenBudget` there (`budget_of`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from craft_core.budget import TokenBudget

if TYPE_CHECKING:
    import torch

    from craft_core.result import CompressionResult

__all__ = ["TokenCompressor", "budget_of", "compress_many"]


@runtime_checkable
class TokenCompressor(Protocol):
    """What CRAFT and every baseline are (see the module docstring).

    Attributes:
        needs_attention: True when the compressor ranks tokens by the vision tower's
            received attention and wants `importance=[N]`; craft-adapters records and hands
            it over only then.
    """

    needs_attention: bool

    def __call__(
        self,
        features: torch.Tensor,
        coords: torch.Tensor,
        budget: TokenBudget,
        *,
        importance: torch.Tensor | None = ...,
    ) -> CompressionResult:
        """Compress one video (`features [N, D]`, `coords [N, 3]`) to `budget`."""
        ...


def budget_of(
    budget: TokenBudget | None = None,
    *,
    ratio: Any = None,
    threshold: Any = None,
    min_tokens: Any = None,
) -> TokenBudget:
    """The one `TokenBudget` of a user's compressor call (`CraftCompressor`, a craft-eval
    method): `budget` as it is (not re-checked), or the keywords checked into a new one.

    Raises:
        TypeError: `budget` that is not a `TokenBudget` (or as `TokenBudget` for the fields).
        ValueError: `budget` together with its fields, or as `TokenBudget` for the fields.
    """
    if budget is None:
        return TokenBudget(ratio=ratio, threshold=threshold, min_tokens=min_tokens)
    if not isinstance(budget, TokenBudget):
        raise TypeError(f"budget must be a craft_core.TokenBudget, got {type(budget).__name__}")
    fields = {"ratio": ratio, "threshold": threshold, "min_tokens": min_tokens}
    given = [name for name, value in fields.items() if value is not None]
    if given:
        raise ValueError(
            f"give budget=TokenBudget(...) or its fields, not both (got budget and {given[0]})"
        )
    return budget


def compress_many(
    compressor: TokenCompressor,
    features: Sequence[torch.Tensor],
    coords: Sequence[torch.Tensor],
    budget: TokenBudget,
    *,
    importance: Sequence[torch.Tensor | None] | None = None,
) -> list[CompressionResult]:
    """Compress several videos with one budget: one `CompressionResult` per video, in order.

    Args:
        compressor: any `TokenCompressor`; its own `compress_many` runs when it has one.
        features: B tensors `[N_b, D]` (lengths may differ).
        coords: B tensors `[N_b, 3]` integer `(t, h, w)`.
        budget: one `TokenBudget` for every video (each resolves it for its own `N_b`).
        importance: B tensors `[N_b]` (or None each), for a compressor that `needs_attention`.

    Raises:
        ValueError: `features`, `coords` and `importance` of different lengths.
    """
    features, coords = list(features), list(coords)
    if len(features) != len(coords):
        raise ValueError(f"features holds {len(features)} videos but coords holds {len(coords)}")
    if importance is not None:
        importance = list(importance)
        if len(importance) != len(features):
            raise ValueError(
                f"importance holds {len(importance)} entries but features {len(features)} videos"
            )
    own = getattr(compressor, "compress_many", None)
    if callable(own):
        return own(features, coords, budget, importance=importance)
    if importance is None:
        return [compressor(f, c, budget) for f, c in zip(features, coords)]
    return [compressor(f, c, budget, importance=i) for f, c, i in zip(features, coords, importance)]
