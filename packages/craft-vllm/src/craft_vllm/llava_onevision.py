"""CRAFT variant of vLLM's LLaVA-OneVision: `CraftLlavaOnevisionForConditionalGeneration`.

A video is `F x P x P` pooled SigLIP rows (raster order over frame, row, column) + ONE
`image_newline` row. CRAFT compresses the grid rows only; the newline always survives, last.
The language model uses 1-D RoPE, and craft-adapters gives every kept row its ORIGINAL
position (its index in the uncompressed placeholder) and the text after the video the
positions it has uncompressed. vLLM's LLaVA-OneVision has no pruning hook, so the variant
brings its own, on vLLM's M-RoPE machinery (the only way a model can set its own positions):

- the config gets `mrope_section = [rotary_dim / 2, 0, 0]` (`update_model_config`, run by
  the plugin before the runner exists): M-RoPE whose first row drives every rotary
  dimension IS 1-D RoPE, rows 1 and 2 are never read;
- the processor reserves `floor(N / ratio) + 1` placeholders (N = `F * P * P`);
- `get_mrope_input_positions` writes the prompt's positions: the text after a video starts
  at the video's start + N + 1, as uncompressed; rows 1 and 2 hold each placeholder's
  video start;
- `embed_multimodal` appends each kept row's original index to its embedding (two exact
  columns, `index // 256` and `index % 256`: exact in bfloat16 too), and
  `recompute_mrope_positions` writes `start + index` into row 0 of the media tokens the
  runner scheduled (idempotent: the start is read from row 1).

Images pass through uncompressed (their rows get their own indices).

A video that arrives ALREADY compressed (`precompressed.py`, the threshold mode: a payload of
K grid rows, their `(frame, row, column)` coords and the `(F, P, P)` grid, as craft-adapters'
`compress_videos` writes it) skips the vision tower and CRAFT: the processor reserves K + 1
placeholders, and the rows get the served model's own newline row after them and their
original indices (`t * P * P + h * P + w`; the newline `F * P * P`), as above.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from vllm.model_executor.models.interfaces import SupportsMRoPE, SupportsMultiModalPruning
from vllm.model_executor.models.llava_onevision import (
    LlavaOnevisionDummyInputsBuilder,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionMultiModalProcessor,
    LlavaOnevisionProcessingInfo,
)
from vllm.multimodal import MULTIMODAL_REGISTRY

from craft_vllm.common import CraftModel, CraftProcessor
from craft_vllm.payload import COORDS, COUNT, GRID
from craft_vllm.positions import prompt_positions
from craft_vllm.precompressed import CraftLlavaDataParser, PayloadFields, PayloadProcessingInfo

ARCHITECTURE = "CraftLlavaOnevisionForConditionalGeneration"
BASE = 256  # index = hi * BASE + lo; integers up to 256 are exact in bfloat16


def update_model_config(model_config: Any) -> None:
    """Turn the served LLM's 1-D RoPE into M-RoPE read from row 0 only (same rotations)."""
    text = model_config.hf_config.get_text_config()
    rope = dict(getattr(text, "rope_parameters", None) or {})
    if "mrope_section" in rope:
        return
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    rotary = int(head * rope.get("partial_rotary_factor", 1.0))
    rope.setdefault("rope_type", "default")
    rope["mrope_section"] = [rotary // 2, 0, 0]
    text.rope_parameters = rope


def pooled_side(hf_config: Any) -> int:
    """P, the side of a frame's pooled grid (vLLM's and craft-adapters' `ceil(S / 2)`)."""
    vision = hf_config.vision_config
    return -(-(vision.image_size // vision.patch_size) // 2)


def index_columns(index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`[K, 2]` (`index // BASE`, `index % BASE`) of `[K]` original row indices."""
    index = index.long()
    return torch.stack([index // BASE, index % BASE], dim=1).to(dtype)


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

    parser = CraftLlavaDataParser


@dataclass
class PayloadInput:
    """Compressed videos of one batch (`precompressed.py`): rows `[sum K, D]`, coords
    `[sum K, 3]`, counts `[V]`, grids `[V, 3]` (F, P, P)."""

    rows: torch.Tensor
    coords: torch.Tensor
    counts: list[int]
    grids: list[list[int]]


def _flat(value: Any) -> torch.Tensor:
    """A flat field as the runner hands it: one tensor, or one per video."""
    if isinstance(value, (list, tuple)):
        return torch.cat([torch.as_tensor(v) for v in value])
    return torch.as_tensor(value)


def _video_tokens(feature: Any, side: int) -> int:
    """N of one video feature: F * P * P (raw frames or a payload's grid)."""
    if GRID in feature.data:
        t, h, w = (int(x) for x in feature.data[GRID].data.tolist())
        return t * h * w
    return int(feature.data["pixel_values_videos"].data.shape[0]) * side * side


@MULTIMODAL_REGISTRY.register_processor(
    CraftLlavaOnevisionMultiModalProcessor,
    info=CraftLlavaOnevisionProcessingInfo,
    dummy_inputs=LlavaOnevisionDummyInputsBuilder,
)
class CraftLlavaOnevisionForConditionalGeneration(
    CraftModel, LlavaOnevisionForConditionalGeneration, SupportsMRoPE, SupportsMultiModalPruning
):
    """LLaVA-OneVision whose video grid rows go through a CRAFT checkpoint at a fixed ratio."""

    architecture = ARCHITECTURE

    def _parse_and_validate_video_input(self, **kwargs: Any) -> Any:
        if kwargs.get(COUNT) is None:
            return super()._parse_and_validate_video_input(**kwargs)
        counts = [int(k) for k in _flat(kwargs[COUNT]).reshape(-1)]
        grids = _flat(kwargs[GRID]).reshape(-1, 3).tolist()
        rows, coords = _flat(kwargs["video_embeds"]), _flat(kwargs[COORDS]).long()
        return PayloadInput(rows.reshape(-1, rows.shape[-1]), coords.reshape(-1, 3), counts, grids)

    def _payload_rows(self, inputs: PayloadInput) -> list[torch.Tensor]:
        """Each compressed video's `[K, D]` rows -> `[K + 1, D + 2]`: its rows, the served
        model's newline row, each row's original index (`index_columns`)."""
        newline = self.image_newline[None]
        out = []
        for rows, coords, (t, h, w) in zip(
            inputs.rows.split(inputs.counts), inputs.coords.split(inputs.counts), inputs.grids
        ):
            rows = torch.cat([rows.to(newline.device, newline.dtype), newline])
            index = (coords[:, 0] * h + coords[:, 1]) * w + coords[:, 2]
            index = torch.cat([index, index.new_tensor([t * h * w])]).to(rows.device)
            out.append(torch.cat([rows, index_columns(index, rows.dtype)], dim=1))
        return out

    def _process_video_pixels(self, inputs: Any) -> list[torch.Tensor]:
        """vLLM's `[F * P * P + 1, D]` per video -> `[floor(N / ratio) + 1, D + 2]`: CRAFT's
        rows, the newline, each row's original index (`index_columns`); a payload's rows
        as they arrived (`_payload_rows`)."""
        if isinstance(inputs, PayloadInput):
            return self._payload_rows(inputs)
        side = pooled_side(self.config)
        per_frame = side * side
        options = self.craft_options
        out = []
        for video in super()._process_video_pixels(inputs):
            video = video.reshape(-1, video.shape[-1])
            n = int(video.shape[0]) - 1
            options.kept(n)  # refuse a ratio that leaves nothing, never clamp
            idx = torch.arange(n, device=video.device)
            coords = torch.stack([idx // per_frame, (idx % per_frame) // side, idx % side], -1)
            result = self.craft(video[:n], coords, options.budget)
            rows = torch.cat([result.features.to(video.dtype), video[n:]])
            index = torch.cat([result.kept_index.to(video.device), idx.new_tensor([n])])
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

    def get_mrope_input_positions(
        self, input_tokens: list[int], mm_features: list[Any]
    ) -> tuple[torch.Tensor, int]:
        """`[3, L]` positions: row 0 the 1-D positions (text after a video where it is
        uncompressed), rows 1 and 2 each placeholder's start (`recompute_mrope_positions`)."""
        side = pooled_side(self.config)
        items = []
        for f in sorted(mm_features, key=lambda f: f.mm_position.offset):
            count = f.mm_position.length
            full = count
            if f.modality == "video":
                full = _video_tokens(f, side) + 1
            line = np.broadcast_to(np.arange(full), (3, full)).copy()
            line[1:] = 0  # rows 1, 2: the start, on every placeholder
            items.append((f.mm_position.offset, count, line))
        positions, delta = prompt_positions(len(input_tokens), items)
        return positions, delta

    def recompute_mrope_positions(
        self,
        input_ids: list[int] | torch.Tensor,
        multimodal_embeddings: Sequence[torch.Tensor],
        mrope_positions: torch.LongTensor,
        num_computed_tokens: int,
    ) -> tuple[Sequence[torch.Tensor], torch.Tensor, int]:
        """Strip the index columns and write `start + index` into row 0 of the media tokens
        these embeddings fill: the first `sum(rows)` media tokens from `num_computed_tokens`
        (the runner hands the items overlapping the scheduled chunk, in order)."""
        ids = torch.as_tensor(input_ids, device=mrope_positions.device).long()
        media = (ids == self.config.video_token_index) | (ids == self.config.image_token_index)
        media[:num_computed_tokens] = False
        embeds = [e[:, :-2] for e in multimodal_embeddings]
        positions = mrope_positions.clone()
        if multimodal_embeddings:
            cols = torch.cat([e[:, -2:] for e in multimodal_embeddings]).round().long()
            index = (cols[:, 0] * BASE + cols[:, 1]).to(positions.device)
            where = media.nonzero(as_tuple=True)[0][: index.shape[0]]
            positions[0, where] = positions[1, where] + index
        delta = int(positions[0].max()) + 1 - int(ids.numel())
        return embeds, positions, delta
