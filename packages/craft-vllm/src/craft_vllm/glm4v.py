"""CRAFT variant of vLLM's GLM-4.1V: `CraftGlm4vForConditionalGeneration`.

GLM-4.1V writes a video as `<|begin_of_video|>`, then for each temporal group (two frames)
`<|begin_of_image|> h x w <|image|> <|end_of_image|>` and the group's whole seconds as text,
then `<|end_of_video|>` (vLLM's `_construct_video_placeholder`, transformers'
`Glm4vProcessor`). Its M-RoPE gives every token of a group the rows `(s_k, s_k + row, s_k +
col)`, `s_k` the group's start, and every text token one position after the previous
token's largest; craft-adapters compresses the group tokens with `(t, h, w)` read off those
rows (`timestamp_coords`, as for Qwen3-VL) and keeps each kept token and all the text at
their ORIGINAL positions.

vLLM's class has no pruning hook, so the variant brings its own, as InternVL's does
(`internvl.py`): how many tokens each group keeps is known only after the encoder, so

- the processor reserves the whole compressed layout's LENGTH (the video's text +
  `floor(N / ratio)` kept tokens), every slot written as `<|image|>`, and adds each raw
  video's group seconds to its fields (`timestamps`, vLLM's own GLM-4.1V rule);
- `embed_multimodal` returns the rebuilt layout (the text embedded by the language model,
  each group's kept rows between its markers), each slot with its index in the placeholder
  and its original position relative to the video's start (`position_columns`);
- `recompute_mrope_positions` writes `start + position` for the slots the runner scheduled,
  the start read from the item's first slot, whose relative position is 0 (so rewriting is
  idempotent), and `get_mrope_input_positions` starts the text after a video where it starts
  uncompressed.

A compressed video (`precompressed.py`, threshold mode: K rows, their `(t, h, w)` grid
coords, the `(T, 2 h, 2 w)` grid and the T group seconds) skips the vision tower and CRAFT
and is laid out the same way. Images pass through uncompressed (their rows at their own
positions). GLM-4.1V's processor (`Glm4vProcessor`) only: GLM-4.6V's writes other timestamps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from transformers import Glm4vProcessor
from vllm.model_executor.models.glm4_1v import (
    Glm4vDummyInputsBuilder,
    Glm4vForConditionalGeneration,
    Glm4vMultiModalProcessor,
    Glm4vProcessingInfo,
)
from vllm.model_executor.models.interfaces import SupportsMultiModalPruning
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.parse import DictEmbeddingItems
from vllm.tokenizers import cached_tokenizer_from_config

from craft_adapters.backbones.qwen3_vl import timestamp_coords
from craft_vllm.common import CraftModel, CraftProcessor
from craft_vllm.payload import TIMESTAMPS, PayloadFormat
from craft_vllm.positions import ColumnPositions, exact_columns, prompt_positions
from craft_vllm.precompressed import PayloadFields, PayloadProcessingInfo, PayloadVideoInput

ARCHITECTURE = "CraftGlm4vForConditionalGeneration"
PAYLOAD = PayloadFormat("glm4v", merge=2, frame_runs=2, run_seconds="whole")
"""Payloads: `video_grid_thw` in patches (2 x 2 merge), `timestamps` the whole seconds of each
run of 2 frames (the prompt's text after each group)."""
COLUMNS = 8  # slot index, then the (t, h, w) position relative to the start: 4 exact pairs


@lru_cache(maxsize=4096)
def _seconds_ids(tokenizer: Any, second: int) -> tuple[int, ...]:
    """The token ids of one group's seconds text (vLLM's `tokenizer.encode("{}")`)."""
    return tuple(tokenizer.encode(str(second), add_special_tokens=False))


def whole_seconds(timestamps: Any) -> tuple[int, ...]:
    """A video's group seconds (a list, or a `[T]` tensor from a payload) as ints."""
    values = torch.as_tensor(timestamps, dtype=torch.float64).reshape(-1).tolist()
    return tuple(int(v) for v in values)


@lru_cache(maxsize=64)
def layout(
    tokenizer: Any, ids: tuple[int, ...], grid: tuple[int, int], seconds: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """An UNCOMPRESSED video placeholder: `([L] token ids, [3, L] positions from 0)`.

    Args:
        tokenizer: the served tokenizer (the seconds text).
        ids: `(begin_of_video, begin_of_image, image, end_of_image, end_of_video)` ids.
        grid: `(h, w)` merged tokens of one group.
        seconds: each group's whole seconds (T groups).
    """
    bov, boi, image, eoi, eov = ids
    h, w = grid
    rows, cols = (a.reshape(-1) for a in np.indices((h, w)))
    tokens, pos, cursor = [bov], [np.zeros((3, 1), np.int64)], 1
    for second in seconds:
        text = [eoi, *_seconds_ids(tokenizer, second)]
        tokens += [boi] + [image] * (h * w) + text
        pos.append(np.full((3, 1), cursor))
        pos.append(np.stack([np.full(h * w, cursor + 1), cursor + 1 + rows, cursor + 1 + cols]))
        start = cursor + 1 + max(h, w)
        pos.append(np.broadcast_to(np.arange(start, start + len(text)), (3, len(text))))
        cursor = start + len(text)
    tokens.append(eov)
    pos.append(np.full((3, 1), cursor))
    return np.array(tokens, np.int64), np.concatenate(pos, axis=1).astype(np.int64)


def extent(grid: tuple[int, int], seconds_lengths: Sequence[int]) -> int:
    """The positions a video of T groups of `grid` spans (the text after it starts that many
    after its start): `bov` + per group `boi`, `max(h, w)`, `eoi`, its seconds + `eov`."""
    return 2 + sum(2 + max(grid) + n for n in seconds_lengths)


def position_columns(slots: torch.Tensor, pos: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`[K, 8]` exact columns of `[K]` slot indices and their `[3, K]` relative positions."""
    values = torch.cat([slots.long()[None], pos.long()], dim=0).T  # [K, 4]
    return exact_columns(values, dtype)


class CraftGlm4vMultiModalProcessor(PayloadFields, CraftProcessor, Glm4vMultiModalProcessor):
    """Reserves the video's text + `floor(N / ratio)` `<|image|>` slots per video (a payload:
    + K), and keeps each raw video's group seconds in its fields (`timestamps`)."""

    architecture = ARCHITECTURE

    def _apply_hf_processor_main(self, mm_items: Any, hf_kwargs: Mapping[str, object]) -> Any:
        out = super()._apply_hf_processor_main(mm_items, hf_kwargs)
        videos = mm_items.get("video")
        if videos is None or isinstance(videos, DictEmbeddingItems):
            return out
        processor = self.info.get_hf_processor(**hf_kwargs)
        if not isinstance(processor, Glm4vProcessor):
            raise ValueError(
                f"{ARCHITECTURE} serves GLM-4.1V's processor (Glm4vProcessor), this model's "
                f"is {type(processor).__name__}"
            )
        # vLLM's own rule (its `_construct_video_placeholder` writes these seconds)
        second = self.info._get_video_second_idx_glm4v
        out[TIMESTAMPS] = [[float(s) for s in second(meta, len(v))] for v, meta in videos]
        return out

    def craft_placeholder(self, item: Any, kept: int) -> list[int]:
        config = self.info.get_hf_config()
        t, h, w = (int(x) for x in item["video_grid_thw"].data.tolist())
        merge = config.vision_config.spatial_merge_size
        grid = (h // merge, w // merge)
        seconds = whole_seconds(item[TIMESTAMPS].data)
        full, _ = layout(self.info.get_tokenizer(), _ids(config), grid, seconds)
        return [config.image_token_id] * (len(full) - t * grid[0] * grid[1] + kept)


def _ids(config: Any) -> tuple[int, ...]:
    """The layout's special token ids from the served config (`layout`'s `ids`)."""
    return (
        int(config.video_start_token_id),
        int(config.image_start_token_id),
        int(config.image_token_id),
        int(config.image_end_token_id),
        int(config.video_end_token_id),
    )


class CraftGlm4vProcessingInfo(PayloadProcessingInfo, Glm4vProcessingInfo):
    """GLM-4.1V's, with a parser that also takes compressed videos (precompressed.py) and
    the positions a payload video spans (`craft_extent`)."""

    payload_format = PAYLOAD
    craft_has_extent = True

    def craft_extent(self, grid: tuple[int, int, int], timestamps: list[float], cap: int) -> int:
        """`extent` of a payload video of merged `grid` and group `timestamps`; stops
        tokenizing the seconds once the video is known to span more than `cap`."""
        _, h, w = grid
        if extent((h, w), [1] * len(timestamps)) > cap:  # every seconds text is >= 1 token
            return cap + 1
        tokenizer = self.get_tokenizer()
        lengths = [len(_seconds_ids(tokenizer, s)) for s in whole_seconds(timestamps)]
        return extent((h, w), lengths)

    def get_max_video_tokens(self, seq_len: int, mm_counts: Mapping[str, int]) -> int:
        """N of the largest video a server of `seq_len` accepts (`common.check_settings`)."""
        frames = self.get_num_frames_with_most_features(seq_len, mm_counts)
        width, height = self.get_image_size_with_most_features()
        _, tokens = self._get_vision_info(
            image_width=width,
            image_height=height,
            num_frames=frames,
            max_image_pixels=self._get_video_max_pixels(),
        )
        return int(tokens)


@MULTIMODAL_REGISTRY.register_processor(
    CraftGlm4vMultiModalProcessor,
    info=CraftGlm4vProcessingInfo,
    dummy_inputs=Glm4vDummyInputsBuilder,
)
class CraftGlm4vForConditionalGeneration(
    ColumnPositions,
    PayloadVideoInput,
    CraftModel,
    Glm4vForConditionalGeneration,
    SupportsMultiModalPruning,
):
    """GLM-4.1V whose video tokens go through a CRAFT checkpoint at a fixed ratio."""

    architecture = ARCHITECTURE
    craft_columns = COLUMNS

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.craft_tokenizer = cached_tokenizer_from_config(vllm_config.model_config)
        self.craft_ids = _ids(self.config)

    def _layout(self, grid: list[int], timestamps: Any) -> tuple[np.ndarray, np.ndarray]:
        """`layout` of one video of `grid` `(T, H, W)` in patches."""
        merge = self.config.vision_config.spatial_merge_size
        size = (grid[1] // merge, grid[2] // merge)
        return layout(self.craft_tokenizer, self.craft_ids, size, whole_seconds(timestamps))

    def _parse_and_validate_video_input(self, **kwargs: Any) -> Any:
        stamps = kwargs.pop(TIMESTAMPS, None)
        video_input = super()._parse_and_validate_video_input(**kwargs)
        if video_input is not None:
            video_input.craft_timestamps = list(stamps)  # one entry per video
        return video_input

    def _layout_rows(
        self, rows: torch.Tensor, index: torch.Tensor, grid: list[int], timestamps: Any
    ) -> torch.Tensor:
        """One video's kept rows `[K, D]` at their group-token indices `[K]` (in `[N]`) ->
        its placeholder's rows `[L, D + 8]`: the uncompressed layout without the dropped
        group tokens (the text embedded by the language model), `position_columns` after."""
        ids, pos = (torch.from_numpy(a) for a in self._layout(grid, timestamps))
        is_group = ids == self.craft_ids[2]
        keep = ~is_group
        order = index.cpu().argsort()  # rows in sequence order
        keep[is_group.nonzero(as_tuple=True)[0][index.cpu()[order]]] = True
        slots = keep.nonzero(as_tuple=True)[0]
        kept_ids = ids[slots].to(rows.device)
        embeds = self.get_language_model().embed_input_ids(kept_ids).clone()
        embeds[kept_ids == self.craft_ids[2]] = rows[order.to(rows.device)].to(embeds.dtype)
        where = torch.arange(slots.shape[0])
        cols = position_columns(where, pos[:, slots], embeds.dtype).to(rows.device)
        return torch.cat([embeds, cols], dim=1)

    def _process_video_input(self, video_input: Any) -> tuple[torch.Tensor, ...]:
        """Each video -> its placeholder's rows (`_layout_rows`): CRAFT's kept rows (every
        raw video of the call in one CRAFT call) or a payload's rows at its coords."""
        rows = super()._process_video_input(video_input)  # [N, D] each, a payload's [K, D]
        grids = video_input["video_grid_thw"].tolist()
        stamps = video_input.craft_timestamps
        given = getattr(video_input, "craft_coords", None)
        merge = self.config.vision_config.spatial_merge_size
        if given is not None:  # a payload: each row's index from its (t, h, w)
            kept = []
            for c, (_, h, w) in zip(given, grids):
                c = c.to(rows[0].device)
                kept.append((c[:, 0] * (h // merge) + c[:, 1]) * (w // merge) + c[:, 2])
        else:
            coords = []  # craft-adapters' rule: (t, h, w) read off the group tokens' rows
            for emb, grid, stamp in zip(rows, grids, stamps):
                ids, pos = self._layout(grid, stamp)
                group = torch.from_numpy(pos[:, ids == self.craft_ids[2]])
                coords.append(timestamp_coords(group).to(emb.device))
            results = self.craft_compress(list(rows), coords)
            kept = [r.kept_index for r in results]
            rows = tuple(r.features.to(e.dtype) for r, e in zip(results, rows))
        return tuple(self._layout_rows(r, k, g, s) for r, k, g, s in zip(rows, kept, grids, stamps))

    def _process_image_input(self, image_input: Any) -> tuple[torch.Tensor, ...]:
        """vLLM's rows of each image, each with its slot and `(0, row, col)` position (the
        runner expects the columns on every item)."""
        out = []
        images = super()._process_image_input(image_input)
        for emb, grid in zip(images, image_input["image_grid_thw"].tolist()):
            slots = torch.arange(emb.shape[0])
            cols = position_columns(slots, self._image_positions(grid), emb.dtype)
            out.append(torch.cat([emb, cols.to(emb.device)], dim=1))
        return tuple(out)

    def _image_positions(self, grid: list[int]) -> torch.Tensor:
        """`[3, h * w]` positions of an image of `grid` `(1, H, W)` in patches, from its
        start: `(0, row, col)`, vLLM's and transformers' rule."""
        merge = self.config.vision_config.spatial_merge_size
        rows, cols = torch.from_numpy(np.indices((grid[1] // merge, grid[2] // merge)))
        return torch.stack([torch.zeros_like(rows), rows, cols]).reshape(3, -1)

    def get_mrope_input_positions(
        self, input_tokens: list[int], mm_features: list[Any]
    ) -> tuple[torch.Tensor, int]:
        """`[3, L]` positions with the text after each video where it is uncompressed; each
        placeholder's first slot at the item's start (its final position: the runner's
        `recompute_mrope_positions` reads the start from it)."""
        items = []
        for f in sorted(mm_features, key=lambda f: f.mm_position.offset):
            key = "video_grid_thw" if f.modality == "video" else "image_grid_thw"
            grid = [int(x) for x in f.data[key].data.tolist()]
            if f.modality == "video":
                _, pos = self._layout(grid, f.data[TIMESTAMPS].data)
            else:
                pos = self._image_positions(grid).numpy()
            items.append((f.mm_position.offset, f.mm_position.length, pos))
        return prompt_positions(len(input_tokens), items)

    def craft_media_ids(self) -> tuple[int, ...]:
        return (self.craft_ids[2],)  # <|image|>: video and image slots alike

    def craft_write_positions(
        self, positions: torch.Tensor, values: torch.Tensor, where: torch.Tensor
    ) -> int:
        """Each slot at `start + position`, `values` `[n, 4]` its slot index and relative
        `(t, h, w)`; `start` is the position of its item's slot 0 (`slot index` slots back),
        whose relative position is 0 (so writing again is idempotent)."""
        start = positions[0, where - values[:, 0]]
        positions[:, where] = start + values[:, 1:].T
        return int(positions.max()) + 1
