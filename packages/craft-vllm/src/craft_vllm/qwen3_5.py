"""CRAFT variant of vLLM's Qwen3.5: `CraftQwen3_5ForConditionalGeneration`.

vLLM's Qwen3.5 class is Qwen3-VL's (same vision tower, same per-frame video runs, same
processor) with a hybrid language model (Gated DeltaNet + full attention layers) and no
deepstack, so the CRAFT variant is Qwen3-VL's (`qwen3_vl.py`) on Qwen3.5's class: the same
placeholder, compression, rebuilt frame runs and prompt positions. Videos compressed
beforehand (`precompressed.py`, the threshold mode) are served too: the payload also carries
the T frame timestamps, and its K rows are laid out per frame from their coords.

On vLLM's CPU backend the Gated DeltaNet layers run in bfloat16 only (`cpu_gdn_attention_core`
asserts it): serve with `dtype="bfloat16"` there.
"""

from __future__ import annotations

from vllm.model_executor.models import qwen3_5
from vllm.model_executor.models.qwen3_5 import (
    Qwen3_5ForConditionalGeneration,
    Qwen3_5ProcessingInfo,
)
from vllm.model_executor.models.qwen3_vl import Qwen3VLDummyInputsBuilder
from vllm.multimodal import MULTIMODAL_REGISTRY

from craft_vllm.payload import PayloadFormat
from craft_vllm.precompressed import PayloadProcessingInfo
from craft_vllm.qwen3_vl import (
    CraftQwen3VLForConditionalGeneration,
    CraftQwen3VLMultiModalProcessor,
    patch_positions_factor,
)

ARCHITECTURE = "CraftQwen3_5ForConditionalGeneration"
PAYLOAD = PayloadFormat("qwen3_5", merge=2, frame_runs=2)
"""Payloads: Qwen3-VL's, without deepstack columns."""

patch_positions_factor(qwen3_5)  # Qwen3.5 imports vLLM's rule by name


class CraftQwen3_5MultiModalProcessor(CraftQwen3VLMultiModalProcessor):
    """Qwen3-VL's CRAFT placeholder (all kept tokens in frame 0's run; a compressed video's
    K likewise, its rows laid out per frame when embedded)."""

    architecture = ARCHITECTURE


class CraftQwen3_5ProcessingInfo(PayloadProcessingInfo, Qwen3_5ProcessingInfo):
    """Qwen3.5's, with a parser that also takes compressed videos (precompressed.py)."""

    payload_format = PAYLOAD


@MULTIMODAL_REGISTRY.register_processor(
    CraftQwen3_5MultiModalProcessor,
    info=CraftQwen3_5ProcessingInfo,
    dummy_inputs=Qwen3VLDummyInputsBuilder,
)
class CraftQwen3_5ForConditionalGeneration(
    CraftQwen3VLForConditionalGeneration, Qwen3_5ForConditionalGeneration
):
    """Qwen3.5 whose video tokens go through a CRAFT checkpoint at a fixed ratio (Qwen3-VL's
    CRAFT methods; vLLM's Qwen3.5 `__init__`, language model and weights)."""

    architecture = ARCHITECTURE
