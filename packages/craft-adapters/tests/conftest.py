"""Fixtures: tiny models of every backbone, each built (and saved / reloaded) once."""

from __future__ import annotations

from typing import Any

import pytest

from craft_adapters.tiny import build_tiny_vlm


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Any]]:
    class _Lazy(dict):  # type: ignore[type-arg]
        def __missing__(self, key: str) -> tuple[Any, Any]:
            value = build_tiny_vlm(key, tmp_path_factory.mktemp(key))
            self[key] = value
            return value

    return _Lazy()
