"""CRAFT variant of vLLM's HF-format InternVL: `CraftInternVLForConditionalGeneration`.

vLLM 0.32 serves transformers' `internvl` checkpoints (`InternVLForConditionalGeneration`)
with `interns1.InternS1ForConditionalGeneration`. A video of F frames is written as
`Frame1: <img> T x 256 </img>\\nFrame2: ...` (T: a frame's tokens after the pixel shuffle,
16 x 16 on the real checkpoints; token `i` of frame `f` is `(f, i // 16, i % 16)`). CRAFT
compresses every frame token; the frame text stays. The language model uses 1-D RoPE and
craft-adapters keeps each kept token's ORIGINAL position and the frame text where it is
uncompressed: served as `flat.py` describes (shared with LLaVA-OneVision).

How many tokens each frame keeps is known only after the encoder (as for vLLM's EVS on
Qwen3-VL, and `qwen3_vl.py`), while the placeholder is reserved before. So the processor
reserves the whole layout's LENGTH (the frame text + `floor(N / ratio)` kept tokens), every
slot written as the `<video>` token, and the model fills EVERY slot: `embed_multimodal`
returns the rebuilt layout (each frame's text embedded by the language model, each frame's
kept rows between its `<img>` and `</img>`) with each slot's index in the uncompressed
placeholder (`flat.index_columns`). The prompt's token ids show `<video>` where the frame
text is; what the model computes is craft-adapters' sequence.

A compressed video (`precompressed.py`, threshold mode: K rows, their `(frame, row,
column)` coords and the `(F, T_side, T_side)` grid) skips the vision tower and CRAFT and is
laid out the same way. Images pass through uncompressed (each `<IMG_CONTEXT>` row at its
slot after `<img>`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import torch
from vllm.model_executor.models.interfaces import SupportsMRoPE, SupportsMultiModalPruning
from vllm.model_executor.models.interns1 import (
    InternS1DummyInputsBuilder,
    InternS1ForConditionalGeneration,
    InternS1MultiModalProcessor,
    InternS1ProcessingInfo,
)
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.processing import cached_encode
from vllm.tokenizers import cached_tokenizer_from_config

from craft_adapters.backbones.internvl import TOKENS
from craft_adapters.registry import frame_grid_coords
from craft_vllm.common import CraftModel, CraftProcessor
from craft_vllm.flat import FlatPositions, PayloadInput, grid_tokens, index_columns, payload_input
from craft_vllm.payload import GRID, PayloadFormat
from craft_vllm.precompressed import PayloadFields, PayloadProcessingInfo

ARCHITECTURE = "CraftInternVLForConditionalGeneration"
PAYLOAD = PayloadFormat("internvl", merge=1, flat=True)
"""Payloads: `video_grid_thw` the `(F, S, S)` frame token grid itself, 1-D positions."""
VIDEO = TOKENS["video_token"]  # every reserved slot of a video's placeholder


def frame_side(config: Any) -> int:
    """S, the side of a frame's token grid after the pixel shuffle: `image_size / patch *
    downsample_ratio` (the sizes are `[H, W]` lists)."""
    vision = config.vision_config
    return int(vision.image_size[0] // vision.patch_size[0] * config.downsample_ratio)


@lru_cache(maxsize=64)
def _layout(tokenizer: Any, frames: int, per_frame: int) -> tuple[int, ...]:
    """The ids of an UNCOMPRESSED video placeholder, frame tokens written as `<video>` (vLLM's
    `get_replacement_interns1_video`, the text transformers' processor writes)."""
    one = TOKENS["start_image_token"] + VIDEO * per_frame + TOKENS["end_image_token"]
    text = "\n".join(f"Frame{i + 1}: {one}" for i in range(frames))
    return tuple(cached_encode(tokenizer, text, add_special_tokens=False))


def _frames(item: Mapping[str, Any]) -> int:
    """F of one video's processed fields: raw frames, or a payload's grid."""
    if GRID in item:
        return int(item[GRID].data[0])
    return int(item["video_num_patches"].data)


class CraftInternVLMultiModalProcessor(PayloadFields, CraftProcessor, InternS1MultiModalProcessor):
    """Reserves the frame text + `floor(N / ratio)` slots per video (a payload: + K)."""

    architecture = ARCHITECTURE

    def _per_frame(self) -> int:
        return frame_side(self.info.get_hf_config()) ** 2

    def craft_video_tokens(self, item: Any, hf_processor_mm_kwargs: Mapping[str, Any]) -> int:
        return _frames(item) * self._per_frame()

    def craft_placeholder(self, item: Any, kept: int) -> list[int]:
        tokenizer = self.info.get_tokenizer()
        frames, per_frame = _frames(item), self._per_frame()
        full = _layout(tokenizer, frames, per_frame)
        video_id = tokenizer.convert_tokens_to_ids(VIDEO)
        return [video_id] * (len(full) - frames * per_frame + kept)


class CraftInternVLProcessingInfo(PayloadProcessingInfo, InternS1ProcessingInfo):
    """InternVL's, with a parser that also takes compressed videos (precompressed.py)."""

    payload_format = PAYLOAD

    def craft_frame_side(self) -> int:
        return frame_side(self.get_hf_config())

    def get_max_video_tokens(self, seq_len: int, mm_counts: Mapping[str, int]) -> int:
        """N of the largest video a server of `seq_len` accepts (`common.check_settings`)."""
        frames = self.get_num_frames_with_most_features(seq_len, mm_counts)
        return int(frames * self.get_hf_processor().image_seq_length)


@MULTIMODAL_REGISTRY.register_processor(
    CraftInternVLMultiModalProcessor,
    info=CraftInternVLProcessingInfo,
    dummy_inputs=InternS1DummyInputsBuilder,
)
class CraftInternVLForConditionalGeneration(
    FlatPositions,
    CraftModel,
    InternS1ForConditionalGeneration,
    SupportsMRoPE,
    SupportsMultiModalPruning,
):
    """InternVL whose video frame tokens go through a CRAFT checkpoint at a fixed ratio."""

    architecture = ARCHITECTURE

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.craft_tokenizer = cached_tokenizer_from_config(vllm_config.model_config)
        self.craft_video_id = int(self.craft_tokenizer.convert_tokens_to_ids(VIDEO))
        self.craft_side = frame_side(self.config)

    def craft_media_ids(self) -> tuple[int, ...]:
        return (self.craft_video_id, int(self.config.image_token_id))

    def craft_full_length(self, feature: Any) -> int:
        n = grid_tokens(feature)
        per_frame = self.craft_side**2
        frames = int(feature.data["video_num_patches"].data) if n is None else n // per_frame
        return len(_layout(self.craft_tokenizer, frames, per_frame))

    def _parse_and_validate_multimodal_inputs(self, **kwargs: Any) -> Any:
        payload = payload_input(kwargs)
        modalities = super()._parse_and_validate_multimodal_inputs(**kwargs)
        if payload is not None:
            modalities["videos"] = payload
        return modalities

    def _layout_rows(self, rows: torch.Tensor, index: torch.Tensor, frames: int) -> torch.Tensor:
        """One video's kept rows `[K, D]` at their original frame-token indices `[K]` (in
        `[F * T]`) -> its placeholder's rows `[L, D + 2]`: the uncompressed layout with the
        dropped frame tokens left out (frame text embedded by the language model), each
        slot's uncompressed index in the last two columns."""
        full = torch.tensor(_layout(self.craft_tokenizer, frames, self.craft_side**2))
        is_frame = full == self.craft_video_id
        keep = ~is_frame
        order = index.cpu().argsort()  # rows in sequence order (CRAFT keeps them sorted)
        keep[is_frame.nonzero(as_tuple=True)[0][index.cpu()[order]]] = True
        slots = keep.nonzero(as_tuple=True)[0]
        ids = full[slots].to(rows.device)
        embeds = self.get_language_model().embed_input_ids(ids).clone()
        embeds[ids == self.craft_video_id] = rows[order.to(rows.device)].to(embeds.dtype)
        return torch.cat([embeds, index_columns(slots.to(rows.device), embeds.dtype)], dim=1)

    def _craft_videos(self, videos: list[torch.Tensor], frames: list[int]) -> list[torch.Tensor]:
        """Each raw video's frame rows `[F * T, D]` -> its placeholder's rows (CRAFT's, every
        video in one call)."""
        coords = [frame_grid_coords(int(v.shape[0]), self.craft_side, v.device) for v in videos]
        results = self.craft_compress(videos, coords)
        return [self._layout_rows(r.features, r.kept_index, f) for r, f in zip(results, frames)]

    def _process_vision_input(self, image_input: Any) -> tuple[torch.Tensor, ...]:
        """Videos: each placeholder's rows (`_layout_rows`); images: vLLM's rows, each with
        its slot after `<img>` (the runner expects the index columns of every item)."""
        if isinstance(image_input, PayloadInput):
            return tuple(
                self._layout_rows(rows, index, t) for rows, index, (t, _, _) in image_input.videos()
            )
        items = super()._process_vision_input(image_input)
        if image_input["type"] == "pixel_values_videos":
            frames = [int(f) for f in image_input["num_patches"]]
            return tuple(self._craft_videos(list(items), frames))
        out = []
        for image in items:
            slot = 1 + torch.arange(image.shape[0], device=image.device)
            out.append(torch.cat([image, index_columns(slot, image.dtype)], dim=1))
        return tuple(out)
