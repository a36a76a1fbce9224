"""The entry point lmms-eval loads: one `ModelManifest` per backbone, generated from the
craft-adapters registry (each backbone's adapter names the lmms-eval classes it extends,
`BackboneAdapter.lmms_classes`).

lmms-eval 0.7.3 (`lmms_eval/models/__init__.py`, `_initialize_model_registry`) calls
`ModelRegistryV2.load_entrypoint_manifests("lmms_eval.models")`, which accepts a callable
returning manifests. Each `craft_<model_type>` names a chat class (lmms-eval prefers it) and a
simple class (`--force_simple`), subclasses of lmms-eval's own classes for that backbone
(`craft_eval.lmms.models`); either may be missing where the backbone's adapter says so.

`ROUTED`: backbones whose lmms-eval class cannot take a video as it is (GLM-4.1V: lmms-eval
0.7.3's `GLM4V` hands a video file to the processor as an IMAGE, so no video would reach the
compressor): their plugin class is written in `craft_eval.lmms.models` with the route the
class lacks, under the name the generated classes follow (`plugin_class_name`).
"""

from __future__ import annotations

from typing import Any

from craft_adapters.registry import LmmsClasses, adapter_classes

MODELS_MODULE = "craft_eval.lmms.models"
ROUTED: dict[str, LmmsClasses] = {
    "craft_glm4v": LmmsClasses(lmms_id="glm4v", simple="simple.glm4v:GLM4V"),
}
"""plugin model id -> the lmms-eval classes it extends, for the backbones whose plugin class
adds a video route (`craft_eval.lmms.models.CraftGLM4V`), not generated."""


def plugin_class_name(spec: str | None, chat: bool) -> str | None:
    """`"simple.qwen3_vl:Qwen3_VL"` -> `"CraftQwen3_VL"` (`"CraftQwen3_VLChat"` for a chat
    class): the name of the plugin's subclass in `craft_eval.lmms.models`."""
    if spec is None:
        return None
    return f"Craft{spec.rpartition(':')[2]}{'Chat' if chat else ''}"


def plugin_specs(routed: bool = True) -> dict[str, LmmsClasses]:
    """plugin model id (`craft_<model_type>`) -> the lmms-eval classes it extends: those the
    registry names, and (`routed`) the `ROUTED` ones."""
    specs = {
        f"craft_{cls.model_types[0]}": cls.lmms_classes
        for cls in adapter_classes()
        if cls.lmms_classes is not None
    }
    return {**specs, **ROUTED} if routed else specs


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
