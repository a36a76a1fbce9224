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

Through `vllm serve --enable-mm-embeds`'s OpenAI API the same fields arrive as vLLM's
`video_embeds` content part (base64 tensors, `payload.chat_part`); vLLM stacks each
per-video field into the form above before this parser sees it.

The payload is checked per request in the API server, before the engine sees it (a bad one
fails that request alone with an error naming the field, `check_payload`): every field's
dtype, shape and values (finite rows of the language model's width, coords inside the grid
and in order, K >= 1, seconds > 0 that keep the positions inside the rotary table), and what
it was made with (`craft_made_with` against the served backbone and CRAFT checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import cache, lru_cache, partial
from pathlib import Path
from typing import Any, ClassVar

import torch
from vllm.multimodal.inputs import MultiModalFieldConfig
from vllm.multimodal.parse import DictEmbeddingItems

from craft_adapters import CompressedVideo
from craft_adapters.compressed import check_made_with, checkpoint_sha256
from craft_vllm.payload import (
    COORDS,
    COUNT,
    GRID,
    MADE_WITH,
    MADE_WITH_KEYS,
    ROWS,
    SECONDS,
    TIMESTAMPS,
    PayloadFormat,
    decode_made_with,
    describe,
    video_payload,
)

__all__ = ["check_payload", "video_payload"]

FIELDS = {ROWS: "values", GRID: "metadata", COORDS: "metadata", COUNT: "metadata"}
FIELDS |= {SECONDS: "metadata", MADE_WITH: "metadata"}
MAX_GRID_TOKENS = 1 << 22
"""Largest uncompressed grid (T * H * W merged tokens) a payload may claim: the worker lays
out the full grid's positions (`[3, N]` int64), 100 MB at this size (hours of video)."""


@lru_cache(maxsize=8)
def _craft_sha256(folder: str) -> str:
    from craft_core import CraftCompressor

    return checkpoint_sha256(CraftCompressor.from_pretrained(folder))


@dataclass(frozen=True)
class PayloadLimits:
    """What a server checks a payload against (`served_limits` reads them from its config).

    Attributes:
        merge: the spatial merge size (`video_grid_thw` counts patches).
        hidden_size: the language model's width D.
        model_type: the served backbone's `model_type`.
        craft_checkpoint: the served CRAFT checkpoint's folder (its digest is computed when a
            payload first arrives: a bad folder is reported by the server's settings check).
        max_positions: the rotary table's length (text `max_position_embeddings`).
        max_model_len: the server's `--max-model-len`.
        tokens_per_second: Qwen2.5-VL's temporal position step per second, else None (the
            temporal positions do not follow `second_per_grid_ts`).
        timed: the backbone writes frame timestamps (Qwen3-VL, Qwen3.5): `timestamps` is
            required.
        side: the merged grid's fixed H = W, else None (LLaVA-OneVision: its pooled side P;
            the rows are placed by `t * P * P + h * P + w`).
        flat: 1-D positions (LLaVA-OneVision, InternVL): the text after a video of N tokens
            starts N (+ its fixed rows) positions after its start, whatever was kept.
        deepstack_levels: Qwen3-VL's deepstack levels L: each row is `[D + L * D]`, the
            main row and the kept token's deepstack rows side by side.
        whole_seconds: the frame runs' `timestamps` are whole seconds (GLM-4.1V writes
            `int(seconds)`: a fraction would be dropped from the prompt, so it is refused).
        extent: `extent(grid, timestamps, cap)`: the positions one video spans uncompressed
            (the text after it starts that many positions after its start), or any value
            over `cap` once it is known to exceed it; from the model file
            (`PayloadProcessingInfo.craft_extent`, GLM-4.1V: its frame runs and their
            timestamp text), None where the rules below apply.
    """

    merge: int
    hidden_size: int
    model_type: str
    craft_checkpoint: str
    max_positions: int
    max_model_len: int
    tokens_per_second: float | None = None
    timed: bool = False
    side: int | None = None
    flat: bool = False
    deepstack_levels: int = 0
    whole_seconds: bool = False
    extent: Callable[[tuple[int, int, int], list[float], int], int] | None = None

    def made_with(self) -> dict[str, Any]:
        """The values of `MADE_WITH_KEYS` this server has."""
        sha = _craft_sha256(self.craft_checkpoint)
        made = {"model_type": self.model_type, "hidden_size": self.hidden_size, "craft_sha256": sha}
        assert set(made) == set(MADE_WITH_KEYS)
        return made


def _refuse(field: str, what: str, value: Any) -> ValueError:
    return ValueError(f"compressed video payload: {field} must be {what}, got {describe(value)}")


def _tensor(data: Mapping[str, Any], field: str, kind: str, dims: int) -> torch.Tensor:
    """`data[field]` checked: a tensor of `dims` dimensions, of dtype `kind` ("int": integer,
    not bool; "real": integer or floating; "float": floating), every value finite."""
    value = data[field]
    what = {"int": "an integer", "real": "a real", "float": "a floating"}[kind]
    ok = isinstance(value, torch.Tensor) and value.dtype != torch.bool and not value.is_complex()
    if ok and kind == "int":
        ok = not value.is_floating_point()
    if ok and kind == "float":
        ok = value.is_floating_point()
    if not ok or value.dim() != dims:
        raise _refuse(field, f"{what} tensor of {dims} dimension(s)", value)
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise ValueError(f"compressed video payload: {field} holds NaN or inf")
    return value


def _check_counts(data: Mapping[str, Any], limits: PayloadLimits) -> list[tuple[int, ...]]:
    """The sizing fields, first (a bad count mis-sizes every other field): one count >= 1,
    one `[T, H, W]` grid and one `second_per_grid_ts` > 0 per video. -> each video's
    `(T, H, W)` merged grid and K."""
    counts = _tensor(data, COUNT, "int", 1)
    grids = _tensor(data, GRID, "int", 2)
    seconds = _tensor(data, SECONDS, "real", 1)
    videos = counts.shape[0]
    if videos < 1 or tuple(grids.shape) != (videos, 3) or seconds.shape[0] != videos:
        raise ValueError(
            f"compressed video payload: one entry per video in {COUNT} [V], {GRID} [V, 3] "
            f"and {SECONDS} [V], got {describe(counts)}, {describe(grids)}, {describe(seconds)}"
        )
    if bool((counts < 1).any()):
        raise ValueError(
            f"compressed video payload: {COUNT} must be >= 1 per video, got {counts.tolist()} "
            "(a video that kept no row: send the question without it)"
        )
    if bool((seconds <= 0).any()):
        raise ValueError(f"compressed video payload: {SECONDS} must be > 0, got {seconds.tolist()}")
    out: list[tuple[int, ...]] = []
    for (t, h, w), k in zip(grids.tolist(), counts.tolist()):
        if min(t, h, w) < 1 or h % limits.merge or w % limits.merge:
            raise ValueError(
                f"compressed video payload: {GRID} {[t, h, w]} must be >= 1, H and W "
                f"multiples of the merge size {limits.merge}"
            )
        grid = (t, h // limits.merge, w // limits.merge)
        if limits.side is not None and grid[1:] != (limits.side, limits.side):
            raise ValueError(
                f"compressed video payload: {GRID} {[t, h, w]} must have H = W = "
                f"{limits.side} (this backbone's pooled frame side; merge size {limits.merge})"
            )
        if grid[0] * grid[1] * grid[2] > MAX_GRID_TOKENS:
            raise ValueError(
                f"compressed video payload: {GRID} {[t, h, w]} is a video of "
                f"{grid[0] * grid[1] * grid[2]} tokens, over the {MAX_GRID_TOKENS} a payload "
                "may claim"
            )
        out.append((*grid, k))
    return out


def _check_positions(
    videos: list[tuple[int, ...]], data: Mapping[str, Any], limits: PayloadLimits
) -> None:
    """Refuse payloads whose positions could run past the rotary table (vLLM's worker would
    index out of it and die): a video at grid extent E (the text after it starts E positions
    after its start) and K rows moves every later position by E - K; with prompt + output at
    most `max_model_len` tokens, the largest position is below max_model_len + sum(E - K).
    1-D positions (`limits.flat`): E = N = T * H * W; `limits.extent`: the model file's E."""
    if limits.tokens_per_second is None and not limits.flat and limits.extent is None:
        return
    seconds = data[SECONDS]
    room = limits.max_positions - limits.max_model_len
    stamps = data[TIMESTAMPS].tolist() if limits.extent is not None else [None] * len(videos)
    shift = 0
    for (t, h, w, k), second, times in zip(videos, seconds.tolist(), stamps):
        if limits.extent is not None:
            extent = limits.extent((t, h, w), times, room - shift + k)
        elif limits.flat:
            extent = t * h * w
        else:
            factor = float(limits.tokens_per_second or 0.0) * float(second)
            extent = max(int((t - 1) * factor), h - 1, w - 1) + 1
        shift += max(0, extent - k)
    if shift > room:
        cause = (  # what sets the extent: the seconds (Qwen2.5-VL), else the grid
            f"{SECONDS} {seconds.tolist()}"
            if limits.tokens_per_second is not None
            else f"{GRID} {data[GRID].tolist()}"
        )
        raise ValueError(
            f"compressed video payload: {cause} spreads the video over "
            f"{shift} positions more than its rows; with --max-model-len "
            f"{limits.max_model_len} the model's {limits.max_positions} positions leave "
            f"{room} (a lower --max-model-len leaves more)"
        )


def _check_timestamps(
    data: Mapping[str, Any], videos: list[tuple[int, ...]], whole: bool = False
) -> None:
    """Qwen3-VL, Qwen3.5, GLM-4.1V: one `[T]` row of finite seconds >= 0, non-decreasing,
    per video ([V, T]); `whole`: whole seconds."""
    stamps = data[TIMESTAMPS]
    frames = {v[0] for v in videos}
    ok = isinstance(stamps, torch.Tensor) and stamps.is_floating_point() and stamps.dim() == 2
    if not ok or stamps.shape[0] != len(videos) or {stamps.shape[1]} != frames:
        raise _refuse(
            TIMESTAMPS, f"[V, T] floating seconds (T of {GRID}: {sorted(frames)})", stamps
        )
    if not bool(torch.isfinite(stamps).all()) or bool((stamps < 0).any()):
        raise ValueError(f"compressed video payload: {TIMESTAMPS} must be finite and >= 0")
    if bool((stamps[:, 1:] < stamps[:, :-1]).any()):
        raise ValueError(f"compressed video payload: {TIMESTAMPS} must not decrease")
    if whole and not bool((stamps == stamps.floor()).all()):
        raise ValueError(
            f"compressed video payload: {TIMESTAMPS} must be whole seconds (this backbone "
            "writes each frame run's whole seconds)"
        )


def check_payload(data: Mapping[str, Any], limits: PayloadLimits) -> None:
    """Refuse a malformed payload (one request), naming the field (see `payload.py`'s
    table); or one made with another backbone or CRAFT checkpoint than the server's."""
    wanted = [*FIELDS, *([TIMESTAMPS] if limits.timed else [])]
    missing = [k for k in wanted if k not in data]
    unknown = sorted(set(data) - set(wanted))
    if missing or unknown:
        raise ValueError(
            f"compressed video payload: missing field(s) {missing}, unknown field(s) {unknown}"
        )
    videos = _check_counts(data, limits)
    rows = _tensor(data, ROWS, "float", 2)
    total = sum(v[3] for v in videos)
    width = limits.hidden_size * (1 + limits.deepstack_levels)
    if tuple(rows.shape) != (total, width):
        what = (
            "the width"
            if not limits.deepstack_levels
            else (
                f"the width {limits.hidden_size} x (1 + {limits.deepstack_levels} deepstack levels)"
            )
        )
        raise _refuse(ROWS, f"[K = {total} ({COUNT}), {width} ({what})]", rows)
    coords = _tensor(data, COORDS, "int", 2)
    if tuple(coords.shape) != (total, 3):
        raise _refuse(COORDS, f"[K = {total} ({COUNT}), 3]", coords)
    made = decode_made_with(data[MADE_WITH])
    start = 0
    for t, h, w, k in videos:
        try:  # craft-adapters' checks: integer coords inside the grid, in order
            video = CompressedVideo(rows[start : start + k], coords[start : start + k], (t, h, w))
        except (TypeError, ValueError) as error:
            raise ValueError(f"compressed video payload: {COORDS}: {error}") from None
        start += k
        check_made_with(
            CompressedVideo(video.features, video.coords, video.grid, made),
            "compressed video payload",
            **limits.made_with(),
        )
    if limits.timed:  # before the positions: a model file's extent reads them
        _check_timestamps(data, videos, limits.whole_seconds)
    _check_positions(videos, data, limits)


def served_limits(model_config: Any, form: PayloadFormat, side: int | None) -> PayloadLimits:
    """The `PayloadLimits` of the server whose vLLM `ModelConfig` is `model_config`, serving
    a backbone of payload format `form` (its model file's `PAYLOAD`) whose frames are token
    grids of side `side` (a flat backbone's; None: any)."""
    config = model_config.hf_config
    text = config.get_text_config()
    vision = config.vision_config
    folder = getattr(config, "craft_checkpoint", None)  # None: the settings check refuses it
    levels = len(getattr(vision, "deepstack_visual_indexes", None) or [])  # vLLM's rule
    per_second = getattr(vision, "tokens_per_second", None) if form.seconds_positions else None
    return PayloadLimits(
        merge=getattr(vision, "spatial_merge_size", 1),
        hidden_size=text.hidden_size,
        model_type=config.model_type,
        craft_checkpoint=str(Path(str(folder)).expanduser()) if folder else "",
        max_positions=text.max_position_embeddings,
        max_model_len=model_config.max_model_len,
        tokens_per_second=per_second,
        timed=bool(form.frame_runs),
        side=side,
        flat=form.flat,
        deepstack_levels=levels,
        whole_seconds=form.run_seconds == "whole",
    )


def field_factory(
    base: Callable[[Mapping[str, torch.Tensor]], Mapping[str, MultiModalFieldConfig]],
) -> Callable[[Mapping[str, torch.Tensor]], Mapping[str, MultiModalFieldConfig]]:
    """vLLM's field layout (`base`) with each video's rows sized by its kept count."""

    def fields(data: Mapping[str, torch.Tensor]) -> Mapping[str, MultiModalFieldConfig]:
        out = dict(base(data))
        counts = data[COUNT]  # [V] after check_payload (the chat path calls this before it)
        out["video_embeds"] = MultiModalFieldConfig.flat_from_sizes("video", counts)
        out[COORDS] = MultiModalFieldConfig.flat_from_sizes("video", counts, keep_on_cpu=True)
        for key in (GRID, COUNT, SECONDS, MADE_WITH, TIMESTAMPS):  # one entry per video
            if key in data and (key not in out or key not in (GRID, TIMESTAMPS)):
                out[key] = MultiModalFieldConfig.batched("video", keep_on_cpu=True)
        return out

    return fields


def _no_fields(data: Mapping[str, torch.Tensor]) -> Mapping[str, MultiModalFieldConfig]:
    return {}


class PayloadParser:
    """Mixin of a vLLM data parser (first base, `payload_parser`): a video given as a dict is
    a compressed-video payload, checked (`check_payload`) before it becomes embedding items."""

    _craft_limits: PayloadLimits

    def _parse_video_data(self, data: Any) -> Any:
        if not isinstance(data, dict):
            return super()._parse_video_data(data)  # type: ignore[misc]
        check_payload(data, self._craft_limits)
        data = {k: v for k, v in data.items() if k != MADE_WITH}  # checked, not served
        required, optional = self.embedding_field_sets("video")  # type: ignore[attr-defined]
        return DictEmbeddingItems(
            data,
            modality="video",
            required_fields=required - {MADE_WITH},
            optional_fields=optional,
            fields_factory=field_factory(_no_fields),
        )


@cache
def payload_parser(base: Any, timed: bool = False) -> type:
    """vLLM's data parser class `base` (a backbone's own) that also takes payloads: its video
    embedding fields and the payload's (`FIELDS`, and `timestamps` where `timed`: Qwen3's
    parsers have them already)."""
    video = {**base.embedding_fields.get("video", {}), **FIELDS}  # type: ignore[attr-defined]
    if timed:
        video.setdefault(TIMESTAMPS, "metadata")
    fields = {**base.embedding_fields, "video": video}  # type: ignore[attr-defined]
    return type(f"Payload{base.__name__}", (PayloadParser, base), {"embedding_fields": fields})


class PayloadProcessingInfo:
    """A vLLM ProcessingInfo mixin (first base): its own data parser, also taking compressed
    videos as the model file's `PAYLOAD` declares them (`payload_format`)."""

    payload_format: ClassVar[PayloadFormat]

    def craft_frame_side(self) -> int | None:
        """The side of a frame's token grid (H = W) every payload must have (a 1-D RoPE
        backbone's fixed frame grid), else None."""
        return None

    def craft_extent(self, grid: tuple[int, int, int], timestamps: list[float], cap: int) -> int:
        """The positions one payload video of merged `grid` spans uncompressed (the model
        file's rule; `PayloadLimits.extent`). Only called where `craft_has_extent`."""
        raise NotImplementedError

    craft_has_extent: ClassVar[bool] = False

    def get_data_parser(self) -> Any:
        parser = super().get_data_parser()  # type: ignore[misc]
        base: Any = type(parser)
        form = self.payload_format
        parser.__class__ = payload_parser(base, bool(form.frame_runs))  # payloads added
        model_config = self.ctx.model_config  # type: ignore[attr-defined]
        limits = served_limits(model_config, form, self.craft_frame_side())
        if self.craft_has_extent:
            limits = replace(limits, extent=self.craft_extent)
        parser._craft_limits = limits
        return parser


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
