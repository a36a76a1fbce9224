"""Qwen2.5-VL (`qwen2_5_vl`): one placeholder run per video, `second_per_grid_ts` time scaling."""

from __future__ import annotations

from typing import Any

import torch

from craft_adapters.backbones._qwen import QwenAdapter, tiny_qwen_processor
from craft_adapters.backbones._tiny import QWEN_TEMPLATE, mrope, qwen_token_ids, text_common
from craft_adapters.registry import InputRules, LmmsClasses, register_backbone


@register_backbone
class Qwen25VLAdapter(QwenAdapter):
    """Positions: transformers' own `get_rope_index` (5.x behaviour, see the README), or with
    `position_rule="original"` Qwen's original rule (`text_after_media_at_max`).

    Coordinates: each video is one run of placeholders starting at position `s`; its M-RoPE
    rows are `(s + t_idx * tokens_per_second * second_per_grid, s + row, s + col)`, so
    `(t, h, w) = rows - s` with `s` = the height row of its first token.
    """

    model_types = ("qwen2_5_vl",)
    rope_index_takes_second_per_grid = True
    # frames are resized per frame only when a bound is given; the fps goes in the metadata
    # (5.x reads second_per_grid_ts from its sampled fps)
    input_rules = InputRules(
        processors=("Qwen2_5_VLProcessor", "Qwen2VLProcessor"),
        video_metadata=True,
        frame_bounds=True,
    )
    reference_archs = (("qwen2_5_vl-7b", "qwen2.5-vl-7b"),)
    lmms_classes = LmmsClasses(
        "qwen2_5_vl", simple="simple.qwen2_5_vl:Qwen2_5_VL", chat="chat.qwen2_5_vl:Qwen2_5_VL"
    )

    original_rule_differs = True  # transformers 5.x: text after a video at s + max(h, w)

    def full_positions(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        positions, deltas = super().full_positions(inputs)
        if self.position_rule == "original":
            mask = inputs.get("attention_mask")
            if mask is None:
                mask = torch.ones_like(inputs["input_ids"])
            positions, deltas = text_after_media_at_max(
                positions, inputs["mm_token_type_ids"], mask
            )
        return positions, deltas

    def _video_coords(self, pos: torch.Tensor) -> torch.Tensor:
        start = pos[1, 0]
        return (pos - start).T.contiguous()

    @staticmethod
    def tiny_config() -> Any:
        """A tiny random config of this backbone (`craft_adapters.tiny.build_tiny_vlm`)."""
        from transformers import Qwen2_5_VLConfig

        text = {
            **text_common(),
            "rope_parameters": mrope([2, 3, 3]),
        }
        vision = {
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": 64,
            "window_size": 56,
            "fullatt_block_indexes": [1],
            "tokens_per_second": 2,
        }
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **qwen_token_ids())

    @staticmethod
    def tiny_processor() -> Any:
        """The in-memory processor of `tiny_config`'s model (`build_tiny_processor`)."""
        from transformers import Qwen2_5_VLProcessor, Qwen2VLVideoProcessor

        size = {"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 64}
        return tiny_qwen_processor(
            Qwen2_5_VLProcessor, Qwen2VLVideoProcessor, QWEN_TEMPLATE, 14, (size, size)
        )


def text_after_media_at_max(
    positions: torch.Tensor, token_types: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2.5-VL's original position rule applied to transformers 5.x's M-RoPE rows.

    transformers 5.x starts the text after an image or video at `start + max(h, w)`; Qwen's
    own code (and vLLM) start it at `max(positions of that item) + 1`. For an image the two
    agree; for a video whose temporal rows run past its width they do not. Each item's rows
    are kept; everything after it moves by the difference.

    Args:
        positions: `[3, B, L]` rows from `get_rope_index`.
        token_types: `[B, L]` `mm_token_type_ids` (0 text, 1 image, 2 video).
        mask: `[B, L]` attention mask (padding keeps its rows).

    -> (`[3, B, L]` positions, `[B, 1]` rope deltas: max position + 1 - valid length).
    """
    out = positions.clone()
    deltas = []
    for b in range(out.shape[1]):
        valid = mask[b].bool().nonzero().squeeze(1)
        types = token_types[b, valid].tolist()
        pos = out[:, b, valid]  # [3, n] (a copy: written back below)
        shift = 0
        i = 0
        while i < len(types):
            j = i
            while j < len(types) and types[j] == types[i]:
                j += 1
            pos[:, i:j] += shift
            if types[i] != 0 and j < len(types):  # the next run starts right after this item
                shift = int(pos[:, i:j].max()) + 1 - int(pos[0, j])
            i = j
        out[:, b, valid] = pos
        deltas.append(int(pos.max()) + 1 - len(types) if len(types) else 0)
    return out, torch.tensor(deltas, device=positions.device).unsqueeze(1)
