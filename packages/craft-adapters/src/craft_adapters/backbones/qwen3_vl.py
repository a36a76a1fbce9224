"""Qwen3-VL (`qwen3_vl`): per-frame timestamps between placeholder runs, and deepstack."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from craft_adapters.backbones._qwen import QwenAdapter, tiny_qwen_processor
from craft_adapters.backbones._tiny import (
    QWEN3_TEMPLATE,
    mrope,
    qwen3_vision,
    qwen_token_ids,
    text_common,
)
from craft_adapters.registry import InputRules, LmmsClasses, register_backbone
from craft_adapters.splice import group_mean


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


def qwen3_tiny_processor() -> Any:
    """The tiny Qwen3-VL processor (Qwen3.5 uses Qwen3-VL's processor too): per-frame
    timestamps, patch 16, 2 x 2 merge."""
    from transformers import Qwen3VLProcessor, Qwen3VLVideoProcessor

    # longest_edge is a pixel budget for the WHOLE video: 64 frames of 96 x 96 fit.
    vsize = {"shortest_edge": 32 * 32, "longest_edge": 96 * 96 * 64}
    isize = {"shortest_edge": 32 * 32, "longest_edge": 96 * 96}
    return tiny_qwen_processor(
        Qwen3VLProcessor, Qwen3VLVideoProcessor, QWEN3_TEMPLATE, 16, (isize, vsize), min_frames=1
    )


@register_backbone
class Qwen3VLAdapter(QwenAdapter):
    """Deepstack policy: each deepstack layer's per-video rows are shrunk with the SAME
    assignment as the main features: the row of a kept token is the mean of the deepstack rows
    of every original token that was merged into it (a token that absorbed nothing keeps its
    own row exactly). transformers then adds them at the kept positions after the first LLM
    layers, as for an uncompressed video.
    """

    model_types = ("qwen3_vl",)
    # transformers' video processor reads `size` as a budget for the WHOLE video; frames are
    # resized per frame instead, by default with lmms-eval 0.7.3's bounds
    # (models/simple/qwen3_vl.py, Qwen3_VL.__init__)
    input_rules = InputRules(
        processors=("Qwen3VLProcessor",),
        video_metadata=True,
        frame_bounds=True,
        lmms_pixels={"min_pixels": 256 * 28 * 28, "max_pixels": 1605632, "total_pixels": None},
    )
    lmms_classes = LmmsClasses(
        "qwen3_vl", simple="simple.qwen3_vl:Qwen3_VL", chat="chat.qwen3_vl:Qwen3_VL"
    )

    def _video_coords(self, pos: torch.Tensor) -> torch.Tensor:
        return timestamp_coords(pos)

    def shrink_video_output(
        self,
        output: Any,
        kept_rows: list[torch.Tensor],
        new_features: list[torch.Tensor],
        assignments: list[torch.Tensor],
    ) -> Any:
        new = super().shrink_video_output(output, kept_rows, new_features, assignments)
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

    def route_lm_visual_rows(self, lm: Any, select: Callable[..., Any]) -> Callable[[], None]:
        """The deepstack rows transformers adds after the first decoder layers
        (`_deepstack_process(hidden, visual_pos_masks, rows)`), through `select` first."""
        own = lm._deepstack_process
        lm._deepstack_process = lambda h, m, e: own(h, *select(h, m, e))
        return lambda: lm.__dict__.pop("_deepstack_process", None)

    def deepstack_rows(self, output: Any, video: int) -> torch.Tensor | None:
        """The kept tokens' deepstack rows of video `video` (`shrink_video_output`'s),
        level after level: `[K, levels * D]`; None without deepstack rows."""
        deep = getattr(output, "deepstack_features", None)
        if not deep:
            return None
        return torch.cat([level[video] for level in deep], 1)

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

    tiny_processor = staticmethod(qwen3_tiny_processor)
