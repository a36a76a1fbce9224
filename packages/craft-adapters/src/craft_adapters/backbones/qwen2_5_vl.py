"""Qwen2.5-VL (`qwen2_5_vl`): one placeholder run per video, `second_per_grid_ts` time scaling."""

from __future__ import annotations

import torch

from craft_adapters.backbones._qwen import QwenAdapter
from craft_adapters.registry import register_backbone


@register_backbone
class Qwen25VLAdapter(QwenAdapter):
    """Positions: transformers' own `get_rope_index` (5.x behaviour, see the README).

    Coordinates: each video is one run of placeholders starting at position `s`; its M-RoPE
    rows are `(s + t_idx * tokens_per_second * second_per_grid, s + row, s + col)`, so
    `(t, h, w) = rows - s` with `s` = the height row of its first token.
    """

    model_types = ("qwen2_5_vl",)
    rope_index_takes_second_per_grid = True

    def _video_coords(self, pos: torch.Tensor) -> torch.Tensor:
        start = pos[1, 0]
        return (pos - start).T.contiguous()
