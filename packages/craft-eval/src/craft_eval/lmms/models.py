"""The plugin's model classes: lmms-eval 0.7.3's own class for each backbone, with
`CraftLMMixin` in front (frame sampling, chat template, prompt, batching and generation
settings stay lmms-eval's; only the language model's input is compressed).

The classes are generated from the craft-adapters registry: each backbone's adapter names
the lmms-eval classes it extends (`BackboneAdapter.lmms_classes`), and this module defines
`Craft<Class>` (simple) and `Craft<Class>Chat` (chat) for them, e.g.

| plugin id | classes here | lmms-eval classes extended (`lmms_eval/models/...`) |
| --- | --- | --- |
| craft_qwen2_5_vl | `CraftQwen2_5_VL`, `CraftQwen2_5_VLChat` | `{simple,chat}/qwen2_5_vl.py` |
| craft_qwen3_vl | `CraftQwen3_VL`, `CraftQwen3_VLChat` | `{simple,chat}/qwen3_vl.py:Qwen3_VL` |
| craft_qwen3_5 | `CraftQwen3_5`, `CraftQwen3_5Chat` | `{simple,chat}/qwen3_5.py:Qwen3_5` |
| craft_llava_onevision | `CraftLlavaHf` | `simple/llava_hf.py:LlavaHf` (its chat class fails) |
| craft_internvl | `CraftInternVLHfChat` | `chat/internvl_hf.py:InternVLHf` (no simple class) |

Importing this module imports lmms-eval (install `craft-eval[lmms]`).
"""

from __future__ import annotations

import importlib

from craft_eval.lmms.compress import CraftLMMixin
from craft_eval.lmms.plugin import plugin_class_name, plugin_specs

__all__: list[str] = []


def _extend(spec: str, chat: bool) -> type:
    """`CraftLMMixin` in front of the lmms-eval class `spec` (`"chat.qwen3_vl:Qwen3_VL"`)."""
    module, _, name = spec.partition(":")
    base = getattr(importlib.import_module(f"lmms_eval.models.{module}"), name)
    attrs: dict[str, object] = {
        "__module__": __name__,
        "__doc__": f"lmms-eval's `{name}` ({'chat' if chat else 'simple'}) with a compressor.",
    }
    if chat:
        attrs["is_simple"] = False
    return type(str(plugin_class_name(spec, chat)), (CraftLMMixin, base), attrs)


for _spec in plugin_specs().values():
    for _path, _chat in ((_spec.simple, False), (_spec.chat, True)):
        if _path is not None:
            _cls = _extend(_path, _chat)
            globals()[_cls.__name__] = _cls
            __all__.append(_cls.__name__)
