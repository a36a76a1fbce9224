"""craft-vllm: CRAFT inside vLLM, as a `vllm.general_plugins` plugin.

    vllm serve Qwen/Qwen2.5-VL-7B-Instruct --hf-overrides '{"architectures":
        ["CraftQwen2_5_VLForConditionalGeneration"], "craft_checkpoint": "runs/craft",
        "craft_ratio": 8}'

Installing the package is enough: vLLM finds the plugin through its entry point. Nothing
here imports vLLM at import time.
"""

from craft_vllm.options import CraftConfigError, CraftOptions, read_options

__version__ = "0.5.0"

__all__ = ["CraftConfigError", "CraftOptions", "read_options"]
