"""Input validation and token budgets shared by CRAFT and every baseline compressor.

A budget is either a fixed ratio (stop at exactly `max(1, floor(N / ratio))` tokens) or a
similarity threshold (stop when no pair is that similar, never below a floor). Baselines in
craft-eval call the same functions so that every method is held to the same token count.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import torch

from craft_core.checks import check_has_data, check_int, check_number

MAX_FEATURE_MAGNITUDE = 1e15
"""Largest |feature| accepted: float32 squares of larger values overflow inside the gate."""


@dataclass(frozen=True)
class Budget:
    """A resolved budget for one video of `N` tokens.

    Attributes:
        floor: the fewest tokens the compressor may leave (`N_tgt` or `N_min`).
        threshold: `s_theta` in threshold mode; None in fixed-ratio mode.
    """

    floor: int
    threshold: float | None = None

    def __post_init__(self) -> None:
        check_int("floor", self.floor, minimum=1)
        if self.threshold is not None:
            threshold = check_number("threshold", self.threshold)
            if not -1.0 < threshold <= 1.0:
                raise ValueError(f"threshold must lie in (-1, 1], got {threshold!r}")


def target_token_count(num_tokens: int, ratio: float) -> int:
    """Token count of the fixed-ratio mode: `max(1, floor(N / ratio))`.

    Raises:
        TypeError: `num_tokens` not an int (a bool is not), `ratio` not a number.
        ValueError: `num_tokens < 1`, `ratio` < 1 or not finite.
    """
    num_tokens = check_int("num_tokens", num_tokens, minimum=1)
    ratio = check_number("ratio", ratio, minimum=1.0)
    return max(1, math.floor(num_tokens / ratio))


def default_min_tokens(num_tokens: int) -> int:
    """Floor of the threshold mode when none is given: `max(1, floor(N / 128))`.

    Raises:
        TypeError: `num_tokens` not an int. ValueError: `num_tokens < 1`.
    """
    num_tokens = check_int("num_tokens", num_tokens, minimum=1)
    return max(1, num_tokens // 128)


@dataclass(frozen=True)
class TokenBudget:
    """A token budget, checked once when it is built: exactly one of `ratio` (fixed-ratio
    mode, >= 1) or `threshold` (adaptive mode, in (-1, 1]), and `min_tokens` (threshold mode
    only, >= 1). Every package passes this value along instead of loose keywords.

        budget = TokenBudget(ratio=8)              # or TokenBudget(threshold=0.9, min_tokens=4)
        budget.resolve(num_tokens)                 # -> Budget(floor, threshold) for one video
        compressor(features, coords, budget)       # any craft_core.TokenCompressor

    Raises (when built):
        ValueError: both or neither of `ratio` / `threshold`, `ratio < 1` or not finite,
            `threshold` outside (-1, 1], `min_tokens < 1`, or `min_tokens` with a ratio.
        TypeError: a budget argument that is not a number (`min_tokens`: not an int).
    """

    ratio: float | None = None
    threshold: float | None = None
    min_tokens: int | None = None

    def __post_init__(self) -> None:
        ratio, threshold, min_tokens = self.ratio, self.threshold, self.min_tokens
        if (ratio is None) == (threshold is None):
            raise ValueError(
                "give exactly one budget: ratio=... (fixed-ratio mode) or threshold=... "
                f"(adaptive mode); got ratio={ratio!r}, threshold={threshold!r}"
            )
        if ratio is not None:
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
                raise TypeError(f"ratio must be a number, got {type(ratio).__name__}")
            if not math.isfinite(ratio) or ratio < 1:
                raise ValueError(f"ratio must be a finite number >= 1, got {ratio!r}")
            if min_tokens is not None:
                raise ValueError(
                    "min_tokens applies to the threshold mode only; with ratio=... the floor "
                    "is max(1, floor(N / ratio))"
                )
            object.__setattr__(self, "ratio", float(ratio))
            return
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise TypeError(f"threshold must be a number, got {type(threshold).__name__}")
        if not (-1.0 < threshold <= 1.0):
            raise ValueError(f"threshold must lie in (-1, 1], got {threshold!r}")
        if min_tokens is not None:
            if isinstance(min_tokens, bool) or not isinstance(min_tokens, int):
                raise TypeError(f"min_tokens must be an int, got {type(min_tokens).__name__}")
            if min_tokens < 1:
                raise ValueError(f"min_tokens must be >= 1, got {min_tokens}")
        object.__setattr__(self, "threshold", float(threshold))

    @classmethod
    def parse(
        cls,
        ratio: Any = None,
        threshold: Any = None,
        min_tokens: Any = None,
        *,
        names: tuple[str, str, str] = ("ratio", "threshold", "min_tokens"),
    ) -> TokenBudget:
        """A budget from text (command-line options, lmms-eval `model_args`): "" and None
        are unset. Errors name the argument as the caller spells it (`names`), e.g.
        `("--ratio", "--threshold", "--min-tokens")`."""
        values: list[Any] = []
        for value, name, kind in zip((ratio, threshold, min_tokens), names, (float, float, int)):
            if value is None or value == "":
                values.append(None)
                continue
            if isinstance(value, str):
                try:
                    value = kind(value.strip())
                except ValueError:
                    raise ValueError(f"{name}={value!r} is not a number") from None
            values.append(value)
        try:
            return cls(*values)
        except (TypeError, ValueError) as error:
            raise ValueError(_rename(str(error), names)) from None

    @property
    def mode(self) -> str:
        """ "ratio" or "threshold"."""
        return "ratio" if self.ratio is not None else "threshold"

    def resolve(self, num_tokens: int, *, clamp: bool = True) -> Budget:
        """The floor (+ threshold) for one video of `num_tokens` (int >= 1) tokens.

        `clamp=False`: a ratio larger than `num_tokens` (`floor(N / ratio) = 0`) raises a
        ValueError instead of keeping 1 token (a server that reserves each video's
        placeholders refuses such a video rather than compress it less than asked).
        """
        check_int("num_tokens", num_tokens, minimum=1)
        if self.ratio is not None:
            if not clamp and num_tokens < self.ratio:
                raise ValueError(
                    f"ratio {self.ratio:g} leaves no token for a video of {num_tokens} tokens "
                    f"(floor({num_tokens} / {self.ratio:g}) = 0); use a ratio <= {num_tokens} "
                    "or a longer or larger video"
                )
            return Budget(floor=target_token_count(num_tokens, self.ratio))
        if self.min_tokens is None:
            return Budget(floor=default_min_tokens(num_tokens), threshold=self.threshold)
        return Budget(floor=self.min_tokens, threshold=self.threshold)

    def kwargs(self) -> dict[str, Any]:
        """The set entries as keywords of a compressor call (`ratio=` or `threshold=` and
        maybe `min_tokens=`)."""
        out: dict[str, Any] = {}
        for key in ("ratio", "threshold", "min_tokens"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out

    def describe(self) -> str:
        """`ratio=8`, `threshold=0.85` or `threshold=0.85,min_tokens=4` (logs, run names)."""
        return ",".join(f"{k}={v:g}" for k, v in self.kwargs().items())


def _rename(message: str, names: tuple[str, str, str]) -> str:
    """`message` with the budget fields spelled as the caller names them."""
    message = re.sub(r"\bmin_tokens\b", lambda _: names[2], message)
    for plain, name in (("ratio", names[0]), ("threshold", names[1])):
        message = re.sub(rf"(?<![\w-]){plain}(?= must|=)", name.replace("\\", "\\\\"), message)
    return message


def resolve_budget(
    num_tokens: int,
    *,
    ratio: float | None = None,
    threshold: float | None = None,
    min_tokens: int | None = None,
) -> Budget:
    """Check the budget arguments and turn them into a floor (+ threshold):
    `TokenBudget(ratio, threshold, min_tokens).resolve(num_tokens)`.

    Raises:
        ValueError, TypeError: as `TokenBudget`.
    """
    return TokenBudget(ratio=ratio, threshold=threshold, min_tokens=min_tokens).resolve(num_tokens)


def check_tokens(
    features: torch.Tensor,
    coords: torch.Tensor,
    hidden_size: int | None = None,
    magnitude: bool = True,
) -> None:
    """Validate one video's tokens.

    Args:
        features: `[N, D]` floating tensor, finite.
        coords: `[N, 3]` integer tensor of `(t, h, w)`, on the same device.
        hidden_size: expected `D`, if the compressor has a fixed width.
        magnitude: check the values too (one host sync); `check_videos` checks a batch's
            values in one.

    Raises:
        TypeError: a non-tensor, non-floating `features` or non-integer `coords` (bool and
            float coords included).
        ValueError: wrong rank or shape, N = 0, NaN/inf or huge (> 1e15) features, devices
            that differ, a tensor on the meta device (no data).
    """
    if not isinstance(features, torch.Tensor):
        raise TypeError(f"features must be a torch.Tensor, got {type(features).__name__}")
    if not isinstance(coords, torch.Tensor):
        raise TypeError(f"coords must be a torch.Tensor, got {type(coords).__name__}")
    if features.dim() != 2:
        raise ValueError(f"features must be [N, D], got shape {tuple(features.shape)}")
    if not features.is_floating_point():
        raise TypeError(f"features must be a floating tensor, got dtype {features.dtype}")
    if features.shape[0] == 0:
        raise ValueError("features is empty (N = 0): there is nothing to compress")
    if hidden_size is not None and features.shape[1] != hidden_size:
        raise ValueError(
            f"features has width D = {features.shape[1]} but the compressor was built for "
            f"hidden_size = {hidden_size}"
        )
    if coords.dtype.is_floating_point or coords.dtype.is_complex or coords.dtype == torch.bool:
        raise TypeError(f"coords must be an integer tensor (t, h, w), got dtype {coords.dtype}")
    if coords.dim() != 2 or coords.shape[1] != 3 or coords.shape[0] != features.shape[0]:
        raise ValueError(
            f"coords must be [N, 3] with N = {features.shape[0]} (one (t, h, w) per token), "
            f"got shape {tuple(coords.shape)}"
        )
    if coords.device != features.device:
        raise ValueError(f"coords is on {coords.device} but features on {features.device}")
    check_has_data("features", features)
    if magnitude:
        # One pass: the largest magnitude is NaN or inf exactly when an entry is.
        _check_magnitude(float(features.detach().abs().amax()))


def _check_magnitude(top: float) -> None:
    """The largest |entry| of a video's features: finite and at most the limit."""
    if not math.isfinite(top):
        raise ValueError("features contains NaN or inf values")
    if top > MAX_FEATURE_MAGNITUDE:
        raise ValueError(
            f"features has an entry of magnitude {top:.3g}; CRAFT fuses rows in float32 and "
            f"needs every |entry| <= {MAX_FEATURE_MAGNITUDE:.0e} (squares inside the gate's "
            "LayerNorm would overflow); rescale the features"
        )


def check_videos(
    features: list[torch.Tensor],
    coords: list[torch.Tensor],
    hidden_size: int | None,
    device: torch.device,
) -> None:
    """`check_tokens` on each video of a batch, the error naming the video (`features[b]`),
    and every video on `device`.

    Raises:
        TypeError / ValueError: as `check_tokens`; lists of different lengths; a video on
            another device than `device`.
    """
    if len(features) != len(coords):
        raise ValueError(f"features holds {len(features)} videos but coords holds {len(coords)}")
    for index, (feats, coord) in enumerate(zip(features, coords)):
        try:
            check_tokens(feats, coord, hidden_size, magnitude=False)
        except (TypeError, ValueError) as error:
            raise type(error)(f"features[{index}] / coords[{index}]: {error}") from None
        if feats.device != device:
            raise ValueError(
                f"features[{index}] is on {feats.device} but the compressor is on {device}; "
                "move one of them (compressor.to(device))"
            )
    if not features:
        return
    # Every video's largest magnitude in one transfer (one host sync for the batch).
    tops = torch.stack([f.detach().abs().amax().double() for f in features]).tolist()
    for index, top in enumerate(tops):
        try:
            _check_magnitude(top)
        except ValueError as error:
            raise ValueError(f"features[{index}]: {error}") from None
