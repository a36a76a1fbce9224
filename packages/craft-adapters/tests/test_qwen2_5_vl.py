"""Qwen2.5-VL (`qwen2_5_vl`): the conformance suite. t is the time-scaled temporal index;
its vision blocks run in window order (undone for the received attention)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from qwen_conformance import QwenConformance


class TestQwen25VL(QwenConformance):
    model_type = "qwen2_5_vl"

    def temporal(self, model: Any, inputs: Any, video: int, group: Any, t_row: Any) -> Any:
        interval = model.config.vision_config.tokens_per_second * float(
            inputs["second_per_grid_ts"][video]
        )
        return (group * interval).long()

    def test_fps_reaches_the_time_scaling(self, case: tuple[Any, Any]) -> None:
        """Two frames per temporal group at 2 fps: one second per grid step."""
        inputs = self.inputs(case[1])
        assert inputs["second_per_grid_ts"][0] == pytest.approx(1.0)

    def patch_order(self, model: Any, inputs: Any, features: list[torch.Tensor]) -> Any:
        """The merger's rows (window order) matched to the feature rows by value."""
        merged: list[torch.Tensor] = []
        handle = model.model.visual.merger.register_forward_hook(
            lambda _m, _a, out: merged.append(out)
        )
        try:
            with torch.no_grad():
                model.model.get_video_features(
                    inputs["pixel_values_videos"], inputs["video_grid_thw"]
                )
        finally:
            handle.remove()
        rows = torch.cat(features)
        match = torch.cdist(rows, merged[0]).argmin(dim=1)
        assert torch.equal(torch.sort(match).values, torch.arange(rows.shape[0]))
        return match
