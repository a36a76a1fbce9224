"""Qwen3.5 (`qwen3_5`): Qwen3-VL's token layout, hybrid Gated-DeltaNet LLM, no deepstack."""

from __future__ import annotations

from typing import Any

import torch

from craft_adapters.backbones._qwen import QwenAdapter
from craft_adapters.backbones._tiny import mrope, qwen3_vision, qwen_token_ids, text_common
from craft_adapters.backbones.qwen3_vl import qwen3_tiny_processor, timestamp_coords
from craft_adapters.registry import InputRules, LmmsClasses, register_backbone


@register_backbone
class Qwen35Adapter(QwenAdapter):
    """Multi-turn sessions copy the whole cache (`copy.deepcopy`): the linear-attention
    (conv + recurrent) states cannot be cropped back to the video prefix."""

    model_types = ("qwen3_5",)
    attention_output_gate = True  # its full-attention layers gate their output
    # lmms-eval 0.7.3's per-frame bounds: models/simple/qwen3_5.py (Qwen3_5.__init__)
    input_rules = InputRules(
        processors=("Qwen3_5Processor",),
        video_metadata=True,
        frame_bounds=True,
        lmms_pixels={
            "min_pixels": 64 * 32 * 32,
            "max_pixels": 128 * 32 * 32,
            "total_pixels": 224 * 1024 * 32 * 32,
        },
    )
    reference_archs = (("qwen3_5-4b", "qwen3.5-4b"),)
    lmms_classes = LmmsClasses(
        "qwen3_5", simple="simple.qwen3_5:Qwen3_5", chat="chat.qwen3_5:Qwen3_5"
    )
    tiny_processor = staticmethod(qwen3_tiny_processor)

    def _video_coords(self, pos: torch.Tensor) -> torch.Tensor:
        return timestamp_coords(pos)

    @staticmethod
    def tiny_config() -> Any:
        """A tiny random config of this backbone (`craft_adapters.tiny.build_tiny_vlm`)."""
        from transformers import Qwen3_5Config

        text = {
            **text_common(),
            "num_hidden_layers": 4,
            "head_dim": 32,
            "partial_rotary_factor": 0.25,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "rope_parameters": mrope([2, 1, 1], mrope_interleaved=True, partial_rotary_factor=0.25),
        }
        vision = qwen3_vision()
        return Qwen3_5Config(text_config=text, vision_config=vision, **qwen_token_ids())
