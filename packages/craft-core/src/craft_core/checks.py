"""Argument checks shared by every public entry point of craft-core (and craft-adapters).

Each check names the argument and what is allowed. Convention: a value of the wrong type or
dtype raises TypeError (a bool is never an int, a float tensor never holds indices); a value
of the right type outside its range, a wrong shape, a non-finite number or a tensor without
data (the meta device) raises ValueError.

    from craft_core.checks import check_int, check_index_tensor
    check_int("round_index", round_index, minimum=1)
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch


def check_int(name: str, value: Any, *, minimum: int | None = None) -> int:
    """`value` as an int (Python or NumPy integer; never a bool or a float) >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_number(name: str, value: Any, *, minimum: float | None = None) -> float:
    """`value` as a finite float (int or float; never a bool or a string) >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum:g}, got {value!r}")
    return float(value)


def check_has_data(name: str, tensor: torch.Tensor) -> None:
    """A tensor on the meta device has a shape but no values: nothing can be computed."""
    if tensor.device.type == "meta":
        raise ValueError(
            f"{name} is on the meta device (a shape without data); give a tensor on cpu or "
            "cuda (materialize the model, e.g. with to_empty() + load_state_dict)"
        )


def check_index_tensor(name: str, tensor: Any, *, dim: int = 1) -> torch.Tensor:
    """`tensor` as an integer index tensor of `dim` dimensions (not bool, not float)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of indices, got {type(tensor).__name__}")
    if tensor.dtype == torch.bool or tensor.is_floating_point() or tensor.is_complex():
        raise TypeError(f"{name} must be an integer tensor of indices, got dtype {tensor.dtype}")
    if tensor.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimension(s), got shape {tuple(tensor.shape)}")
    check_has_data(name, tensor)
    return tensor


def check_in_range(name: str, index: torch.Tensor, size: int) -> None:
    """Every entry of the integer tensor `index` lies in `[0, size)`."""
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= size):
        raise ValueError(
            f"{name} must index 0..{size - 1}, got values in "
            f"[{int(index.min())}, {int(index.max())}]"
        )


def check_groups(
    n: int,
    targets: torch.Tensor,
    sources: torch.Tensor,
    similarity: torch.Tensor,
    round_index: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`CraftCompressor.fuse_groups`' edge arguments checked: `[E]` targets, sources and
    similarity of tokens `[0, n)`; the indices returned as long.

    Raises:
        TypeError: float or bool `targets` / `sources`, a non-floating `similarity`, a
            non-int `round_index`.
        ValueError: lengths that differ, indices out of range, a source listed twice or
            also a target, a NaN/inf similarity, `round_index < 1`, tensors on other
            devices or on the meta device.
    """
    check_index_tensor("targets", targets)
    check_index_tensor("sources", sources)
    if not isinstance(similarity, torch.Tensor) or not similarity.is_floating_point():
        raise TypeError(
            "similarity must be a floating tensor [E], got "
            + (
                str(similarity.dtype)
                if isinstance(similarity, torch.Tensor)
                else type(similarity).__name__
            )
        )
    check_int("round_index", round_index, minimum=1)
    if targets.shape != sources.shape or similarity.shape != targets.shape:
        raise ValueError(
            f"targets {tuple(targets.shape)}, sources {tuple(sources.shape)} and similarity "
            f"{tuple(similarity.shape)} must have one equal length E"
        )
    check_has_data("similarity", similarity)
    for name, tensor in (("targets", targets), ("sources", sources), ("similarity", similarity)):
        if tensor.device != targets.device:
            raise ValueError(f"{name} is on {tensor.device} but targets on {targets.device}")
    if targets.numel() == 0:
        return targets.long(), sources.long()
    check_in_range("targets", targets, n)
    check_in_range("sources", sources, n)
    if not bool(torch.isfinite(similarity).all()):
        raise ValueError("similarity contains NaN or inf values (the gate would give NaN rows)")
    if torch.unique(sources).numel() != sources.numel():
        raise ValueError("sources must list each token at most once")
    if bool(torch.isin(sources, targets).any()):
        raise ValueError("a token cannot be both a source and a target")
    return targets.long(), sources.long()
