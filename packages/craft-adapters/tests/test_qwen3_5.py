"""Qwen3.5 (`qwen3_5`, the primary backbone): the conformance suite. Its hybrid
Gated-DeltaNet states make the session check (a deep copy of the cache per question) matter."""

from __future__ import annotations

from typing import Any

from qwen_conformance import QwenConformance, assert_frame_timestamps, timestamp_t


class TestQwen35(QwenConformance):
    model_type = "qwen3_5"

    def temporal(self, model: Any, inputs: Any, video: int, group: Any, t_row: Any) -> Any:
        return timestamp_t(group, t_row)

    def test_frame_timestamps_in_the_prompt(self, case: tuple[Any, Any]) -> None:
        assert_frame_timestamps(case[1], self.inputs(case[1]))
