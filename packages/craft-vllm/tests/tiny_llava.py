"""A tiny random LLaVA-OneVision that vLLM's CPU backend runs, saved like a real one.

craft-adapters' tiny LLaVA-OneVision has head size 16 and 56 x 56 frames (2 x 2 pooled rows):
this variant has the tiny Qwen2.5-VL's hidden size 128 (one CRAFT checkpoint serves every
test backbone) with head size 64, a SigLIP of head size 32 and 112 x 112 frames: 8 x 8
patches pooled to 4 x 4 = 16 rows per frame, + one newline row per video. Processor and
tokenizer are craft-adapters' (`build_tiny_processor("llava_onevision")`) at that size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tiny

from craft_adapters.backbones._tiny import SPECIAL_IDS as IDS  # noqa: F401 - engine reads it

ARCH = "CraftLlavaOnevisionForConditionalGeneration"
HIDDEN = 128
FRAME = 112
PER_FRAME = 16  # pooled rows per frame (4 x 4)
DTYPE = "float32"
# vLLM 0.32's own LLaVA-OneVision fails when one encoder call gets videos of different lengths
# (README, vLLM bug 6): the unmodified model is served one request at a time
UNCOMPRESSED_ENGINE = {"max_num_seqs": 1}


def processor() -> Any:
    from craft_adapters.tiny import build_tiny_processor

    out = build_tiny_processor("llava_onevision")
    size = {"height": FRAME, "width": FRAME}
    out.image_processor.size = out.video_processor.size = size
    out.image_processor.image_grid_pinpoints = [[FRAME, FRAME]]
    out.num_image_tokens = (FRAME // 14) ** 2
    return out


def config() -> Any:
    from craft_adapters.backbones.llava_onevision import LlavaOnevisionAdapter

    cfg = LlavaOnevisionAdapter.tiny_config()
    text, vision = cfg.text_config, cfg.vision_config
    text.hidden_size, text.intermediate_size = HIDDEN, 256
    text.num_attention_heads, text.num_key_value_heads = 2, 1
    vision.hidden_size, vision.intermediate_size, vision.image_size = 64, 128, FRAME
    vision.vision_use_head = False  # the real checkpoints have no pooling head
    cfg.image_grid_pinpoints = [[FRAME, FRAME]]
    return cfg


def build(folder: str | Path, seed: int = 0) -> Path:
    """Save a tiny random LLaVA-OneVision (float32) + processor into `folder`; return it."""
    tiny.save_random(
        folder,
        config(),
        processor(),
        lambda m: [m.model.multi_modal_projector.linear_2.weight],
        seed,
    )
    _real_vision_names(Path(folder) / "model.safetensors")
    return Path(folder)


def _real_vision_names(path: Path) -> None:
    """Rename the SigLIP weights as the real checkpoints have them (`vision_tower.vision_model.`:
    what vLLM's loader expects; transformers 5 saves them as `vision_tower.`)."""
    from safetensors.torch import load_file, save_file

    weights = load_file(path)
    out = {}
    for name, value in weights.items():
        if name.startswith("vision_tower."):
            name = "vision_tower.vision_model." + name.removeprefix("vision_tower.")
        out[name] = value
    save_file(out, path, metadata={"format": "pt"})


def video(frames: int, seed: int) -> np.ndarray:
    """`[frames, FRAME, FRAME, 3]` uint8: the Qwen2.5-VL tests' moving blobs."""
    return tiny.video(frames, seed, size=FRAME)


def video_tokens(frames: int) -> int:
    """N, the compressible video tokens of a `frames`-frame video."""
    return frames * PER_FRAME
