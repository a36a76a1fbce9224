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


def world_config() -> Any:
    """The `Qwen2_5_VLConfig` of the world backbone (text: hidden 128, 4 layers)."""
    from transformers import Qwen2_5_VLConfig

    from craft_adapters.tiny import TINY_VOCAB_SIZE, build_tiny_processor

    tok = build_tiny_processor("qwen2_5_vl").tokenizer
    ids = {t: tok.convert_tokens_to_ids(t) for t in tok.all_special_tokens}
    ids.update(
        {
            t: tok.convert_tokens_to_ids(t)
            for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
        }
    )
    text = {
        "vocab_size": TINY_VOCAB_SIZE,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "pad_token_id": tok.pad_token_id,
        "eos_token_id": tok.eos_token_id,
        "bos_token_id": None,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [4, 6, 6],  # head_dim 32 -> 16 rotary pairs (t, h, w)
        },
    }
    vision = {
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "patch_size": 14,
        "spatial_merge_size": 1,
        "temporal_patch_size": 2,
        "out_hidden_size": 128,
        "window_size": 56,
        "fullatt_block_indexes": [1],
        "tokens_per_second": 2,
    }
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )


def world_processor() -> Any:
    """The backbone's processor: tiny byte-level tokenizer, merge-1 video processor.

    A frame larger than 84 x 84 is resized down to at most 84 x 84 pixels (multiples of 14).
    """
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    from craft_adapters.tiny import build_tiny_processor

    tiny = build_tiny_processor("qwen2_5_vl")
    size = {"shortest_edge": 14 * 14 * 4, "longest_edge": 84 * 84}
    return Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=size, patch_size=14, merge_size=1),
        tokenizer=tiny.tokenizer,
        video_processor=Qwen2VLVideoProcessor(
            size=size,
            patch_size=14,
            merge_size=1,
            temporal_patch_size=2,
            cap_pixels_per_frame=False,
        ),
        chat_template=tiny.chat_template,
    )


def new_backbone(seed: int) -> Any:
    """A freshly initialised world backbone (float32, seeded)."""
    from transformers import AutoModelForImageTextToText

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AutoModelForImageTextToText.from_config(world_config(), dtype=torch.float32)
