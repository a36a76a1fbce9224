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
    videos are (0.5, 0.5).

    vLLM 0.32 normalizes pixels on the device with ONE mean/std for images and videos
    (`build_mm_input_norm`, read from the image processor); the real Qwen3-VL and Qwen3.5
    checkpoints use 0.5 / 0.5 for both, craft-adapters' tiny image processor keeps CLIP's.
    """
    from craft_adapters.tiny import build_tiny_processor

    out = build_tiny_processor(kind)
    out.image_processor.image_mean = list(out.video_processor.image_mean)
    out.image_processor.image_std = list(out.video_processor.image_std)
    return out


def config() -> Any:
    from craft_adapters.backbones.qwen3_vl import Qwen3VLAdapter

    cfg = Qwen3VLAdapter.tiny_config()
    text, vision = cfg.text_config, cfg.vision_config
    text.hidden_size, text.head_dim, text.intermediate_size = HIDDEN, 32, 256
    text.rope_parameters["mrope_section"] = [4, 6, 6]  # sums to head_dim / 2
    vision.hidden_size, vision.intermediate_size, vision.out_hidden_size = 64, 128, HIDDEN
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
