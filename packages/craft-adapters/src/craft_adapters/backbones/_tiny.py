"""The pieces every backbone's tiny random model and processor share
(`BackboneAdapter.tiny_config`, `.tiny_processor`): byte-level special-token ids and
tokenizer, chat templates, a 2-layer text model, the Qwen token ids and vision tower.
`craft_adapters.tiny` builds the models and processors through the registry."""

from __future__ import annotations

from typing import Any

TINY_FRAME_SIZE = 96
"""Frame side (pixels) that the tiny Qwen processors keep unchanged: 96 = 3 x 32 = 3.4 x 28."""

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


# Chat templates shaped like those of the real checkpoints (system prompt left out).
def chat_template(video: str, image: str, *, role_end: str = "\n", turn_end: str = "\n") -> str:
    """A chat template shaped like a real checkpoint's (system prompt left out): each
    message's video / image item written as `video` / `image`, `role_end` after the role,
    `<|im_end|>` + `turn_end` after each turn."""
    return (
        "{% for message in messages %}"
        f"<|im_start|>{{{{ message['role'] }}}}{role_end}"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for item in message['content'] %}"
        f"{{% if item['type'] == 'video' %}}{video}"
        f"{{% elif item['type'] == 'image' %}}{image}"
        "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
        "{% endfor %}{% endif %}"
        f"<|im_end|>{turn_end}"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


_QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
QWEN_TEMPLATE = chat_template("<|vision_start|><|video_pad|><|vision_end|>", _QWEN_IMAGE)
# Qwen3-VL / Qwen3.5: the processor inserts per-frame timestamps itself
QWEN3_TEMPLATE = chat_template("<|video_pad|>", _QWEN_IMAGE)
LLAVA_TEMPLATE = chat_template("<video>\n", "<image>\n", role_end=" ", turn_end="")


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


def _byte_vocab(special: dict[str, int]) -> dict[str, int]:
    chars = _bytes_to_unicode()
    vocab = {chars[b]: b for b in range(256)}
    vocab.update(special)
    return vocab


def extra_token_ids(tokens: list[str]) -> dict[str, int]:
    """Ids of a backbone's own special tokens: the shared ids, the new ones after them."""
    new = [tok for tok in dict.fromkeys(tokens) if tok not in SPECIAL_IDS]
    return {tok: len(SPECIAL_IDS) + 256 + i for i, tok in enumerate(new)}


def tiny_tokenizer(chat_template: str, extra: dict[str, str] | None = None) -> Any:
    """A byte-level `Qwen2Tokenizer` with the shared special tokens, then `extra`'s
    (attribute name -> token, e.g. InternVL's `start_image_token`; ids `extra_token_ids`)."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    extra = dict(extra or {})
    ids = {**SPECIAL_IDS, **extra_token_ids(list(extra.values()))}
    kwargs: dict[str, Any] = {"extra_special_tokens": extra} if extra else {}
    tok = Qwen2Tokenizer(vocab=_byte_vocab(ids), merges=[], chat_template=chat_template, **kwargs)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in ids])
    tok.pad_token = "<|endoftext|>"
    tok.eos_token = "<|im_end|>"
    for t, i in ids.items():
        if tok.convert_tokens_to_ids(t) != i:  # pragma: no cover - sanity
            raise RuntimeError(f"tiny tokenizer put {t} at the wrong id")
    return tok
