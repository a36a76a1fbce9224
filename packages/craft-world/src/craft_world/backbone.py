"""The world's backbone: a ~1M-parameter Qwen2.5-VL and its processor, built from config classes.

Spatial merge 1, patch 14, temporal patch 2: a clip of 8 frames of 84 x 84 is
4 x 6 x 6 = 144 video tokens of width 128 (the language model's hidden size). The tokenizer
and chat template are `craft_adapters.tiny`'s (byte-level, 300 ids); only the sizes differ.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["VIDEO_TOKENS", "world_config", "world_processor"]

VIDEO_TOKENS = 144
"""Video tokens of one clip: 4 temporal pairs x 6 x 6 patches."""

MODEL_TYPE = "qwen2_5_vl"
"""The backbone's transformers `config.model_type` (its craft-adapters registry key)."""


def world_config() -> Any:
    """The `Qwen2_5_VLConfig` of the world backbone: craft-adapters' tiny Qwen2.5-VL (its
    tokenizer's ids, vision tower depth and windows) at the world's sizes (text: hidden 128,
    4 layers; vision: spatial merge 1, output 128)."""
    from craft_adapters.registry import adapter_class

    cfg = adapter_class(MODEL_TYPE).tiny_config()  # the registry's adapter, by model_type
    text, vision = cfg.text_config, cfg.vision_config
    text.hidden_size, text.intermediate_size, text.num_hidden_layers = 128, 256, 4
    text.layer_types = ["full_attention"] * 4  # set from num_hidden_layers at init only
    text.rope_parameters["mrope_section"] = [4, 6, 6]  # head_dim 32 -> 16 rotary pairs (t, h, w)
    vision.hidden_size, vision.intermediate_size = 64, 128
    vision.spatial_merge_size, vision.out_hidden_size = 1, 128
    return cfg


def world_processor() -> Any:
    """The backbone's processor: craft-adapters' tiny Qwen2.5-VL processor (byte-level
    tokenizer, chat template) with patch merge 1.

    A frame larger than 84 x 84 is resized down to at most 84 x 84 pixels (multiples of 14).
    """
    from craft_adapters.tiny import build_tiny_processor

    processor = build_tiny_processor(world_config().model_type)
    for part in (processor.image_processor, processor.video_processor):
        part.size = {"shortest_edge": 14 * 14 * 4, "longest_edge": 84 * 84}
        part.merge_size = 1
    return processor


def new_backbone(seed: int) -> Any:
    """A freshly initialised world backbone (float32, seeded)."""
    from transformers import AutoModelForImageTextToText

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AutoModelForImageTextToText.from_config(world_config(), dtype=torch.float32)
