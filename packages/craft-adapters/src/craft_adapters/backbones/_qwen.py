"""Shared plumbing of the Qwen VLMs (M-RoPE, 2 x 2 spatial merge, `<|video_pad|>` rows)."""

from __future__ import annotations

import copy
from typing import Any

import torch

from craft_adapters.registry import BackboneAdapter, VideoLayout


def group_mean(rows: torch.Tensor, assignment: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Mean of `rows` [n, D] over the groups given by `assignment` [n] -> [num_groups, D].

    A group of one row returns that row exactly (x * 1 / 1).
    """
    out = rows.new_zeros(num_groups, rows.shape[-1])
    out = out.index_add(0, assignment, rows)
    counts = torch.bincount(assignment, minlength=num_groups).clamp_min(1)
    return out / counts.to(rows.dtype).unsqueeze(-1)


class QwenAdapter(BackboneAdapter):
    """Common to Qwen2.5-VL, Qwen3-VL and Qwen3.5."""

    uses_mrope = True
    rope_index_takes_second_per_grid = False

    def encode_videos(self, inputs: dict[str, Any]) -> tuple[Any, list[torch.Tensor]]:
        grid = inputs.get("video_grid_thw")
        if grid is None:
            raise ValueError(
                "pixel_values_videos given without video_grid_thw (pass all processor outputs)"
            )
        out = self.model.model.get_video_features(
            inputs["pixel_values_videos"], grid, return_dict=True
        )
        return out, list(out.pooler_output)

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
        input_ids = inputs["input_ids"]
        flat = (input_ids == self.video_token_id).nonzero()  # [K, 2] (batch, seq), row-major
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
