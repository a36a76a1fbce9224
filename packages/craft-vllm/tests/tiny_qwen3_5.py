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

import tiny
import tiny_qwen3

from craft_adapters.backbones._tiny import SPECIAL_IDS as IDS  # noqa: F401 - engine reads it

# Qwen3-VL's frames and tokens (96 x 96 frames, 3 x 3 merged tokens per frame pair): the same
# processor rules, so the same videos and counts
FRAME, PER_PAIR = tiny_qwen3.FRAME, tiny_qwen3.PER_PAIR
video, video_tokens = tiny_qwen3.video, tiny_qwen3.video_tokens

ARCH = "CraftQwen3_5ForConditionalGeneration"
HIDDEN = 128
DTYPE = "bfloat16"  # vLLM's CPU Gated DeltaNet kernel runs bfloat16 only


def processor() -> Any:
    return tiny_qwen3.processor("qwen3_5")


def config() -> Any:
    from craft_adapters.backbones.qwen3_5 import Qwen35Adapter

    # vLLM's CPU Gated DeltaNet kernel (`chunk_gated_delta_rule_cpu`) refuses 16 ("multiples
    # of 32") and 32 ("Unexpected head dim size"); 128 is the real checkpoints' size
    return tiny.adapters_config(Qwen35Adapter, linear_key_head_dim=128, linear_value_head_dim=128)


def build(folder: str | Path, seed: int = 0) -> Path:
    """Save a tiny random Qwen3.5 (float32) + processor into `folder`; return it."""
    return tiny.save_random(
        folder, config(), processor(), lambda m: [m.model.visual.merger.linear_fc2.weight], seed
    )
