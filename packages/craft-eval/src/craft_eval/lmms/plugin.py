"""The entry point lmms-eval loads: one `ModelManifest` per backbone.

lmms-eval 0.7.3 (`lmms_eval/models/__init__.py`, `_initialize_model_registry`) calls
`ModelRegistryV2.load_entrypoint_manifests("lmms_eval.models")`, which accepts a callable
returning manifests. Each `craft_<backbone>` names a chat class (lmms-eval prefers it) and a
simple class (`--force_simple`), subclasses of lmms-eval's own classes for that backbone
(`craft_eval.lmms.models`).
"""

from __future__ import annotations

from typing import Any

BACKBONES: dict[str, str] = {
    # plugin model id -> lmms-eval model id whose classes it extends
    "craft_qwen2_5_vl": "qwen2_5_vl",
    "craft_qwen3_vl": "qwen3_vl",
    "craft_qwen3_5": "qwen3_5",
    "craft_llava_onevision": "llava_hf",
}

_CLASSES: dict[str, tuple[str, str | None]] = {
    # plugin model id -> (simple class, chat class) in craft_eval.lmms.models
    "craft_qwen2_5_vl": ("CraftQwen2_5_VL", "CraftQwen2_5_VLChat"),
    "craft_qwen3_vl": ("CraftQwen3_VL", "CraftQwen3_VLChat"),
    "craft_qwen3_5": ("CraftQwen3_5", "CraftQwen3_5Chat"),
    # simple only: lmms-eval 0.7.3's chat `llava_hf` hands the processor `images=[]` for a
    # video-only request, which transformers 5 rejects (IndexError in the image processor)
    "craft_llava_onevision": ("CraftLlavaHf", None),
}


def manifests() -> list[Any]:
    """lmms-eval `ModelManifest`s of the plugin's models (imports lmms-eval's registry only)."""
    from lmms_eval.models.registry_v2 import ModelManifest

    module = "craft_eval.lmms.models"
    return [
        ModelManifest(
            model_id=model_id,
            simple_class_path=f"{module}.{simple}",
            chat_class_path=f"{module}.{chat}" if chat else None,
        )
        for model_id, (simple, chat) in _CLASSES.items()
    ]
