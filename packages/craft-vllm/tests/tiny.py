"""A tiny random Qwen2.5-VL that vLLM's CPU backend runs (head size 64), saved like a real one.

craft-adapters' tiny models have head size 16, which vLLM's CPU attention refuses (it takes
32, 64, 80, ...): this variant has hidden size 128 with 2 heads. The folder holds the
weights, config, tokenizer (byte-level, no hub access) and processor config, so both
`vllm.LLM(folder)` and transformers' `from_pretrained(folder)` load it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ARCH = "CraftQwen2_5_VLForConditionalGeneration"
VOCAB = 300
HIDDEN = 128
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"]
SPECIAL += ["<|image_pad|>", "<|video_pad|>"]
IDS = {tok: 256 + i for i, tok in enumerate(SPECIAL)}
TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] in ('video', 'video_url') %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif item['type'] in ('image', 'image_url') %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
FRAME = 112  # 112 = 4 x 28: kept as is by the processor, 4 x 4 merged tokens per frame pair


def _byte_vocab() -> dict[str, int]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): b for b, c in zip(bs, cs)}
    vocab.update(IDS)
    return vocab


def processor(frame: int = FRAME) -> Any:
    from tokenizers import AddedToken
    from transformers import (
        Qwen2_5_VLProcessor,
        Qwen2Tokenizer,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    tok = Qwen2Tokenizer(vocab=_byte_vocab(), merges=[], chat_template=TEMPLATE)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.pad_token, tok.eos_token = "<|endoftext|>", "<|im_end|>"
    size = {"shortest_edge": 28 * 28, "longest_edge": frame * frame}
    kwargs = {"size": size, "patch_size": 14, "merge_size": 2}
    return Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(**kwargs),
        tokenizer=tok,
        video_processor=Qwen2VLVideoProcessor(
            **kwargs, temporal_patch_size=2, cap_pixels_per_frame=False
        ),
        chat_template=TEMPLATE,
    )


def config(**text_sizes: Any) -> Any:
    """The tiny config; `text_sizes` replace the language model's (hidden_size, layers, ...)."""
    from transformers import Qwen2_5_VLConfig

    text = {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 4096,
        "pad_token_id": IDS["<|endoftext|>"],
        "eos_token_id": IDS["<|im_end|>"],
        "bos_token_id": None,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [8, 12, 12],
        },
        **text_sizes,
    }
    vision = {
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": text["hidden_size"],
        "window_size": 56,
        "fullatt_block_indexes": [1],
        "tokens_per_second": 2,
    }
    ids = {
        k: IDS[v]
        for k, v in (
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
        )
    }
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)


def build(
    folder: str | Path,
    seed: int = 0,
    frame: int = FRAME,
    dtype: torch.dtype = torch.float32,
    **text_sizes: Any,
) -> Path:
    """Save a tiny random Qwen2.5-VL + processor (frames up to `frame` x `frame`) into
    `folder`; return it. `text_sizes`: see `config`."""
    cfg, proc = config(**text_sizes), processor(frame)
    return save_random(
        folder, cfg, proc, lambda m: [m.model.visual.merger.mlp[2].weight], seed, dtype
    )


def adapters_processor(kind: str) -> Any:
    """craft-adapters' tiny processor of `kind` ("qwen3_vl", "qwen3_5", "glm4v"), images
    normalized as videos are.

    vLLM 0.32 normalizes pixels on the device with ONE mean/std for images and videos
    (`build_mm_input_norm`, read from the image processor); the real Qwen3-VL, Qwen3.5 and
    GLM-4.1V checkpoints use one for both, craft-adapters' tiny image processor keeps CLIP's.
    """
    from craft_adapters.tiny import build_tiny_processor

    out = build_tiny_processor(kind)
    out.image_processor.image_mean = list(out.video_processor.image_mean)
    out.image_processor.image_std = list(out.video_processor.image_std)
    return out


def adapters_config(adapter: Any, **text_fields: Any) -> Any:
    """craft-adapters' tiny config of `adapter` (a backbone adapter class) at these tests'
    widths: the language model HIDDEN wide (MLP 256) with `text_fields` set on it (head
    sizes vLLM's CPU kernels take), the vision tower 64 wide (MLP 128) writing HIDDEN-wide
    rows, so one CRAFT checkpoint serves every test backbone."""
    cfg = adapter.tiny_config()
    text, vision = cfg.text_config, cfg.vision_config
    text.hidden_size, text.intermediate_size = HIDDEN, 256
    for key, value in text_fields.items():
        setattr(text, key, value)
    vision.hidden_size, vision.intermediate_size, vision.out_hidden_size = 64, 128, HIDDEN
    return cfg


def save_random(
    folder: str | Path,
    config: Any,
    processor: Any,
    loud: Callable[[Any], list[torch.Tensor]],
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Save a model of `config` initialised from `seed`, and `processor`, into `folder` (every
    tiny backbone of these tests is built here); return it.

    `loud(model)`: the weights that project the video rows into the language model, scaled by
    8: at a random init the rows are too small for the greedy tokens to depend on them, and
    then no test could tell two compressions apart. The output head is scaled by 8 too, so
    that greedy steps are not near-ties (a position rule off by a few steps changed no token
    of the unscaled model).
    """
    from transformers import AutoModelForImageTextToText

    folder = Path(folder)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, dtype=dtype)
        with torch.no_grad():
            for weight in [*loud(model), model.get_output_embeddings().weight]:
                weight.mul_(8.0)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def video(frames: int, seed: int, size: int = FRAME) -> np.ndarray:
    """`[frames, size, size, 3]` uint8: smooth random blobs that move (no exact ties)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=(8, 8, 3)).astype(np.float32)
    out = []
    for f in range(frames):
        shifted = np.roll(base, shift=f % 8, axis=1) + rng.normal(0, 12, size=(8, 8, 3))
        big = np.kron(shifted, np.ones((size // 8, size // 8, 1)))
        out.append(np.clip(big, 0, 255).astype(np.uint8))
    return np.stack(out)
