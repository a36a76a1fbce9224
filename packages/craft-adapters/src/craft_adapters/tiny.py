"""Tiny, randomly initialised VLMs of every supported backbone, for tests and demos.

`build_tiny_vlm(model_type, save_dir)` builds a model from the backbone's own tiny config
(`BackboneAdapter.tiny_config`, in its module under `backbones/`; sizes from
`docs/backbones.md`: vocab 300, hidden 64, 2 layers, ...), saves it with
`save_pretrained`, loads it back with `from_pretrained` (the same loading code as a real
checkpoint) and returns it with a processor built in memory (no hub access): a byte-level
`Qwen2Tokenizer` with the backbone's special tokens, the backbone's video processor with an
explicit `size`, and a chat template shaped like the real checkpoint's.

Everything runs on a CPU in well under a second per forward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from craft_adapters.backbones._tiny import SPECIAL_IDS as _SPECIAL_IDS
from craft_adapters.backbones._tiny import SPECIAL_TOKENS as _SPECIAL_TOKENS
from craft_adapters.backbones._tiny import TINY_VOCAB_SIZE

__all__ = ["TINY_FRAME_SIZE", "TINY_VOCAB_SIZE", "build_tiny_processor", "build_tiny_vlm"]

TINY_FRAME_SIZE = 96
"""Frame side (pixels) that the tiny Qwen processors keep unchanged: 96 = 3 x 32 = 3.4 x 28."""

# Chat templates shaped like those of the real checkpoints (system prompt left out).
_QWEN_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_QWEN3_TEMPLATE = (  # Qwen3-VL / Qwen3.5: the processor inserts per-frame timestamps itself
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'video' %}<|video_pad|>"
    "{% elif item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_LLAVA_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }} "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'video' %}<video>\n"
    "{% elif item['type'] == 'image' %}<image>\n"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<|im_end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable unicode character map (the alphabet of byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("\u00a1"), ord("\u00ac") + 1)) + list(
        range(ord("\u00ae"), ord("\u00ff") + 1)
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def _byte_vocab() -> dict[str, int]:
    chars = _bytes_to_unicode()
    vocab = {chars[b]: b for b in range(256)}
    vocab.update(_SPECIAL_IDS)
    return vocab


def _tiny_tokenizer(chat_template: str) -> Any:
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer(vocab=_byte_vocab(), merges=[], chat_template=chat_template)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in _SPECIAL_TOKENS])
    tok.pad_token = "<|endoftext|>"
    tok.eos_token = "<|im_end|>"
    for t in _SPECIAL_TOKENS:
        if tok.convert_tokens_to_ids(t) != _SPECIAL_IDS[t]:  # pragma: no cover - sanity
            raise RuntimeError(f"tiny tokenizer put {t} at the wrong id")
    return tok


def _tiny_config(model_type: str) -> Any:
    """The backbone's own tiny config (`BackboneAdapter.tiny_config`, in its module)."""
    from craft_adapters.registry import adapter_class, supported_model_types

    try:
        return adapter_class(model_type).tiny_config()
    except (KeyError, NotImplementedError):
        raise ValueError(
            f"no tiny model for model_type {model_type!r}; supported: {supported_model_types()}"
        ) from None


def build_tiny_processor(model_type: str) -> Any:
    """The in-memory processor matching `build_tiny_vlm(model_type, ...)`'s model."""
    if model_type == "qwen2_5_vl":
        from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

        size = {"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 64}
        return Qwen2_5_VLProcessor(
            image_processor=Qwen2VLImageProcessor(size=size, patch_size=14, merge_size=2),
            tokenizer=_tiny_tokenizer(_QWEN_TEMPLATE),
            video_processor=Qwen2VLVideoProcessor(
                size=size,
                patch_size=14,
                merge_size=2,
                temporal_patch_size=2,
                cap_pixels_per_frame=False,
            ),
            chat_template=_QWEN_TEMPLATE,
        )
    if model_type in ("qwen3_vl", "qwen3_5"):
        from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

        # longest_edge is a pixel budget for the WHOLE video: 64 frames of 96 x 96 fit.
        vsize = {"shortest_edge": 32 * 32, "longest_edge": 96 * 96 * 64}
        isize = {"shortest_edge": 32 * 32, "longest_edge": 96 * 96}
        return Qwen3VLProcessor(
            image_processor=Qwen2VLImageProcessor(size=isize, patch_size=16, merge_size=2),
            tokenizer=_tiny_tokenizer(_QWEN3_TEMPLATE),
            video_processor=Qwen3VLVideoProcessor(
                size=vsize,
                patch_size=16,
                merge_size=2,
                temporal_patch_size=2,
                cap_pixels_per_frame=False,
                min_frames=1,
            ),
            chat_template=_QWEN3_TEMPLATE,
        )
    if model_type == "llava_onevision":
        from transformers import (
            LlavaOnevisionImageProcessor,
            LlavaOnevisionProcessor,
            LlavaOnevisionVideoProcessor,
        )

        return LlavaOnevisionProcessor(
            image_processor=LlavaOnevisionImageProcessor(
                size={"height": 56, "width": 56}, image_grid_pinpoints=[[56, 56]]
            ),
            tokenizer=_tiny_tokenizer(_LLAVA_TEMPLATE),
            video_processor=LlavaOnevisionVideoProcessor(size={"height": 56, "width": 56}),
            chat_template=_LLAVA_TEMPLATE,
            num_image_tokens=16,
            vision_feature_select_strategy="full",
        )
    from craft_adapters.registry import supported_model_types

    raise ValueError(
        f"no tiny processor for model_type {model_type!r}; supported: {supported_model_types()}"
    )


def build_tiny_vlm(model_type: str, save_dir: str | Path, seed: int = 0) -> tuple[Any, Any]:
    """Build, save and reload a tiny random VLM of `model_type`; return `(model, processor)`.

    Args:
        model_type: a transformers `config.model_type` of a supported backbone
            (`craft_adapters.supported_model_types()`).
        save_dir: folder the model and its processor are saved to with `save_pretrained`
            (created if missing); the returned model is loaded back from it with
            `from_pretrained`, and `AutoProcessor.from_pretrained(save_dir)` loads the processor.
        seed: torch seed of the random initialisation.

    Returns:
        `(model, processor)`: the float32 model in eval mode on the CPU, and its processor.
    """
    from transformers import AutoModelForImageTextToText

    config = _tiny_config(model_type)
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.save_pretrained(save_dir)
    processor = build_tiny_processor(model_type)
    processor.save_pretrained(save_dir)  # the folder loads like a real checkpoint (AutoProcessor)
    loaded = AutoModelForImageTextToText.from_pretrained(save_dir, dtype=torch.float32)
    loaded.eval()
    return loaded, processor
