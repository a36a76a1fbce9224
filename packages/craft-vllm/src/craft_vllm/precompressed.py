"""Videos that arrive ALREADY compressed: how the threshold (adaptive) mode is served.

vLLM reserves each video's placeholder count when it preprocesses the prompt, before any
encoder runs, so a count that depends on the content (CRAFT's threshold mode) cannot be
computed in the server. A request can instead carry CRAFT's output, made elsewhere
(craft-adapters' `CraftModel.compress_videos`, saved with `save_compressed_video` and read
back with `load_compressed_video`): the server reserves exactly its K rows and places each
at its original M-RoPE position. vLLM's own embedding-input path carries it
(`enable_mm_embeds=True`), as a dict of tensors per video:

    llm = LLM(..., hf_overrides={...CRAFT...}, enable_mm_embeds=True)
    video = load_compressed_video("clip.craft.safetensors")
    llm.generate({"prompt": prompt, "multi_modal_data": {"video": video_payload(video)}})

The payload is checked per request (a bad one fails that request alone, naming the field):
the width against the language model's, finite rows, coords inside the grid, a count that
agrees with the coords.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, ClassVar

import torch
from vllm.model_executor.models.qwen2_vl import (
    Qwen2VLMultiModalDataParser,
    _create_qwen2vl_field_factory,
)
from vllm.multimodal.inputs import MultiModalFieldConfig
from vllm.multimodal.parse import DictEmbeddingItems

from craft_adapters import CompressedVideo

COORDS, COUNT, SECONDS = "craft_coords", "craft_num_kept", "second_per_grid_ts"
TIMESTAMPS = "timestamps"  # Qwen3-VL / Qwen3.5: each frame run's "<t seconds>" text
FIELDS = {"video_embeds": "values", "video_grid_thw": "metadata", COORDS: "metadata"}
FIELDS |= {COUNT: "metadata", SECONDS: "metadata"}


def video_payload(
    video: CompressedVideo, merge: int = 2, timestamps: Sequence[float] | None = None
) -> dict[str, torch.Tensor]:
    """The `multi_modal_data["video"]` of a request carrying `video` (one video).

    `merge`: the backbone's spatial merge size (2 for every Qwen): vLLM's
    `video_grid_thw` counts patches, the compressed video's grid merged tokens.
    `timestamps`: Qwen3.5 only (required there): the T seconds its frame runs are written
    with, as its processor gives them (`processor._calculate_timestamps(indices, fps, 2)`).
    """
    t, h, w = video.grid
    seconds = float(video.metadata.get("second_per_grid", 1.0))
    out = {
        "video_embeds": video.features,
        "video_grid_thw": torch.tensor([[t, h * merge, w * merge]]),
        COORDS: video.coords,
        COUNT: torch.tensor([video.features.shape[0]]),
        SECONDS: torch.tensor([seconds]),
    }
    if timestamps is not None:
        out[TIMESTAMPS] = torch.tensor([list(timestamps)], dtype=torch.float64)
    return out


def _check_timestamps(data: Mapping[str, Any]) -> None:
    """Qwen3.5: one `[T]` row of finite seconds per video ([V, T], T of video_grid_thw)."""
    stamps, grids = data[TIMESTAMPS], data["video_grid_thw"]
    frames = {int(t) for t in grids[:, 0].tolist()}
    if (
        not isinstance(stamps, torch.Tensor)
        or stamps.dim() != 2
        or stamps.shape[0] != grids.shape[0]
        or {stamps.shape[1]} != frames
        or not bool(torch.isfinite(stamps).all())
    ):
        shape = tuple(stamps.shape) if isinstance(stamps, torch.Tensor) else type(stamps).__name__
        raise ValueError(
            f"compressed video payload: timestamps must be [V, T] finite seconds (T of "
            f"video_grid_thw: {sorted(frames)}), got {shape}"
        )


def check_payload(
    data: Mapping[str, Any], merge: int, hidden_size: int, timed: bool = False
) -> None:
    """Refuse a malformed payload (one request), naming the field; see the module docstring.
    `timed`: the backbone writes frame timestamps (Qwen3.5), so `timestamps` is required."""
    missing = [k for k in [*FIELDS, *([TIMESTAMPS] if timed else [])] if k not in data]
    if missing:
        raise ValueError(f"compressed video payload: missing field(s) {missing}")
    rows, grids, counts = data["video_embeds"], data["video_grid_thw"], data[COUNT]
    if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or rows.shape[1] != hidden_size:
        shape = tuple(rows.shape) if isinstance(rows, torch.Tensor) else type(rows).__name__
        raise ValueError(
            f"compressed video payload: video_embeds must be [K, {hidden_size}] (the language "
            f"model's width), got {shape}"
        )
    if grids.dim() != 2 or grids.shape[1] != 3 or counts.dim() != 1:
        raise ValueError("compressed video payload: video_grid_thw [V, 3], craft_num_kept [V]")
    if counts.shape[0] != grids.shape[0] or int(counts.sum()) != rows.shape[0]:
        raise ValueError(
            f"compressed video payload: craft_num_kept {counts.tolist()} must give one count "
            f"per video summing to the {rows.shape[0]} rows of video_embeds and craft_coords"
        )
    if data[COORDS].shape[0] != rows.shape[0]:
        raise ValueError(
            f"compressed video payload: craft_coords has {data[COORDS].shape[0]} rows, "
            f"craft_num_kept says {int(counts.sum())}"
        )
    start = 0
    for (t, h, w), k in zip(grids.tolist(), counts.tolist()):
        if h % merge or w % merge:
            raise ValueError(f"compressed video payload: video_grid_thw {[t, h, w]} not / {merge}")
        grid = (int(t), int(h) // merge, int(w) // merge)
        end = start + int(k)
        try:  # craft-adapters' checks: finite rows, integer coords inside the grid, in order
            CompressedVideo(rows[start:end], data[COORDS][start:end], grid)
        except (TypeError, ValueError) as error:
            raise ValueError(f"compressed video payload: {error}") from None
        start = end
    if timed:
        _check_timestamps(data)


def field_factory(
    base: Callable[[Mapping[str, torch.Tensor]], Mapping[str, MultiModalFieldConfig]],
) -> Callable[[Mapping[str, torch.Tensor]], Mapping[str, MultiModalFieldConfig]]:
    """vLLM's field layout (`base`) with each video's rows sized by its kept count."""

    def fields(data: Mapping[str, torch.Tensor]) -> Mapping[str, MultiModalFieldConfig]:
        out = dict(base(data))
        counts = data[COUNT]  # check_payload ran first
        out["video_embeds"] = MultiModalFieldConfig.flat_from_sizes("video", counts)
        out[COORDS] = MultiModalFieldConfig.flat_from_sizes("video", counts, keep_on_cpu=True)
        out[COUNT] = MultiModalFieldConfig.batched("video", keep_on_cpu=True)
        out[SECONDS] = MultiModalFieldConfig.batched("video", keep_on_cpu=True)
        return out

    return fields


class CraftQwenDataParser(Qwen2VLMultiModalDataParser):
    """vLLM's Qwen data parser; a video given as a dict is a compressed-video payload."""

    embedding_fields: ClassVar[dict[str, dict[str, str]]] = {
        **Qwen2VLMultiModalDataParser.embedding_fields,
        "video": FIELDS,
    }

    craft_timed = False  # the payload carries frame timestamps (CraftQwen3DataParser)

    def __init__(self, spatial_merge_size: int, hidden_size: int, **kwargs: Any) -> None:
        self._craft_hidden = hidden_size
        super().__init__(spatial_merge_size, **kwargs)

    def _parse_video_data(self, data: Any) -> Any:
        if not isinstance(data, dict):
            return super()._parse_video_data(data)
        merge = self._spatial_merge_size
        check_payload(data, merge, self._craft_hidden, self.craft_timed)
        required, optional = self.embedding_field_sets("video")
        return DictEmbeddingItems(
            data,
            modality="video",
            required_fields=required,
            optional_fields=optional,
            fields_factory=field_factory(_create_qwen2vl_field_factory(merge)),
        )


class CraftQwen3DataParser(CraftQwenDataParser):
    """The same for Qwen3.5: a payload also carries each frame run's timestamp."""

    craft_timed = True
    embedding_fields: ClassVar[dict[str, dict[str, str]]] = {
        **Qwen2VLMultiModalDataParser.embedding_fields,
        "video": {**FIELDS, TIMESTAMPS: "metadata"},
    }


class PayloadProcessingInfo:
    """A vLLM ProcessingInfo mixin (first base): its data parser, `parser`, also takes
    compressed videos."""

    parser: ClassVar[type[CraftQwenDataParser]]

    def get_data_parser(self) -> CraftQwenDataParser:
        config = self.get_hf_config()  # type: ignore[attr-defined]
        return self.parser(
            config.vision_config.spatial_merge_size,
            config.get_text_config().hidden_size,
            video_needs_metadata=True,
            expected_hidden_size=self._get_expected_hidden_size(),  # type: ignore[attr-defined]
            allow_missing_mm_embeddings=self.allow_missing_mm_embeddings,  # type: ignore[attr-defined]
        )


class PayloadFields:
    """Mixin of a CRAFT processor (before vLLM's): a compressed video's fields (rows sized
    by its kept count)."""

    def _get_mm_fields_config(self, hf_inputs: Any, hf_processor_mm_kwargs: Any) -> Any:
        base = partial(
            super()._get_mm_fields_config,  # type: ignore[misc]
            hf_processor_mm_kwargs=hf_processor_mm_kwargs,
        )
        if COUNT not in hf_inputs:
            return base(hf_inputs)
        return field_factory(base)(hf_inputs)


class PayloadVideoInput:
    """Mixin of a CRAFT model class (before vLLM's): a compressed video's rows skip the
    vision tower; its coords and counts ride on the video input (`craft_coords`, `[K, 3]`
    per video, and `craft_counts`)."""

    visual: Any

    def _parse_and_validate_video_input(self, **kwargs: Any) -> Any:
        coords, counts = kwargs.pop(COORDS, None), kwargs.pop(COUNT, None)
        video_input = super()._parse_and_validate_video_input(**kwargs)  # type: ignore[misc]
        if video_input is not None and coords is not None:
            video_input.craft_counts = [int(k) for k in counts]
            video_input.craft_coords = (
                torch.as_tensor(coords).long().split(video_input.craft_counts)
            )
        return video_input

    def _process_video_input(self, video_input: Any) -> tuple[torch.Tensor, ...]:
        if getattr(video_input, "craft_counts", None) is None:
            return super()._process_video_input(video_input)  # type: ignore[misc,no-any-return]
        rows = video_input["video_embeds"].type(self.visual.dtype)
        return rows.split(video_input.craft_counts)  # type: ignore[no-any-return]
