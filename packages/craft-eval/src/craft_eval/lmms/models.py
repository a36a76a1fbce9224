"""The plugin's model classes: lmms-eval 0.7.3's own class for each backbone, with
`CraftLMMixin` in front (frame sampling, chat template, prompt, batching and generation
settings stay lmms-eval's; only the language model's input is compressed).

| plugin id | lmms-eval classes extended |
| --- | --- |
| craft_qwen2_5_vl | `models/simple/qwen2_5_vl.py:Qwen2_5_VL`, `models/chat/qwen2_5_vl.py:Qwen2_5_VL` |
| craft_qwen3_vl | `models/simple/qwen3_vl.py:Qwen3_VL`, `models/chat/qwen3_vl.py:Qwen3_VL` |
| craft_qwen3_5 | `models/simple/qwen3_5.py:Qwen3_5`, `models/chat/qwen3_5.py:Qwen3_5` |
| craft_llava_onevision | `models/simple/llava_hf.py:LlavaHf` (its chat class fails on video-only requests) |

Importing this module imports lmms-eval (install `craft-eval[lmms]`).
"""

from __future__ import annotations

from lmms_eval.models.chat.qwen2_5_vl import Qwen2_5_VL as _Qwen2_5_VLChat
from lmms_eval.models.chat.qwen3_5 import Qwen3_5 as _Qwen3_5Chat
from lmms_eval.models.chat.qwen3_vl import Qwen3_VL as _Qwen3_VLChat
from lmms_eval.models.simple.llava_hf import LlavaHf as _LlavaHf
from lmms_eval.models.simple.qwen2_5_vl import Qwen2_5_VL as _Qwen2_5_VL
from lmms_eval.models.simple.qwen3_5 import Qwen3_5 as _Qwen3_5
from lmms_eval.models.simple.qwen3_vl import Qwen3_VL as _Qwen3_VL

from craft_eval.lmms.compress import CraftLMMixin


class CraftQwen2_5_VL(CraftLMMixin, _Qwen2_5_VL):
    """lmms-eval's `qwen2_5_vl` (simple) with a compressor."""


class CraftQwen2_5_VLChat(CraftLMMixin, _Qwen2_5_VLChat):
    """lmms-eval's `qwen2_5_vl` (chat) with a compressor."""

    is_simple = False


class CraftQwen3_VL(CraftLMMixin, _Qwen3_VL):
    """lmms-eval's `qwen3_vl` (simple) with a compressor."""


class CraftQwen3_VLChat(CraftLMMixin, _Qwen3_VLChat):
    """lmms-eval's `qwen3_vl` (chat) with a compressor."""

    is_simple = False


class CraftQwen3_5(CraftLMMixin, _Qwen3_5):
    """lmms-eval's `qwen3_5` (simple) with a compressor."""


class CraftQwen3_5Chat(CraftLMMixin, _Qwen3_5Chat):
    """lmms-eval's `qwen3_5` (chat) with a compressor."""

    is_simple = False


class CraftLlavaHf(CraftLMMixin, _LlavaHf):
    """lmms-eval's `llava_hf` (simple; LLaVA-OneVision checkpoints) with a compressor."""
