"""Qwen3-VL (`qwen3_vl`): per-frame timestamps between placeholder runs, and deepstack."""

from __future__ import annotations

import copy
from typing import Any

import torch

from craft_adapters.backbones._qwen import QwenAdapter, group_mean
from craft_adapters.backbones._tiny import mrope, qwen3_vision, qwen_token_ids, text_common
from craft_adapters.registry import register_backbone


def timestamp_coords(pos: torch.Tensor) -> torch.Tensor:
    """`(t, h, w)` of a Qwen3-VL / Qwen3.5 video from its M-RoPE rows `pos` [3, n].

    Every temporal group k is its own run starting at position `s_k` (text timestamps sit
    between runs); its rows are `(s_k, s_k + row, s_k + col)`. So `h = rows[1] - rows[0]`,
    `w = rows[2] - rows[0]` and `t = rows[0] - s_0`: the temporal offset in the model's own
    position units.
    """
    t = pos[0] - pos[0, 0]
    h = pos[1] - pos[0]
    w = pos[2] - pos[0]
    return torch.stack([t, h, w], dim=-1)


@register_backbone
class Qwen3VLAdapter(QwenAdapter):
    """Deepstack policy: each deepstack layer's per-video rows are shrunk with the SAME
    assignment as the main features: the row of a kept token is the mean of the deepstack rows
    of every original token that was merged into it (a token that absorbed nothing keeps its
    own row exactly). transformers then adds them at the kept positions after the first LLM
    layers, as for an uncompressed video.
    """

    model_types = ("qwen3_vl",)

    def _video_coords(self, pos: torch.Tensor) -> torch.Tensor:
        return timestamp_coords(pos)

    def shrink_video_output(
        self,
        output: Any,
        kept_rows: list[torch.Tensor],
        new_features: list[torch.Tensor],
        assignments: list[torch.Tensor],
    ) -> Any:
        new = copy.copy(output)
        new.pooler_output = tuple(new_features)
        deep = getattr(output, "deepstack_features", None)
        if deep is not None:
            new.deepstack_features = [
                tuple(
                    group_mean(rows, assign, int(kept.shape[0]))
                    for rows, assign, kept in zip(layer, assignments, kept_rows)
                )
                for layer in deep
            ]
        return new

    @staticmethod
    def tiny_config() -> Any:
        """A tiny random config of this backbone (`craft_adapters.tiny.build_tiny_vlm`)."""
        from transformers import Qwen3VLConfig

        text = {
            **text_common(),
            "head_dim": 16,
            "rope_parameters": mrope([2, 3, 3], mrope_interleaved=True),
        }
        vision = {**qwen3_vision(), "deepstack_visual_indexes": [0]}
        return Qwen3VLConfig(text_config=text, vision_config=vision, **qwen_token_ids())
