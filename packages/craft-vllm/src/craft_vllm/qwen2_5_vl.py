"""CRAFT variant of vLLM's Qwen2.5-VL: `CraftQwen2_5_VLForConditionalGeneration`.

Three hooks of vLLM's video pruning (the ones its EVS uses), nothing else changed:

- the processor reserves `floor(N / ratio)` placeholders per video (`_get_prompt_updates`);
- `embed_multimodal` runs the vision tower, then CRAFT on each video's `[N, D]` rows, and
  appends each kept row's original `(t, h, w)` (`positions.py`); the runner recomputes the
  sequence's M-RoPE positions from them;
- `get_mrope_input_positions` gives the text after a video the positions it has
  uncompressed, so prefix-cached prompts need no encoder run to be right.

Images pass through uncompressed (with position columns, as the runner expects of every
item once pruning is on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import torch
from vllm.model_executor.models.qwen2_5_vl import (
    Qwen2_5_VLDummyInputsBuilder,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLMultiModalProcessor,
    Qwen2_5_VLProcessingInfo,
)
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.processing import PromptReplacement

from craft_vllm.common import attach_compressor, check_settings
from craft_vllm.options import kept_count, read_options
from craft_vllm.positions import grid_positions, prompt_positions, pruned_position_columns

ARCHITECTURE = "CraftQwen2_5_VLForConditionalGeneration"


class CraftQwen2_5_VLMultiModalProcessor(Qwen2_5_VLMultiModalProcessor):
    """Reserves `floor(N / ratio)` `<|video_pad|>` per video (N = the video's merged tokens)."""

    def _get_prompt_updates(
        self, mm_items: Any, hf_processor_mm_kwargs: Mapping[str, Any], out_mm_kwargs: Any
    ) -> Sequence[PromptReplacement]:
        ratio = read_options(self.info.get_hf_config(), ARCHITECTURE).ratio
        hf_processor = self.info.get_hf_processor(**hf_processor_mm_kwargs)
        merge = self.info.get_image_processor(**hf_processor_mm_kwargs).merge_size
        vocab = self.info.get_tokenizer().get_vocab()
        token = {"image": vocab[hf_processor.image_token], "video": vocab[hf_processor.video_token]}

        def replacement(item_idx: int, modality: str) -> list[int]:
            grid = out_mm_kwargs[modality][item_idx][f"{modality}_grid_thw"].data
            n = int(grid.prod()) // (merge * merge)
            if modality == "video":
                n = kept_count(n, ratio)
            return [token[modality]] * n

        return [
            PromptReplacement(
                modality=m, target=[token[m]], replacement=partial(replacement, modality=m)
            )
            for m in ("image", "video")
        ]


@MULTIMODAL_REGISTRY.register_processor(
    CraftQwen2_5_VLMultiModalProcessor,
    info=Qwen2_5_VLProcessingInfo,
    dummy_inputs=Qwen2_5_VLDummyInputsBuilder,
)
class CraftQwen2_5_VLForConditionalGeneration(Qwen2_5_VLForConditionalGeneration):
    """Qwen2.5-VL whose video tokens go through a CRAFT checkpoint at a fixed ratio."""

    craft_compression = True  # read by the runner patch in plugin.py

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        self.craft_options = check_settings(vllm_config, ARCHITECTURE)  # before any weight
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        attach_compressor(self, vllm_config)

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
        """Each video `[N, D]` -> `[floor(N / ratio), D + 4]` (CRAFT rows + position columns)."""
        merge = self.visual.spatial_merge_size
        seconds = video_input.get("second_per_grid_ts")
        per_second = float(getattr(self.config.vision_config, "tokens_per_second", 1.0))
        ratio = self.craft_options.ratio
        out = []
        for i, (emb, (t, h, w)) in enumerate(
            zip(video_embeds_split, video_input["video_grid_thw"].tolist())
        ):
            factor = per_second * (float(seconds[i]) if seconds is not None else 1.0)
            grid = grid_positions(t, h // merge, w // merge, factor)
            kept_count(grid.shape[1], ratio)  # refuse a ratio that leaves nothing, never clamp
            coords = torch.from_numpy(grid).T.to(emb.device)
            result = self.craft(emb, coords, ratio=ratio)
            cols = pruned_position_columns(grid, result.kept_index).to(emb.device, emb.dtype)
            out.append(torch.cat([result.features.to(emb.dtype), cols], dim=1))
        return tuple(out)

    def get_mrope_input_positions(
        self, input_tokens: list[int], mm_features: list[Any]
    ) -> tuple[torch.Tensor, int]:
        items = []
        ordered = sorted(mm_features, key=lambda f: f.mm_position.offset)
        for feature, (offset, t, h, w, factor) in zip(ordered, self.iter_mm_grid_thw(ordered)):
            items.append((offset, feature.mm_position.length, grid_positions(t, h, w, factor)))
        return prompt_positions(len(input_tokens), items)
