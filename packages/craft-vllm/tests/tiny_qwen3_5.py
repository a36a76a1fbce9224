"""A tiny random Qwen3.5 (hybrid: Gated DeltaNet + full attention) that vLLM's CPU backend
runs, saved like a real one.

craft-adapters' tiny Qwen3.5 has hidden size 64: this variant has the tiny Qwen2.5-VL's 128
(one CRAFT checkpoint serves every test backbone) and head size 32 for the full-attention
layers (vLLM's CPU attention takes 32, 64, 80, ...), 128 for the
linear-attention ones (what vLLM's CPU Gated DeltaNet kernel takes). Processor and tokenizer are
craft-adapters' (`build_tiny_processor("qwen3_5")`: per-frame timestamps, 96 x 96 frames =
3 x 3 merged tokens per frame pair), images normalized as videos are (see tiny_qwen3.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tiny
import torch

from craft_adapters.backbones._tiny import SPECIAL_IDS as IDS  # noqa: F401 - engine reads it

ARCH = "CraftQwen3_5ForConditionalGeneration"
HIDDEN = 128
FRAME = 96
PER_PAIR = 9  # merged tokens per frame pair (3 x 3)
DTYPE = "bfloat16"  # vLLM's CPU Gated DeltaNet kernel runs bfloat16 only


def processor() -> Any:
    from craft_adapters.tiny import build_tiny_processor

    out = build_tiny_processor("qwen3_5")
    out.image_processor.image_mean = list(out.video_processor.image_mean)
    out.image_processor.image_std = list(out.video_processor.image_std)
    return out


def config() -> Any:
    from craft_adapters.backbones.qwen3_5 import Qwen35Adapter

    cfg = Qwen35Adapter.tiny_config()
    text, vision = cfg.text_config, cfg.vision_config
    text.hidden_size, text.intermediate_size = HIDDEN, 256
    # vLLM's CPU Gated DeltaNet kernel (`chunk_gated_delta_rule_cpu`) refuses 16 ("multiples
    # of 32") and 32 ("Unexpected head dim size"); 128 is the real checkpoints' size
    text.linear_key_head_dim = text.linear_value_head_dim = 128
    vision.hidden_size, vision.intermediate_size, vision.out_hidden_size = 64, 128, HIDDEN
    return cfg


def build(folder: str | Path, seed: int = 0) -> Path:
    """Save a tiny random Qwen3.5 (float32) + processor into `folder`; return it."""
    from transformers import AutoModelForImageTextToText

    folder = Path(folder)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config(), dtype=torch.float32)
        # Louder video rows: at a random init they are too small for the greedy tokens to
        # depend on them, and no test could tell compressions apart.
        with torch.no_grad():
            model.model.visual.merger.linear_fc2.weight.mul_(8.0)
    model.save_pretrained(folder)
    processor().save_pretrained(folder)
    return folder


def video(frames: int, seed: int) -> np.ndarray:
    """`[frames, FRAME, FRAME, 3]` uint8: the Qwen2.5-VL tests' moving blobs at this size."""
    return tiny.video(frames, seed, size=FRAME)


def video_tokens(frames: int) -> int:
    """N, the compressible video tokens of a `frames`-frame video."""
    return frames // 2 * PER_PAIR
