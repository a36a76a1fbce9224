"""A tiny random InternVL (HF format, `internvl`) that vLLM's CPU backend runs, saved like a
real one.

craft-adapters' tiny InternVL has head size 16, which vLLM's CPU attention refuses: this
variant has the tiny Qwen2.5-VL's hidden size 128 (one CRAFT checkpoint serves every test
backbone) with head size 64. Tiles are craft-adapters' 112 x 112 (8 x 8 patches of 14 px,
pixel-shuffled to 4 x 4 = 16 tokens per frame); processor and tokenizer are craft-adapters'
(`build_tiny_processor("internvl")`). vLLM serves HF-format InternVL with its
`InternS1ForConditionalGeneration` (registry: `InternVLForConditionalGeneration`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tiny

from craft_adapters.backbones._tiny import SPECIAL_IDS as IDS  # noqa: F401 - engine reads it

ARCH = "CraftInternVLForConditionalGeneration"
HIDDEN = 128
FRAME = 112
PER_FRAME = 16  # tokens per frame after the pixel shuffle (4 x 4)
DTYPE = "float32"


def processor() -> Any:
    from craft_adapters.tiny import build_tiny_processor

    return build_tiny_processor("internvl")


def config() -> Any:
    from craft_adapters.backbones.internvl import InternVLAdapter

    cfg = InternVLAdapter.tiny_config()
    text = cfg.text_config
    text.hidden_size, text.intermediate_size = HIDDEN, 256
    text.num_attention_heads, text.num_key_value_heads, text.head_dim = 2, 1, 64
    # untied, as the real checkpoints: the tied head (scaled by 8 in `tiny.save_random`) gave
    # one token a margin of 13-16 nats at every step, whatever the video
    cfg.tie_word_embeddings = text.tie_word_embeddings = False
    return cfg


def build(folder: str | Path, seed: int = 0) -> Path:
    """Save a tiny random InternVL (float32) + processor into `folder`; return it."""
    return tiny.save_random(
        folder,
        config(),
        processor(),
        lambda m: [m.model.multi_modal_projector.linear_2.weight],
        seed,
    )


def video(frames: int, seed: int) -> np.ndarray:
    """`[frames, FRAME, FRAME, 3]` uint8: the Qwen2.5-VL tests' moving blobs."""
    return tiny.video(frames, seed, size=FRAME)


def video_tokens(frames: int) -> int:
    """N, the compressible video tokens of a `frames`-frame video."""
    return frames * PER_FRAME
