"""CRAFT variant of vLLM's LLaVA-OneVision: `CraftLlavaOnevisionForConditionalGeneration`.

A video is `F x P x P` pooled SigLIP rows (raster order over frame, row, column) + ONE
`image_newline` row. CRAFT compresses the grid rows only; the newline always survives, last.
The language model uses 1-D RoPE: kept rows keep their ORIGINAL position (their index in
the uncompressed placeholder), served on vLLM's M-RoPE machinery as `flat.py` describes
(shared with InternVL). vLLM's LLaVA-OneVision has no pruning hook, so the variant brings its
own: the processor reserves `floor(N / ratio) + 1` placeholders (N = `F * P * P`), and
`embed_multimodal` returns CRAFT's rows, the newline row and each row's original index.

Images pass through uncompressed (their rows get their own indices).

A video that arrives ALREADY compressed (`precompressed.py`, the threshold mode: a payload of
K grid rows, their `(frame, row, column)` coords and the `(F, P, P)` grid, as craft-adapters'
`compress_videos` writes it) skips the vision tower and CRAFT: the processor reserves K + 1
placeholders, and the rows get the served model's own newline row after them and their
original indices (`t * P * P + h * P + w`; the newline `F * P * P`), as above.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from vllm.model_executor.models.interfaces import SupportsMRoPE, SupportsMultiModalPruning
from vllm.model_executor.models.llava_onevision import (
    LlavaOnevisionDummyInputsBuilder,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionMultiModalProcessor,
    LlavaOnevisionProcessingInfo,
)
from vllm.multimodal import MULTIMODAL_REGISTRY

from craft_adapters.registry import frame_grid_coords
from craft_vllm.common import CraftModel, CraftProcessor
from craft_vllm.flat import (
    FlatPositions,
    PayloadInput,
    grid_tokens,
    index_columns,
    payload_input,
)
from craft_vllm.payload import PayloadFormat
from craft_vllm.precompressed import PayloadFields, PayloadProcessingInfo

ARCHITECTURE = "CraftLlavaOnevisionForConditionalGeneration"
PAYLOAD = PayloadFormat("llava_onevision", merge=1, flat=True)
"""Payloads: `video_grid_thw` the `(F, P, P)` pooled grid itself, 1-D positions."""


def pooled_side(hf_config: Any) -> int:
    """P, the side of a frame's pooled grid (vLLM's and craft-adapters' `ceil(S / 2)`)."""
    vision = hf_config.vision_config
    return -(-(vision.image_size // vision.patch_size) // 2)


class CraftLlavaOnevisionMultiModalProcessor(
    PayloadFields, CraftProcessor, LlavaOnevisionMultiModalProcessor
):
    """Reserves `floor(N / ratio)` kept rows + the newline per video (a payload: K + 1)."""

    architecture = ARCHITECTURE

    def craft_video_tokens(self, item: Any, hf_processor_mm_kwargs: Mapping[str, Any]) -> int:
        side = pooled_side(self.info.get_hf_config())
        return int(item["pixel_values_videos"].data.shape[0]) * side * side

    def craft_placeholder(self, item: Any, kept: int) -> list[int]:
        return [self.info.get_hf_config().video_token_index] * (kept + 1)


class CraftLlavaOnevisionProcessingInfo(PayloadProcessingInfo, LlavaOnevisionProcessingInfo):
    """LLaVA-OneVision's, with a parser that also takes compressed videos (precompressed.py)."""

    payload_format = PAYLOAD

    def craft_frame_side(self) -> int:
        return pooled_side(self.get_hf_config())


@MULTIMODAL_REGISTRY.register_processor(
    CraftLlavaOnevisionMultiModalProcessor,
    info=CraftLlavaOnevisionProcessingInfo,
    dummy_inputs=LlavaOnevisionDummyInputsBuilder,
)
class CraftLlavaOnevisionForConditionalGeneration(
    FlatPositions,
    CraftModel,
    LlavaOnevisionForConditionalGeneration,
    SupportsMRoPE,
    SupportsMultiModalPruning,
):
    """LLaVA-OneVision whose video grid rows go through a CRAFT checkpoint at a fixed ratio."""

    architecture = ARCHITECTURE

    def _parse_and_validate_video_input(self, **kwargs: Any) -> Any:
        payload = payload_input(kwargs)
        return super()._parse_and_validate_video_input(**kwargs) if payload is None else payload

    def _payload_rows(self, inputs: PayloadInput) -> list[torch.Tensor]:
        """Each compressed video's `[K, D]` rows -> `[K + 1, D + 2]`: its rows, the served
        model's newline row, each row's original index (`index_columns`)."""
        newline = self.image_newline[None]
        out = []
        for rows, index, (t, h, w) in inputs.videos():
            rows = torch.cat([rows.to(newline.device, newline.dtype), newline])
            index = torch.cat([index, index.new_tensor([t * h * w])]).to(rows.device)
            out.append(torch.cat([rows, index_columns(index, rows.dtype)], dim=1))
        return out

    def _process_video_pixels(self, inputs: Any) -> list[torch.Tensor]:
        """vLLM's `[F * P * P + 1, D]` per video -> `[floor(N / ratio) + 1, D + 2]`: CRAFT's
        rows (every video of the forward in one call), the newline, each row's original index
        (`index_columns`); a payload's rows as they arrived (`_payload_rows`)."""
        if isinstance(inputs, PayloadInput):
            return self._payload_rows(inputs)
        side = pooled_side(self.config)
        videos = [v.reshape(-1, v.shape[-1]) for v in super()._process_video_pixels(inputs)]
        grids = [v[:-1] for v in videos]  # the newline row, last, is not compressed
        coords = [frame_grid_coords(int(g.shape[0]), side, g.device) for g in grids]
        out = []
        for video, result in zip(videos, self.craft_compress(grids, coords)):
            n = int(video.shape[0]) - 1
            rows = torch.cat([result.features.to(video.dtype), video[n:]])
            index = torch.cat(
                [result.kept_index.to(video.device), result.kept_index.new_tensor([n])]
            )
            out.append(torch.cat([rows, index_columns(index, rows.dtype)], dim=1))
        return out

    def _process_image_input(self, image_input: Any) -> list[torch.Tensor]:
        """vLLM's image rows, each with its own index (the runner expects the columns of
        every item once pruning is on)."""
        out = []
        for image in super()._process_image_input(image_input):
            image = image.reshape(-1, image.shape[-1])
            index = torch.arange(image.shape[0], device=image.device)
            out.append(torch.cat([image, index_columns(index, image.dtype)], dim=1))
        return out

    def craft_media_ids(self) -> tuple[int, ...]:
        return (self.config.video_token_index, self.config.image_token_index)

    def craft_full_length(self, feature: Any) -> int:
        """F * P * P grid rows + the newline row (raw frames or a payload's grid)."""
        n = grid_tokens(feature)
        if n is None:
            side = pooled_side(self.config)
            n = int(feature.data["pixel_values_videos"].data.shape[0]) * side * side
        return n + 1
