"""CRAFT variant of vLLM's Qwen3-VL: `CraftQwen3VLForConditionalGeneration`.

Qwen3-VL writes a video as per-frame runs: `<t seconds> <|vision_start|> frame tokens
<|vision_end|>` for each temporal group. vLLM's pruning path (the one its EVS uses) handles
that in two steps, and CRAFT uses both unchanged:

- the processor reserves every kept token in frame 0 of the placeholder (the count is known
  at preprocessing, the per-frame split is not): `floor(N / ratio)` here;
- `embed_multimodal` returns, for the whole placeholder, the rows of the REBUILT layout
  (each frame's run holds the kept tokens of that frame, timestamps between runs) with each
  row's original M-RoPE position (`_create_final_video_embeddings`, given CRAFT's kept
  tokens as the retention mask); the runner writes those positions.

Deepstack: the vision tower's deepstack rows (`[N, levels * D]`, after the main `[N, D]`)
are shrunk with the SAME assignment as the main features: each kept row gets the mean of the
deepstack rows of every token merged into it, as craft-adapters does for transformers.

CRAFT sees each token's `(t, h, w)` as craft-adapters gives it for this backbone: `t` is the
frame run's start position minus the first run's (timestamps included), `h`, `w` the offsets
within the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any

import torch
from vllm.model_executor.models import qwen3_vl
from vllm.model_executor.models.qwen3_vl import (
    Qwen3VLDummyInputsBuilder,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMultiModalProcessor,
    Qwen3VLProcessingInfo,
)
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.inputs import (
    MultiModalFeatureSpec,
    MultiModalFieldConfig,
    MultiModalFieldElem,
    MultiModalKwargsItem,
    PlaceholderRange,
)

from craft_adapters import group_mean
from craft_adapters.backbones.qwen3_vl import timestamp_coords
from craft_vllm.common import CraftModel, CraftProcessor
from craft_vllm.payload import PayloadFormat
from craft_vllm.precompressed import PayloadFields, PayloadProcessingInfo, PayloadVideoInput

ARCHITECTURE = "CraftQwen3VLForConditionalGeneration"
PAYLOAD = PayloadFormat("qwen3_vl", merge=2, frame_runs=2)
"""Payloads: `video_grid_thw` in patches (2 x 2 merge), `timestamps` of each run of 2 frames
(the prompt's `<t seconds>`); the rows `[K, D + levels * D]` (deepstack beside each row)."""


class CraftQwen3VLMultiModalProcessor(PayloadFields, CraftProcessor, Qwen3VLMultiModalProcessor):
    """Reserves `floor(N / ratio)` `<|video_pad|>` per video, all in frame 0's run (a
    compressed video's K likewise, its rows laid out per frame when embedded)."""

    architecture = ARCHITECTURE

    def craft_placeholder(self, item: Any, kept: int) -> Any:
        config = self.info.get_hf_config()
        return Qwen3VLMultiModalProcessor.get_video_repl(
            tokens_per_frame=[kept] + [0] * (int(item["video_grid_thw"].data[0]) - 1),
            timestamps=item["timestamps"].data,
            tokenizer=self.info.get_tokenizer(),
            vision_start_token_id=config.vision_start_token_id,
            vision_end_token_id=config.vision_end_token_id,
            video_token_id=config.video_token_id,
        )


_original_factor = qwen3_vl.mrope_positions_factor


def _positions_factor(vllm_config: Any) -> int:
    """CRAFT keeps original positions, which run past the compressed length: the rotary cache
    needs the headroom vLLM gives its own pruning (it reads `--video-pruning-rate` only)."""
    if getattr(vllm_config.model_config.hf_config, "craft_ratio", None) is not None:
        return 4
    return int(_original_factor(vllm_config))


def patch_positions_factor(module: Any) -> None:
    """Give `module` (one of vLLM's model modules importing it) CRAFT's rotary headroom."""
    module.mrope_positions_factor = _positions_factor


patch_positions_factor(qwen3_vl)


class CraftQwen3VLProcessingInfo(PayloadProcessingInfo, Qwen3VLProcessingInfo):
    """Qwen3-VL's, with a parser that also takes compressed videos (precompressed.py; the
    payload carries the frame timestamps and, in its rows, the deepstack rows)."""

    payload_format = PAYLOAD


@MULTIMODAL_REGISTRY.register_processor(
    CraftQwen3VLMultiModalProcessor,
    info=CraftQwen3VLProcessingInfo,
    dummy_inputs=Qwen3VLDummyInputsBuilder,
)
class CraftQwen3VLForConditionalGeneration(
    PayloadVideoInput, CraftModel, Qwen3VLForConditionalGeneration
):
    """Qwen3-VL whose video tokens go through a CRAFT checkpoint at a fixed ratio."""

    architecture = ARCHITECTURE

    def _video_positions(self, grid_thw: list[int], timestamps: Sequence[float]) -> torch.Tensor:
        """`[3, N]` M-RoPE positions of the N video tokens of an uncompressed video, relative
        to its first timestamp token (vLLM's own rule, as `_get_expanded_positions` uses)."""
        t, h, w = grid_thw
        merge = self.visual.spatial_merge_size
        ids = Qwen3VLMultiModalProcessor.get_video_repl(
            tokens_per_frame=[(h // merge) * (w // merge)] * t,
            timestamps=timestamps,  # their token counts move every later run
            tokenizer=self._tokenizer,
            vision_start_token_id=self.config.vision_start_token_id,
            vision_end_token_id=self.config.vision_end_token_id,
            video_token_id=self.config.video_token_id,
        ).full
        feature = _video_feature(grid_thw, len(ids))
        pos, _ = Qwen3VLForConditionalGeneration._get_mrope_input_positions(
            input_tokens=ids, mm_features=[feature], config=self.config
        )
        return pos[:, torch.tensor(ids) == self.config.video_token_id]

    def _craft_rows(
        self, embeds: Sequence[torch.Tensor], sizes: list[list[int]], video_input: Any
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each video's kept rows `[K, D (+ deepstack)]` and their `kept_index` `[K]` in the
        uncompressed `[N]` order: CRAFT's at the fixed ratio (every video in one call), or a
        compressed video's rows as they arrived, at their coords (`craft_coords`, `[K, 3]`
        each, `precompressed.py`)."""
        merge = self.visual.spatial_merge_size
        given = getattr(video_input, "craft_coords", None)
        if given is not None:
            out = []
            for emb, c, (_, h, w) in zip(embeds, given, sizes):
                c = c.to(emb.device)
                out.append((emb, (c[:, 0] * (h // merge) + c[:, 1]) * (w // merge) + c[:, 2]))
            return out
        coords = []  # craft-adapters' rule (timestamp_coords), so the same tokens
        for emb, size, stamps in zip(embeds, sizes, video_input.timestamps):
            coords.append(timestamp_coords(self._video_positions(size, stamps).to(emb.device)))
        main = [emb[:, : self.visual_dim] for emb in embeds]
        results = self.craft_compress(main, coords)
        out = []
        for emb, result in zip(embeds, results):
            rows = result.features.to(emb.dtype)
            if self.use_deepstack:
                kept = int(result.kept_index.shape[0])
                deep = group_mean(emb[:, self.visual_dim :], result.assignment, kept)
                rows = torch.cat([rows, deep], dim=1)
            out.append((rows, result.kept_index))
        return out

    def _postprocess_video_embeds_evs(
        self, video_embeds_split: tuple[torch.Tensor, ...], video_input: Any
    ) -> tuple[torch.Tensor, ...]:
        """Each video `[N, D (+ deepstack)]` (or a compressed video's `[K, D]`) -> rows of its
        rebuilt placeholder (kept rows at their frames, timestamp/marker text rows between)
        + 5 position columns."""
        merge = self.visual.spatial_merge_size
        sizes = video_input["video_grid_thw"].tolist()
        kept = self._craft_rows(video_embeds_split, sizes, video_input)
        out = []
        for (rows, kept_index), size, timestamps in zip(kept, sizes, video_input.timestamps):
            per_frame = (size[1] // merge) * (size[2] // merge)
            mask = torch.zeros(size[0] * per_frame, dtype=torch.bool, device=rows.device)
            mask[kept_index] = True
            counts = torch.bincount(kept_index.cpu() // per_frame, minlength=size[0])
            out.append(
                self._create_final_video_embeddings(
                    video_embeddings=rows,
                    num_tokens_per_frame=counts.tolist(),
                    timestamps=timestamps,
                    video_grid_thw=size,
                    retention_mask=mask,
                )
            )
        return tuple(out)

    def get_mrope_input_positions(
        self, input_tokens: list[int], mm_features: list[Any]
    ) -> tuple[torch.Tensor, int]:
        """Prompt positions with each compressed video's text after it where it is uncompressed.

        vLLM's own rule reads the placeholder (all kept tokens in frame 0) as frames of
        `h x w` rows, which miscounts when fewer than one frame's tokens are kept. Here each
        video's placeholder counts as text (the runner rewrites those positions from the
        kept rows when the encoder runs) and the text after it starts where it does
        uncompressed: `timestamp tokens + F * (2 + max(h, w))` positions after the video's
        start. A prompt whose video is served from the prefix cache keeps these positions.
        """
        merge = self.config.vision_config.spatial_merge_size

        def grid(f: Any) -> tuple[int, int, int, int]:
            t, h, w = (int(x) for x in f.data["video_grid_thw"].data.tolist())
            start, length = f.mm_position.offset, f.mm_position.length
            pads = input_tokens[start : start + length].count(self.config.video_token_id)
            return t, h // merge, w // merge, pads

        # An uncompressed layout (vLLM's own `_get_expanded_positions` asks for one) keeps
        # vLLM's rule.
        videos = sorted(
            (f for f in mm_features if f.modality == "video" and grid(f)[3] != prod(grid(f)[:3])),
            key=lambda f: f.mm_position.offset,
        )
        if not videos:
            return super().get_mrope_input_positions(input_tokens, mm_features)
        tokens = list(input_tokens)
        for f in videos:  # as text for vLLM's rule (-1 is no special token)
            start, length = f.mm_position.offset, f.mm_position.length
            tokens[start : start + length] = [-1] * length
        others = [f for f in mm_features if f not in videos]
        positions, _ = super().get_mrope_input_positions(tokens, others)
        positions = positions.clone()
        for f in videos:
            start, length = f.mm_position.offset, f.mm_position.length
            t, h, w, pads = grid(f)
            span = length - pads + t * max(h, w)
            positions[:, start + length :] += span - length
        delta = int(positions.max()) + 1 - len(input_tokens)
        return positions, delta


def _video_feature(grid_thw: list[int], length: int) -> MultiModalFeatureSpec:
    """A stand-in feature for vLLM's position rule: one video of `grid_thw` at offset 0."""
    elem = MultiModalFieldElem(
        data=torch.tensor(grid_thw), field=MultiModalFieldConfig.batched("video").field
    )
    return MultiModalFeatureSpec(
        data=MultiModalKwargsItem({"video_grid_thw": elem}),
        modality="video",
        identifier="craft",
        mm_position=PlaceholderRange(offset=0, length=length),
    )
