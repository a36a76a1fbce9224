"""The pieces every backbone's tiny random config shares (`BackboneAdapter.tiny_config`):
byte-level special-token ids, a 2-layer text model, the Qwen token ids and vision tower.
`craft_adapters.tiny` builds the models and processors from them."""

from __future__ import annotations

from typing import Any

TINY_VOCAB_SIZE = 300
"""Vocabulary size of every tiny model (256 byte tokens + special tokens)."""

# Special tokens, with fixed ids after the 256 byte-level tokens.
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<image>",
    "<video>",
]
SPECIAL_IDS = {tok: 256 + i for i, tok in enumerate(SPECIAL_TOKENS)}


def qwen3_vision() -> dict[str, Any]:
    """Tiny vision tower shared by Qwen3-VL and Qwen3.5 (patch 16, 2x2 merge)."""
    return {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 64,
        "num_position_embeddings": 64,
    }


def text_common() -> dict[str, Any]:
    return {
        "vocab_size": TINY_VOCAB_SIZE,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "pad_token_id": SPECIAL_IDS["<|endoftext|>"],
        "eos_token_id": SPECIAL_IDS["<|im_end|>"],
        "bos_token_id": None,
    }


def mrope(section: list[int], theta: float = 10000.0, **extra: Any) -> dict[str, Any]:
    """`rope_parameters` of a Qwen text model: multimodal RoPE, `section` = the (t, h, w)
    split of half the head's rotary dimensions."""
    return {"rope_type": "default", "rope_theta": theta, "mrope_section": section, **extra}


def qwen_token_ids() -> dict[str, Any]:
    return {
        "image_token_id": SPECIAL_IDS["<|image_pad|>"],
        "video_token_id": SPECIAL_IDS["<|video_pad|>"],
        "vision_start_token_id": SPECIAL_IDS["<|vision_start|>"],
        "vision_end_token_id": SPECIAL_IDS["<|vision_end|>"],
    }
