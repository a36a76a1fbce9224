"""CRAFT variant of vLLM's Qwen2.5-VL: `CraftQwen2_5_VLForConditionalGeneration`.

Three hooks of vLLM's video pruning (the ones its EVS uses), nothing else changed:

- the processor reserves `floor(N / ratio)` placeholders per video (`_get_prompt_updates`);
- `embed_multimodal` runs the vision tower, then CRAFT on each video's `[N, D]` rows, and
  appends each kept row's original `(t, h, w)` (`positions.py`); the runner recomputes the
  sequence's M-RoPE positions from them;
- `get_mrope_input_positions` gives the text after a video the positions it has
  uncompressed, so prefix-cached prompts need no encoder run to be right.

Images pass through uncompressed (with position columns, as the runner expects of every
item once pruning is on). A video that arrives already compressed (`precompressed.py`: the
threshold mode) skips the vision tower and CRAFT: its K rows are placed at their coords.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.models.qwen2_5_vl import (
    Qwen2_5_VLDummyInputsBuilder,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLMultiModalProcessor,
    Qwen2_5_VLProcessingInfo,
)
from vllm.multimodal import MULTIMODAL_REGISTRY

from craft_vllm.common import CraftModel, CraftProcessor
from craft_vllm.payload import PayloadFormat
from craft_vllm.positions import grid_positions, prompt_positions, pruned_position_columns
from craft_vllm.precompressed import PayloadFields, PayloadProcessingInfo, PayloadVideoInput

ARCHITECTURE = "CraftQwen2_5_VLForConditionalGeneration"
PAYLOAD = PayloadFormat("qwen2_5_vl", merge=2, seconds_positions=True)
"""Payloads: `video_grid_thw` in patches (2 x 2 merge), temporal positions scaled by
`second_per_grid_ts` (`tokens_per_second` per second)."""


class CraftQwen2_5_VLMultiModalProcessor(
    PayloadFields, CraftProcessor, Qwen2_5_VLMultiModalProcessor
):
    """Reserves `floor(N / ratio)` `<|video_pad|>` per video (N = the video's merged tokens)."""

    architecture = ARCHITECTURE

    def craft_placeholder(self, item: Any, kept: int) -> list[int]:
        return [self.info.get_hf_config().video_token_id] * kept


class CraftQwen2_5_VLProcessingInfo(PayloadProcessingInfo, Qwen2_5_VLProcessingInfo):
    """Qwen2.5-VL's, with a parser that also takes compressed videos (precompressed.py)."""

    payload_format = PAYLOAD


@MULTIMODAL_REGISTRY.register_processor(
    CraftQwen2_5_VLMultiModalProcessor,
    info=CraftQwen2_5_VLProcessingInfo,
    dummy_inputs=Qwen2_5_VLDummyInputsBuilder,
)
class CraftQwen2_5_VLForConditionalGeneration(
    PayloadVideoInput, CraftModel, Qwen2_5_VLForConditionalGeneration
):
    """Qwen2.5-VL whose video tokens go through a CRAFT checkpoint at a fixed ratio."""

    architecture = ARCHITECTURE

    def _postprocess_image_embeds_evs(
        self, image_embeds_split: tuple[torch.Tensor, ...], image_input: Any
    ) -> tuple[torch.Tensor, ...]:
        merge = self.visual.spatial_merge_size
        out = []
        for emb, (t, h, w) in zip(image_embeds_split, image_input["image_grid_thw"].tolist()):
            grid = grid_positions(t, h // merge, w // merge)
            every = torch.arange(grid.shape[1])
            cols = pruned_position_columns(grid, every).to(emb.device, emb.dtype)
            out.append(torch.cat([emb, cols], dim=1))
        return tuple(out)

    def _postprocess_video_embeds_evs(
        self, video_embeds_split: tuple[torch.Tensor, ...], video_input: Any
    ) -> tuple[torch.Tensor, ...]:
        """Each video `[N, D]` -> `[floor(N / ratio), D + 4]` (CRAFT rows + position columns),
        every video of the forward in one CRAFT call; a compressed video's `[K, D]` rows are
        placed at their coords as they are."""
        merge = self.visual.spatial_merge_size
        seconds = video_input.get("second_per_grid_ts")
        per_second = float(getattr(self.config.vision_config, "tokens_per_second", 1.0))
        sizes = [(t, h // merge, w // merge) for t, h, w in video_input["video_grid_thw"].tolist()]
        grids = []
        for i, size in enumerate(sizes):
            factor = per_second * (float(seconds[i]) if seconds is not None else 1.0)
            grids.append(grid_positions(*size, factor))
        given = getattr(video_input, "craft_coords", None)
        if given is not None:  # already compressed: kept_index from the (t, h, w)
            kept = [(c[:, 0] * h + c[:, 1]) * w + c[:, 2] for c, (_, h, w) in zip(given, sizes)]
            rows = list(video_embeds_split)
        else:
            coords = [torch.from_numpy(g).T.to(e.device) for g, e in zip(grids, video_embeds_split)]
            results = self.craft_compress(list(video_embeds_split), coords)
            kept = [r.kept_index for r in results]
            rows = [r.features.to(e.dtype) for r, e in zip(results, video_embeds_split)]
        out = []
        for emb, grid, index in zip(rows, grids, kept):
            cols = pruned_position_columns(grid, index).to(emb.device, emb.dtype)
            out.append(torch.cat([emb, cols], dim=1))
        return tuple(out)

    def get_mrope_input_positions(
        self, input_tokens: list[int], mm_features: list[Any]
    ) -> tuple[torch.Tensor, int]:
        items = []
        ordered = sorted(mm_features, key=lambda f: f.mm_position.offset)
        for feature, (offset, t, h, w, factor) in zip(ordered, self.iter_mm_grid_thw(ordered)):
            items.append((offset, feature.mm_position.length, grid_positions(t, h, w, factor)))
        return prompt_positions(len(input_tokens), items)
