"""Qwen3.5 (`qwen3_5`): Qwen3-VL's token layout, hybrid Gated-DeltaNet LLM, no deepstack."""

from __future__ import annotations

import torch

from craft_adapters.backbones._qwen import QwenAdapter
from craft_adapters.backbones.qwen3_vl import timestamp_coords
from craft_adapters.registry import register_backbone


@register_backbone
class Qwen35Adapter(QwenAdapter):
    """Multi-turn sessions copy the whole cache (`copy.deepcopy`): the linear-attention
    (conv + recurrent) states cannot be cropped back to the video prefix."""

    model_types = ("qwen3_5",)

    def _video_coords(self, pos: torch.Tensor) -> torch.Tensor:
        return timestamp_coords(pos)
