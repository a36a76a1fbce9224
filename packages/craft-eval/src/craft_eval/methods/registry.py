"""The methods registry: CRAFT and every baseline behind one interface.

A *method* is a factory `(**options) -> TokenCompressor`, craft-core's contract:

    compressor(features, coords, budget, *, importance=None) -> craft_core.CompressionResult

taking ONE video's tokens (`features [N, D]` floating, `coords [N, 3]` integer `(t, h, w)`)
and one `craft_core.TokenBudget` (or the user's `ratio=` / `threshold=` / `min_tokens=`,
parsed into one at the call). Fixed-ratio budgets are exact: `max(1, floor(N / ratio))`
tokens come out. A compressor that sets `needs_attention = True` is handed
`importance=[N]` (received attention from the vision tower) by craft-adapters.

Register a method with the decorator:

    @register_method("my-method", kind="prune", needs=(), description="...")
    def build(**kwargs) -> TokenCompressor: ...

and build it with `get_method("my-method", **kwargs)`. `list_methods()` is what
`craft-eval methods` prints.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from craft_core import TokenCompressor

_KINDS = ("merge", "prune", "none")


MethodFactory = Callable[..., TokenCompressor]


@dataclass(frozen=True)
class MethodInfo:
    """One registered method.

    Attributes:
        name: registry key, e.g. "craft", "divprune".
        kind: "merge" (outputs are combinations of inputs), "prune" (outputs are input rows)
            or "none" (no compression).
        needs: what the method needs beyond features + coords, e.g. ("checkpoint",),
            ("attention",); empty when nothing.
        description: one line for `craft-eval methods`.
        factory: `(**kwargs) -> TokenCompressor`.
        saliency: what ranks or groups the tokens, e.g. "token features" or "attention"
            (the vision tower's received attention, handed over by craft-adapters when the
            built compressor sets `needs_attention`; each result's `info["importance"]`
            records what actually ran).
        options: the option names the factory takes, where its signature does not say them
            (a baseline's settings); None: read from the factory's signature.
    """

    name: str
    kind: str
    needs: tuple[str, ...]
    description: str
    factory: MethodFactory
    saliency: str = "token features"
    options: tuple[str, ...] | None = None


_REGISTRY: dict[str, MethodInfo] = {}

PLUGIN_PACKAGES = ("craft_eval.baselines",)
"""Packages whose every module may register methods: imported (all their modules) on the
first lookup, so a new method is one new file there and the registry names no module."""
_discovered = False


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    for package in PLUGIN_PACKAGES:
        module = importlib.import_module(package)
        for info in pkgutil.iter_modules(module.__path__):
            importlib.import_module(f"{package}.{info.name}")
    _discovered = True


def register_method(
    name: str,
    *,
    kind: str,
    needs: tuple[str, ...] | list[str] = (),
    description: str,
    saliency: str = "token features",
    options: tuple[str, ...] | None = None,
) -> Callable[[MethodFactory], MethodFactory]:
    """Decorator: register `factory` under `name` (`saliency`, `options`: see `MethodInfo`).

    Raises:
        ValueError: an empty name, an unknown kind, or a name registered twice with a
            different factory.
    """
    if not name or not isinstance(name, str):
        raise ValueError(f"method name must be a non-empty string, got {name!r}")
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
    if isinstance(needs, str):
        needs = (needs,)

    def decorator(factory: MethodFactory) -> MethodFactory:
        previous = _REGISTRY.get(name)
        if previous is not None and _qualname(previous.factory) != _qualname(factory):
            raise ValueError(
                f"method {name!r} is already registered by {_qualname(previous.factory)}"
            )
        _REGISTRY[name] = MethodInfo(
            name=name,
            kind=kind,
            needs=tuple(needs),
            description=description,
            factory=factory,
            saliency=saliency,
            options=None if options is None else tuple(options),
        )
        return factory

    return decorator


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def get_method_info(name: str) -> MethodInfo:
    """The `MethodInfo` of `name`; KeyError listing the known names when absent."""
    _discover()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "(none)"
        raise KeyError(f"unknown method {name!r}; registered methods: {known}") from None


def get_method(name: str, **kwargs: Any) -> TokenCompressor:
    """Build the method registered as `name` with `kwargs` (passed to its factory)."""
    return get_method_info(name).factory(**kwargs)


def list_methods() -> list[MethodInfo]:
    """Every registered method, sorted by name."""
    _discover()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def unregister_method(name: str) -> None:
    """Remove `name` from the registry (tests use it; no error when absent)."""
    _REGISTRY.pop(name, None)
