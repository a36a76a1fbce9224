"""craft-core's test session: a fresh Inductor cache of its own.

No test may depend on what an earlier run (another instruction path, another torch) left in
Inductor's on-disk cache: each pytest process (each xdist worker under `nox`) compiles into a
new folder of its own, removed at its end. The subprocesses that the path tests spawn inherit
it through the environment.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_SAVED: dict[str, str | None] = {}


def pytest_configure(config: pytest.Config) -> None:
    _SAVED["TORCHINDUCTOR_CACHE_DIR"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    _SAVED["folder"] = tempfile.mkdtemp(prefix="craft-core-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _SAVED["folder"]


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = _SAVED.pop("folder", None)
    if folder is None:
        return
    previous = _SAVED.pop("TORCHINDUCTOR_CACHE_DIR")
    if previous is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous
    shutil.rmtree(folder, ignore_errors=True)  # the folder this session made
