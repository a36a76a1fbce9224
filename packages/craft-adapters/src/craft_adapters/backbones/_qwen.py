"""Shared plumbing of the Qwen VLMs (M-RoPE, 2 x 2 spatial merge, `<|video_pad|>` rows)."""

from __future__ import annotations

import copy
import itertools
import sys
from typing import Any

import torch

from craft_adapters.attention import Recorder, received_attention
from craft_adapters.backbones._tiny import tiny_tokenizer
from craft_adapters.registry import BackboneAdapter, VideoLayout
from craft_core.checks import check_has_data, check_index_tensor


def _qwen_hook(recorder: Recorder) -> Any:
    def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        cu = kwargs["cu_seqlens"] if "cu_seqlens" in kwargs else args[1]
        cos, sin = kwargs["position_embeddings"]
        n = hidden.shape[0]
        with torch.no_grad():
            q, k, _ = module.qkv(hidden).reshape(n, 3, module.num_heads, -1).permute(1, 0, 2, 3)
            rope = sys.modules[type(module).__module__].apply_rotary_pos_emb_vision
            q, k = rope(q, k, cos, sin)
            q, k = q.transpose(0, 1), k.transpose(0, 1)  # [H, n, d]
            bounds = [int(b) for b in cu.tolist()]
            parts = [
                received_attention(q[:, a:b], k[:, a:b], module.scaling)
                for a, b in itertools.pairwise(bounds)
                if b > a
            ]
        recorder.calls.append(torch.cat(parts))

    return hook


def check_video_grid(pixels: Any, grid: Any, merge: int) -> None:
    """`video_grid_thw` `[V, 3]` (t, h, w patches per video) must describe exactly the rows of
    `pixel_values_videos` `[sum t*h*w, C*T*P*P]`: a grid that claims more frames than the
    pixels hold otherwise ends in an IndexError deep inside transformers."""
    check_index_tensor("video_grid_thw", grid, dim=2)
    if grid.shape[1] != 3 or grid.shape[0] < 1:
        raise ValueError(
            f"video_grid_thw must be [videos, 3] (t, h, w), got shape {tuple(grid.shape)}"
        )
    if not isinstance(pixels, torch.Tensor) or not pixels.is_floating_point():
        what = pixels.dtype if isinstance(pixels, torch.Tensor) else type(pixels).__name__
        raise TypeError(f"pixel_values_videos must be a floating tensor, got {what}")
    if pixels.dim() != 2:
        raise ValueError(
            f"pixel_values_videos must be [patches, C*T*P*P] (Qwen processor output), got "
            f"shape {tuple(pixels.shape)}"
        )
    check_has_data("pixel_values_videos", pixels)
    cells = grid.long().cpu()
    if bool((cells < 1).any()):
        raise ValueError(f"video_grid_thw entries must be >= 1, got {cells.tolist()}")
    if bool((cells[:, 1:] % merge).any()):
        raise ValueError(
            f"video_grid_thw h and w must be multiples of spatial_merge_size {merge}, got "
            f"{cells.tolist()}"
        )
    claimed = int(cells.prod(dim=1).sum())
    if claimed != pixels.shape[0]:
        raise ValueError(
            f"video_grid_thw {cells.tolist()} claims {claimed} patch rows but "
            f"pixel_values_videos holds {pixels.shape[0]}; pass the outputs of one processor "
            "call together"
        )


def tiny_qwen_processor(
    processor_cls: Any,
    video_cls: Any,
    template: str,
    patch: int,
    sizes: tuple[dict[str, int], dict[str, int]],
    **video_extra: Any,
) -> Any:
    """A tiny Qwen-family processor: byte-level tokenizer, Qwen2-VL image processor and the
    backbone's video processor (`sizes`: image, video; 2 x 2 merge, temporal patch 2)."""
    from transformers import Qwen2VLImageProcessor

    image_size, video_size = sizes
    return processor_cls(
        image_processor=Qwen2VLImageProcessor(size=image_size, patch_size=patch, merge_size=2),
        tokenizer=tiny_tokenizer(template),
        video_processor=video_cls(
            size=video_size,
            patch_size=patch,
            merge_size=2,
            temporal_patch_size=2,
            cap_pixels_per_frame=False,
            **video_extra,
        ),
        chat_template=template,
    )


class QwenAdapter(BackboneAdapter):
    """Common to Qwen2.5-VL, Qwen3-VL and Qwen3.5."""

    uses_mrope = True
    rope_index_takes_second_per_grid = False
    saves_compressed_videos = True

    def video_grids(
        self, inputs: dict[str, Any]
    ) -> list[tuple[tuple[int, int, int], dict[str, Any]]]:
        """Each video's grid of merged tokens from `video_grid_thw` (patches / merge), and
        its seconds per grid step where the processor gives them (`second_per_grid_ts`)."""
        merge = self._merge_size()
        seconds = inputs.get("second_per_grid_ts")
        out = []
        for i, (t, h, w) in enumerate(inputs["video_grid_thw"].tolist()):
            meta = {} if seconds is None else {"second_per_grid": float(seconds[i])}
            out.append(((int(t), int(h) // merge, int(w) // merge), meta))
        return out

    def encode_videos(self, inputs: dict[str, Any]) -> tuple[Any, list[torch.Tensor]]:
        grid = inputs.get("video_grid_thw")
        if grid is None:
            raise ValueError(
                "pixel_values_videos given without video_grid_thw (pass all processor outputs)"
            )
        check_video_grid(inputs["pixel_values_videos"], grid, self._merge_size())
        out = self.model.model.get_video_features(
            inputs["pixel_values_videos"], grid, return_dict=True
        )
        return out, list(out.pooler_output)

    def _merge_size(self) -> int:
        return int(getattr(self.model.config.vision_config, "spatial_merge_size", 1))

    def encode_images(self, inputs: dict[str, Any]) -> Any | None:
        if inputs.get("pixel_values") is None:
            return None
        return self.model.model.get_image_features(
            inputs["pixel_values"], inputs.get("image_grid_thw"), return_dict=True
        )

    def full_positions(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        mm = inputs.get("mm_token_type_ids")
        if mm is None:
            raise ValueError(
                f"{self.config.model_type}: mm_token_type_ids is missing; pass every output of the "
                "processor (without it M-RoPE positions cannot be computed)"
            )
        kwargs: dict[str, Any] = {
            "input_ids": inputs["input_ids"],
            "mm_token_type_ids": mm,
            "image_grid_thw": inputs.get("image_grid_thw"),
            "video_grid_thw": inputs.get("video_grid_thw"),
            "attention_mask": inputs.get("attention_mask"),
        }
        if self.rope_index_takes_second_per_grid:
            kwargs["second_per_grid_ts"] = inputs.get("second_per_grid_ts")
        # get_rope_index edits video_grid_thw in place in some versions: hand it a copy.
        if kwargs["video_grid_thw"] is not None:
            kwargs["video_grid_thw"] = kwargs["video_grid_thw"].clone()
        positions, deltas = self.model.model.get_rope_index(**kwargs)
        return positions, deltas

    def _video_coords(self, pos: torch.Tensor) -> torch.Tensor:
        """`(t, h, w)` [n, 3] of one video from its M-RoPE rows `pos` [3, n]."""
        raise NotImplementedError

    def video_layout(
        self, inputs: dict[str, Any], positions: torch.Tensor, features: list[torch.Tensor]
    ) -> list[VideoLayout]:
        flat = self.video_mask(inputs).nonzero()  # [K, 2] (batch, seq), row-major
        layouts: list[VideoLayout] = []
        start = 0
        for feats in features:
            n = int(feats.shape[0])
            rows = flat[start : start + n]
            start += n
            b = int(rows[0, 0])
            if bool((rows[:, 0] != b).any()):
                raise ValueError("a video's placeholder tokens span two rows of the batch")
            seq = rows[:, 1]
            pos = positions[:, b, seq]
            layouts.append(
                VideoLayout(
                    batch_index=b,
                    seq_index=seq,
                    compress_rows=torch.arange(n, device=seq.device),
                    coords=self._video_coords(pos),
                )
            )
        return layouts

    def shrink_video_output(
        self,
        output: Any,
        kept_rows: list[torch.Tensor],
        new_features: list[torch.Tensor],
        assignments: list[torch.Tensor],
    ) -> Any:
        new = copy.copy(output)
        new.pooler_output = tuple(new_features)
        return new

    def attention_hooks(self, recorder: Recorder) -> list[Any]:
        """Pre-hooks recording the last ViT block's received attention and each call's
        `grid_thw` (craft_adapters.attention)."""
        visual = self.model.model.visual

        def grid_hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            recorder.grid_thw.append(args[1] if len(args) > 1 else kwargs["grid_thw"])

        return [
            visual.blocks[-1].attn.register_forward_pre_hook(
                _qwen_hook(recorder), with_kwargs=True
            ),
            visual.register_forward_pre_hook(grid_hook, with_kwargs=True),
        ]

    def received_attention(self, recorder: Recorder) -> torch.Tensor:
        """`[total merged tokens]` received attention in the order of the merged features."""
        visual = self.model.model.visual
        unit = visual.spatial_merge_size**2
        out = []
        for received, grid in zip(recorder.calls, recorder.grid_thw):
            merged = received.view(-1, unit).mean(dim=1)
            if hasattr(visual, "window_size"):  # Qwen2.5-VL: blocks run in window order
                from transformers.vision_utils import get_vision_window_index

                window_index, _ = get_vision_window_index(
                    grid,
                    spatial_merge_size=visual.spatial_merge_size,
                    window_size=visual.window_size,
                    patch_size=visual.patch_size,
                )
                merged = merged[torch.argsort(window_index.to(merged.device))]
            out.append(merged)
        return torch.cat(out)
