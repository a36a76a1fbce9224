"""The entry point lmms-eval loads: one `ModelManifest` per backbone, generated from the
craft-adapters registry (each backbone's adapter names the lmms-eval classes it extends,
`BackboneAdapter.lmms_classes`).

lmms-eval 0.7.3 (`lmms_eval/models/__init__.py`, `_initialize_model_registry`) calls
`ModelRegistryV2.load_entrypoint_manifests("lmms_eval.models")`, which accepts a callable
returning manifests. Each `craft_<model_type>` names a chat class (lmms-eval prefers it) and a
simple class (`--force_simple`), subclasses of lmms-eval's own classes for that backbone
(`craft_eval.lmms.models`); either may be missing where the backbone's adapter says so.
"""

from __future__ import annotations

from typing import Any

from craft_adapters.registry import LmmsClasses, adapter_classes

MODELS_MODULE = "craft_eval.lmms.models"


def plugin_class_name(spec: str | None, chat: bool) -> str | None:
    """`"simple.qwen3_vl:Qwen3_VL"` -> `"CraftQwen3_VL"` (`"CraftQwen3_VLChat"` for a chat
    class): the name of the plugin's subclass in `craft_eval.lmms.models`."""
    if spec is None:
        return None
    return f"Craft{spec.rpartition(':')[2]}{'Chat' if chat else ''}"


def plugin_specs() -> dict[str, LmmsClasses]:
    """plugin model id (`craft_<model_type>`) -> the lmms-eval classes it extends."""
    return {
        f"craft_{cls.model_types[0]}": cls.lmms_classes
        for cls in adapter_classes()
        if cls.lmms_classes is not None
    }


BACKBONES: dict[str, str] = {pid: spec.lmms_id for pid, spec in plugin_specs().items()}
"""plugin model id -> lmms-eval model id whose classes it extends."""


def manifests() -> list[Any]:
    """lmms-eval `ModelManifest`s of the plugin's models (imports lmms-eval's registry only)."""
    from lmms_eval.models.registry_v2 import ModelManifest

    out = []
    for model_id, spec in plugin_specs().items():
        simple = plugin_class_name(spec.simple, chat=False)
        chat = plugin_class_name(spec.chat, chat=True)
        out.append(
            ModelManifest(
                model_id=model_id,
                simple_class_path=f"{MODELS_MODULE}.{simple}" if simple else None,
                chat_class_path=f"{MODELS_MODULE}.{chat}" if chat else None,
            )
        )
    return out
