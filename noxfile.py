"""Checks of the CRAFT workspace: `uv run nox` runs lint, typecheck and tests.

Each package is tested in its own environment built from `uv.lock` with only that package's
declared dependencies, so an import of an undeclared dependency fails here, not at a user's.

    uv run nox                 # lint + typecheck + tests (what CI runs)
    uv run nox -s tests        # the test suites only
    uv run nox -s bench        # benchmarks: print ratios measured in one run
    uv run nox -s gpu_tests    # gpu-marked tests in the current interpreter (skip without CUDA)
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True

ROOT = Path(__file__).parent
PACKAGES = ["craft-core", "craft-adapters", "craft-eval", "craft-train", "craft-world"]
SOURCES = [f"packages/{p}/src" for p in PACKAGES]


def _sync(session: nox.Session, *args: str) -> None:
    """Install from the lock file into this session's environment (never re-resolve)."""
    session.run_install(
        "uv",
        "sync",
        "--frozen",
        "--no-default-groups",
        *args,
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
        external=True,
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check + ruff format --check on the whole workspace."""
    _sync(session, "--only-group", "dev")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over every package's sources, with all packages installed."""
    _sync(session, "--all-packages", "--group", "dev")
    session.run("mypy", *SOURCES)


@nox.session
@nox.parametrize("package", PACKAGES)
def tests(session: nox.Session, package: str) -> None:
    """One package's tests, in an environment holding that package and its declared deps."""
    _sync(session, "--package", package, "--group", "test")
    session.run(
        "pytest",
        f"packages/{package}/tests",
        "-m",
        "not gpu",
        "-p",
        "no:cacheprovider",
        *session.posargs,
    )


@nox.session
def bench(session: nox.Session) -> None:
    """Every package's benchmarks/*.py, each printing ratios measured in one run."""
    _sync(session, "--all-packages", "--group", "dev")
    for script in sorted(ROOT.glob("packages/*/benchmarks/bench_*.py")):
        session.run("python", str(script.relative_to(ROOT)), *session.posargs)


@nox.session(venv_backend="none")
def gpu_tests(session: nox.Session) -> None:
    """The gpu-marked tests in the current interpreter; they skip cleanly without CUDA."""
    env = {"CRAFT_GPU_TESTS": "1", **os.environ}
    session.run(
        "python",
        "-m",
        "pytest",
        *[f"packages/{p}/tests" for p in PACKAGES],
        "-m",
        "gpu",
        env=env,
    )
