"""Pieces shared by the baseline compressors: validation, frames, budgets, result assembly.

Every baseline is a `Baseline`, a `craft_core.TokenCompressor`: the call `(features [N, D],
coords [N, 3], budget: TokenBudget, *, importance=None, **settings) -> CompressionResult`
(or the budget as `ratio=` / `threshold=` / `min_tokens=`) around a pure core
`(features, coords, checked, importance, **settings)` (`@baseline(NAME)` makes one; the
budget is checked against the tokens once, in `prepare`).
Computation runs in float32 whatever the input dtype; output features come back in the
input dtype.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from craft_core import CompressionResult, TokenBudget, check_tokens
from craft_eval.methods.base import Method, Request, fixed_budget, prune_result
from craft_eval.methods.registry import register_method

#: Rows per block when a method needs "most similar token" over many candidates.
SIM_BLOCK = 2048


@dataclass(frozen=True)
class Checked:
    """One video's budget, checked against its tokens (what every baseline's core gets).

    Attributes:
        floor: the fewest tokens to keep (exactly this many with a ratio), at most N.
        threshold: the adaptive mode's similarity threshold; None with a ratio.
        given: the budget as the caller gave it (`given.ratio`, `given.min_tokens`).
    """

    floor: int
    threshold: float | None
    given: TokenBudget

    @property
    def ratio(self) -> float:
        """The ratio the caller gave (a method without a threshold mode always has one)."""
        assert self.given.ratio is not None, "a threshold reached a method without that mode"
        return float(self.given.ratio)


#: The spans `check_settings` knows: how the error says each, and its test.
SPANS: dict[str, Callable[[float], bool]] = {
    "in [0, 1]": lambda v: 0.0 <= v <= 1.0,
    "in (0, 1]": lambda v: 0.0 < v <= 1.0,
    "in [0, 1)": lambda v: 0.0 <= v < 1.0,
    "> 0": lambda v: v > 0.0,
}
#: `check_settings`' span for a count: an int (not a bool) of at least 1.
COUNT = "int >= 1"


def check_settings(method: str, **settings: tuple[Any, str]) -> None:
    """Raise a ValueError naming `method` and the first setting outside its span.

    Each keyword is `name=(value, span)`: `span` a key of `SPANS` (a finite real number,
    not a bool, in that span) or `COUNT` (an int, not a bool, >= 1). The one argument
    check every baseline and stage shares (craft-eval's `--method-arg` values land here).
    """
    for name, (value, span) in settings.items():
        real = isinstance(value, (int, float)) and not isinstance(value, bool)
        if span == COUNT:
            ok, wanted = real and isinstance(value, int) and value >= 1, "an int >= 1"
        else:
            ok = real and math.isfinite(value) and SPANS[span](float(value))
            wanted = f"a number {span}"
        if not ok:
            raise ValueError(f"{method}: {name} must be {wanted}, got {value!r}")


def prepare(
    name: str,
    features: torch.Tensor,
    coords: torch.Tensor,
    budget: TokenBudget,
    *,
    adaptive: bool = False,
) -> Checked:
    """Validate the tokens against `budget`; return it resolved, its floor clamped to N.

    Methods without an adaptive (threshold) mode reject `threshold=`; their budget is then
    always the exact `max(1, floor(N / ratio))`.
    """
    if not adaptive:
        floor = fixed_budget(features, coords, budget, method=name)
        return Checked(floor=floor, threshold=None, given=budget)
    check_tokens(features, coords)
    resolved = budget.resolve(features.shape[0])
    return Checked(
        floor=min(resolved.floor, features.shape[0]), threshold=resolved.threshold, given=budget
    )


@dataclass(frozen=True)
class Frames:
    """Tokens grouped by their frame (`coords[:, 0]`), frames in ascending `t`.

    Attributes:
        frame_id: `[N]` long, 0..T-1: the rank of each token's `t` among the distinct ones.
        members: one `[n_f]` long tensor per frame: its tokens' indices, ascending.
    """

    frame_id: torch.Tensor
    members: list[torch.Tensor]

    @property
    def count(self) -> int:
        return len(self.members)

    @property
    def sizes(self) -> list[int]:
        return [int(m.numel()) for m in self.members]


def frames_of(coords: torch.Tensor) -> Frames:
    """Group the token indices by `t = coords[:, 0]` (ascending `t`, then ascending index)."""
    _, frame_id = torch.unique(coords[:, 0], sorted=True, return_inverse=True)
    order = torch.argsort(frame_id, stable=True)
    counts = torch.bincount(frame_id).tolist()
    return Frames(frame_id=frame_id, members=list(torch.split(order, counts)))


def importance_scores(
    features: torch.Tensor, importance: torch.Tensor | None
) -> tuple[torch.Tensor, str]:
    """Per-token importance in float32 and the name of the source that gave it.

    `importance` is the attention each token RECEIVES in the vision tower's last layer
    (averaged over heads and queries); without it the token's L2 norm is the proxy.
    """
    n = features.shape[0]
    if importance is None:
        return features.float().norm(dim=-1), "l2_norm"
    if not isinstance(importance, torch.Tensor):
        raise TypeError(f"importance must be a torch.Tensor, got {type(importance).__name__}")
    if importance.shape != (n,):
        raise ValueError(
            f"importance must be [N] = [{n}] (attention received per token), "
            f"got shape {tuple(importance.shape)}"
        )
    scores = importance.detach().to(device=features.device, dtype=torch.float32)
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("importance contains NaN or inf values")
    return scores, "attention"


def normalized(features: torch.Tensor) -> torch.Tensor:
    """Rows L2-normalised in float32 (a zero row stays zero)."""
    return F.normalize(features.float(), dim=-1)


def top_indices(scores: torch.Tensor, k: int, *, largest: bool = True) -> torch.Tensor:
    """The `k` best positions of `scores`; ties go to the smaller position. Ascending."""
    order = torch.sort(scores, descending=largest, stable=True).indices
    return torch.sort(order[:k]).values


def most_similar(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """For each row of `queries`, the index of the most similar row of `keys` (dot product
    of already normalised rows), blockwise; ties go to the smaller key index."""
    out = torch.empty(queries.shape[0], dtype=torch.long, device=queries.device)
    for start in range(0, queries.shape[0], SIM_BLOCK):
        sims = queries[start : start + SIM_BLOCK] @ keys.T
        out[start : start + SIM_BLOCK] = sims.argmax(dim=-1)  # torch: first maximum wins
    return out


def group_sum(values: torch.Tensor, group: torch.Tensor, count: int) -> torch.Tensor:
    """`[count, D]` sums of the rows of `values` by `group` (for few groups: a one-hot
    matrix product, much faster on a CPU than `index_add` into a handful of rows)."""
    return F.one_hot(group, count).T.to(values.dtype) @ values


def apportion(
    total: int, weights: Sequence[float], caps: Sequence[int], *, at_least_one: bool = False
) -> list[int]:
    """Split `total` into integers proportional to `weights`, each within `[0, caps[i]]`.

    Largest-remainder rounding (ties to the lower index); a part whose share exceeds its cap
    is held at the cap and the rest is split again among the others. With `at_least_one`
    (and `total >= len(caps)`), every part ends with at least one, taken from the largest.
    The parts always sum to `min(total, sum(caps))`.
    """
    n = len(caps)
    total = min(total, sum(caps))
    alloc = [0] * n
    free = [i for i in range(n) if caps[i] > 0]
    remaining = total
    while remaining > 0 and free:
        wsum = sum(max(0.0, float(weights[i])) for i in free)
        shares = {
            i: remaining * (max(0.0, float(weights[i])) / wsum if wsum > 0 else 1.0 / len(free))
            for i in free
        }
        over = [i for i in free if alloc[i] + shares[i] >= caps[i]]
        if over:
            for i in over:
                remaining -= caps[i] - alloc[i]
                alloc[i] = caps[i]
            free = [i for i in free if i not in over]
            continue
        floors = {i: math.floor(shares[i]) for i in free}
        for i in free:
            alloc[i] += floors[i]
        left = remaining - sum(floors.values())
        by_remainder = sorted(free, key=lambda i: (-(shares[i] - floors[i]), i))
        for i in by_remainder[:left]:
            alloc[i] += 1
        remaining = 0
    if at_least_one and total >= n:
        for i in range(n):
            if alloc[i] == 0 and caps[i] > 0:
                donor = max(range(n), key=lambda j: (alloc[j], -j))
                alloc[donor] -= 1
                alloc[i] += 1
    return alloc


def finish(
    name: str,
    features: torch.Tensor,
    coords: torch.Tensor,
    kept_index: torch.Tensor,
    representative: torch.Tensor,
    out_features: torch.Tensor | None = None,
    *,
    rounds: int = 0,
    info: dict[str, Any] | None = None,
) -> CompressionResult:
    """Assemble a `CompressionResult`.

    Args:
        kept_index: `[K]` distinct original indices of the output tokens, any order.
        representative: `[N]` the ORIGINAL index of the kept token every input token ended
            up in (`representative[k] == k` for every kept `k`).
        out_features: `[K, D]` rows aligned with `kept_index`; None for pure pruning (the
            kept tokens' own features are returned untouched).
    """
    kept, order = torch.sort(kept_index)
    row_of = torch.full((features.shape[0],), -1, dtype=torch.long, device=features.device)
    row_of[kept] = torch.arange(kept.numel(), device=features.device)
    assignment = row_of[representative]
    if bool((assignment < 0).any()) or not bool((assignment[kept] == row_of[kept]).all()):
        raise AssertionError(f"{name}: every token must end up in a kept token's row")
    return prune_result(
        features,
        coords,
        kept,
        assignment=assignment,
        output_features=None if out_features is None else out_features[order],
        rounds=rounds,
        info={"method": name, **(info or {})},
    )


def identity(
    name: str, features: torch.Tensor, coords: torch.Tensor, info: dict[str, Any]
) -> CompressionResult:
    """Every token kept as it is (a budget of N tokens, e.g. ratio 1)."""
    everything = torch.arange(features.shape[0], device=features.device)
    return finish(name, features, coords, everything, everything, rounds=0, info=info)


def opening(
    name: str,
    features: torch.Tensor,
    coords: torch.Tensor,
    budget: Checked,
    importance: torch.Tensor | None,
    settings: dict[str, Any],
) -> tuple[torch.Tensor, dict[str, Any], CompressionResult | None]:
    """What every attention-ranked baseline does first: `(scores [N], info, done)`, the
    scores from `importance_scores`, the result's `info` (`settings`, which importance
    ran), and `done` the whole video unchanged when the budget keeps every token (None
    otherwise: the method runs)."""
    scores, proxy = importance_scores(features, importance)
    info: dict[str, Any] = {"settings": settings, "importance": proxy}
    whole = budget.floor >= features.shape[0]
    return scores, info, identity(name, features, coords, info) if whole else None


ATTENTION_NOTE = " Ranks by attention=[N] (received attention); L2-norm proxy without it."
ATTENTION = "attention (ViT last layer, received); L2-norm fallback"


#: `core(features [N, D], coords [N, 3], budget: Checked, importance [N] | None, **settings)`
Core = Callable[..., CompressionResult]


class Baseline(Method):
    """A baseline: a `craft_core.TokenCompressor` around its pure `core`.

    `baseline(features, coords, budget, *, importance=None, **settings)` (or `ratio=` /
    `threshold=` / `min_tokens=` for the budget): the budget is checked against the tokens
    once (`prepare`) before `core` runs with the bound settings, overridden by the call's.
    `bind(**settings)` is the registered compressor (`craft-eval --method-arg` options).
    """

    def __init__(
        self,
        name: str,
        core: Core,
        *,
        adaptive: bool = False,
        needs_attention: bool = False,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.core = core
        self.adaptive = adaptive
        #: craft-adapters hands `importance=` (received attention) to compressors that ask
        self.needs_attention = needs_attention
        self.settings = dict(settings or {})
        self.__doc__ = core.__doc__
        self.__name__ = core.__name__

    def bind(self, **settings: Any) -> Baseline:
        """The same baseline with `settings` as its defaults."""
        return Baseline(
            self.name,
            self.core,
            adaptive=self.adaptive,
            needs_attention=self.needs_attention,
            settings={**self.settings, **settings},
        )

    def compress(self, request: Request, **settings: Any) -> CompressionResult:
        features, coords = request.features, request.coords
        checked = prepare(self.name, features, coords, request.budget, adaptive=self.adaptive)
        settings = {**self.settings, **settings}
        return self.core(features, coords, checked, request.importance, **settings)


def baseline(
    name: str,
    *,
    kind: str,
    description: str,
    adaptive: bool = False,
    needs: tuple[str, ...] = (),
    saliency: str = "token features",
) -> Callable[[Core], Baseline]:
    """Decorator: the baseline `name` from its core, registered in `craft_eval.methods`.

    `adaptive`: it has a threshold mode (without one, `threshold=` is refused naming the
    method). The registered factory binds the core's keyword-only settings, its options
    (`craft-eval --method-arg`); `needs=("attention",)` sets `needs_attention`, so
    craft-adapters hands the compressor the vision tower's received attention. The rest
    as `register_method`.
    """

    def decorate(core: Core) -> Baseline:
        function = Baseline(name, core, adaptive=adaptive, needs_attention="attention" in needs)
        params = inspect.signature(core).parameters.values()
        options = tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY)

        def factory(**given: Any) -> Baseline:
            return function.bind(**{key: given[key] for key in options if key in given})

        factory.__module__, factory.__qualname__ = core.__module__, core.__qualname__
        register_method(
            name,
            kind=kind,
            needs=needs,
            description=description,
            saliency=saliency,
            options=options,
        )(factory)
        return function

    return decorate
