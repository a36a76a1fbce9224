"""A tiny random GLM-4.1V (`glm4v`) that vLLM's CPU backend runs, saved like a real one.

craft-adapters' tiny GLM-4.1V has head size 16, which vLLM's CPU attention refuses: this
variant has the tiny Qwen2.5-VL's hidden size 128 (one CRAFT checkpoint serves every test
backbone) with head size 64 (half of it rotary, as GLM's `partial_rotary_factor` 0.5), and
112 x 112 frames: 8 x 8 patches merged to 4 x 4 = 16 tokens per frame pair, each pair its own
`<|begin_of_image|> ... <|end_of_image|>` run followed by its timestamp. Processor and
tokenizer are craft-adapters' (`build_tiny_processor("glm4v")`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tiny

from craft_adapters.backbones._tiny import SPECIAL_IDS as IDS  # noqa: F401 - engine reads it

ARCH = "CraftGlm4vForConditionalGeneration"
HIDDEN = 128
FRAME = 112
PER_PAIR = 16  # merged tokens per frame pair (4 x 4)
DTYPE = "float32"


def processor() -> Any:
    """craft-adapters' tiny GLM-4.1V processor, images normalized as videos are
    (`tiny.adapters_processor`), room for 64 frames."""
    out = tiny.adapters_processor("glm4v")
    # the video processor's longest_edge bounds a whole video's pixels: room for 64 frames
    out.video_processor.size = {"shortest_edge": 28 * 28, "longest_edge": 64 * FRAME * FRAME}
    return out


def config() -> Any:
    from craft_adapters.backbones.glm4v import Glm4vAdapter

    cfg = tiny.adapters_config(
        Glm4vAdapter, num_attention_heads=2, num_key_value_heads=1, head_dim=64
    )
    cfg.text_config.rope_parameters["mrope_section"] = [4, 6, 6]  # half of the 32 rotary dims
    cfg.vision_config.image_size = FRAME
    return cfg


def build(folder: str | Path, seed: int = 0) -> Path:
    """Save a tiny random GLM-4.1V (float32) + processor into `folder`; return it."""
    return tiny.save_random(
        folder, config(), processor(), lambda m: [m.model.visual.merger.down_proj.weight], seed
    )


def video(frames: int, seed: int) -> np.ndarray:
    """`[frames, FRAME, FRAME, 3]` uint8: the Qwen2.5-VL tests' moving blobs at this size."""
    return tiny.video(frames, seed, size=FRAME)


def video_tokens(frames: int) -> int:
    """N, the compressible video tokens of a `frames`-frame video."""
    return (frames + 1) // 2 * PER_PAIR


def timestamps(frames: int, fps: float) -> list[float]:
    """The group seconds GLM-4.1V's processor writes for `frames` frames sampled at `fps`
    (read back from its prompt: the text after each `<|end_of_image|>`)."""
    import re

    from craft_adapters import build_inputs

    inputs = build_inputs(processor(), video(frames, seed=0), fps, "")
    text = processor().tokenizer.decode(inputs["input_ids"][0])
    return [float(s) for s in re.findall(r"<\|end_of_image\|>(\d+)", text)]
