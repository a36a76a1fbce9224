"""Tiny, randomly initialised VLMs of every supported backbone, for tests and demos.

`build_tiny_vlm(model_type, save_dir)` builds a model from the backbone's own tiny config
(`BackboneAdapter.tiny_config`, in its module under `backbones/`; sizes from
`docs/backbones.md`: vocab 300, hidden 64, 2 layers, ...), saves it with
`save_pretrained`, loads it back with `from_pretrained` (the same loading code as a real
checkpoint) and returns it with a processor built in memory (no hub access; the backbone's
`BackboneAdapter.tiny_processor`): a byte-level `Qwen2Tokenizer` with the backbone's special
tokens, the backbone's video processor with an explicit `size`, and a chat template shaped
like the real checkpoint's.

Everything runs on a CPU in well under a second per forward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from craft_adapters.backbones._tiny import TINY_FRAME_SIZE, TINY_VOCAB_SIZE

__all__ = ["TINY_FRAME_SIZE", "TINY_VOCAB_SIZE", "build_tiny_processor", "build_tiny_vlm"]


def _tiny(model_type: str, what: str) -> Any:
    """The backbone's own tiny `config` or `processor` (`BackboneAdapter.tiny_config`,
    `.tiny_processor`, in its module under `backbones/`)."""
    from craft_adapters.registry import adapter_class, supported_model_types

    try:
        return getattr(adapter_class(model_type), f"tiny_{what}")()
    except (KeyError, NotImplementedError):
        raise ValueError(
            f"no tiny {'model' if what == 'config' else what} for model_type {model_type!r}; "
            f"supported: {supported_model_types()}"
        ) from None


def build_tiny_processor(model_type: str) -> Any:
    """The in-memory processor matching `build_tiny_vlm(model_type, ...)`'s model."""
    return _tiny(model_type, "processor")


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

    config = _tiny(model_type, "config")
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
