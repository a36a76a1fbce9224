"""What every CRAFT model class does around vLLM's own `__init__`: check, then attach.

`check_settings` runs before any weight is built (a bad setting fails in a second, not after
loading the backbone); `attach_compressor` loads the CRAFT checkpoint once the language
model's width is known.
"""

from __future__ import annotations

from typing import Any

from vllm.multimodal import MULTIMODAL_REGISTRY

from craft_vllm.options import (
    CraftConfigError,
    CraftOptions,
    kept_count,
    load_compressor,
    read_options,
)


def check_settings(vllm_config: Any, architecture: str) -> CraftOptions:
    """The checked options of `architecture`; refuse `--video-pruning-rate` and a ratio that
    leaves no token even for the largest video the server accepts."""
    model_config = vllm_config.model_config
    options = read_options(model_config.hf_config, architecture)
    mm_config = model_config.get_multimodal_config()
    if mm_config.video_pruning_rate:
        raise ValueError(
            f"--video-pruning-rate {mm_config.video_pruning_rate} cannot be combined with "
            f"{architecture}: CRAFT already sets the video token count (craft_ratio)"
        )
    info = MULTIMODAL_REGISTRY.create_processor(model_config).info
    largest = info.get_max_video_tokens(model_config.max_model_len, {"video": 1})
    try:
        kept_count(largest, options.ratio)
    except CraftConfigError as error:
        raise CraftConfigError(
            f"{error} (the largest video this server accepts has {largest} tokens)"
        ) from None
    return options


def attach_compressor(model: Any, vllm_config: Any) -> None:
    """Load `model.craft_options.checkpoint` into `model.craft`, checked against the LLM width.

    A plain attribute, not a submodule: vLLM's loader must not look for these weights in the
    backbone's checkpoint (the backbone's files are used as they are).
    """
    hidden = vllm_config.model_config.hf_config.get_text_config().hidden_size
    device = vllm_config.device_config.device
    compressor = load_compressor(model.craft_options, hidden, device=device)
    object.__setattr__(model, "craft", compressor)
    model.is_multimodal_pruning_enabled = True  # embed_multimodal post-processes items
