"""A tiny random Qwen3-VL (with deepstack) that vLLM's CPU backend runs, saved like a real one.

craft-adapters' tiny Qwen3-VL has head size 16, which vLLM's CPU attention refuses: this
variant has head size 32 (text and vision) and the same hidden size as the tiny Qwen2.5-VL
(128), so one CRAFT checkpoint serves both. Processor and tokenizer are craft-adapters'
(`build_tiny_processor("qwen3_vl")`: per-frame timestamps, 96 x 96 frames = 3 x 3 merged
tokens per frame pair).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tiny
import torch

from craft_adapters.backbones._tiny import SPECIAL_IDS as IDS  # noqa: F401 - engine reads it

ARCH = "CraftQwen3VLForConditionalGeneration"
HIDDEN = 128
FRAME = 96
PER_PAIR = 9  # merged tokens per frame pair (3 x 3)
DTYPE = "float32"


def processor(kind: str = "qwen3_vl") -> Any:
    """craft-adapters' tiny processor of `kind` ("qwen3_vl", "qwen3_5"), images normalized as
    videos are (0.5, 0.5: `tiny.adapters_processor`)."""
    return tiny.adapters_processor(kind)


def config() -> Any:
    from craft_adapters.backbones.qwen3_vl import Qwen3VLAdapter

    cfg = tiny.adapters_config(Qwen3VLAdapter, head_dim=32)
    cfg.text_config.rope_parameters["mrope_section"] = [4, 6, 6]  # sums to head_dim / 2
    return cfg


def build(folder: str | Path, seed: int = 0) -> Path:
    """Save a tiny random Qwen3-VL (float32) + processor into `folder`; return it."""

    def loud(model: Any) -> list[torch.Tensor]:  # the main merger's and the deepstack ones'
        visual = model.model.visual
        return [m.linear_fc2.weight for m in [visual.merger, *visual.deepstack_merger_list]]

    return tiny.save_random(folder, config(), processor(), loud, seed)


def video(frames: int, seed: int) -> np.ndarray:
    """`[frames, FRAME, FRAME, 3]` uint8: the Qwen2.5-VL tests' moving blobs at this size."""
    return tiny.video(frames, seed, size=FRAME)


def video_tokens(frames: int) -> int:
    """N, the compressible video tokens of a `frames`-frame video."""
    return frames // 2 * PER_PAIR
