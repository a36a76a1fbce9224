"""Qwen3-VL (`qwen3_vl`): the conformance suite, and its deepstack policy."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from adapters_conformance import RuleCompressor, keep_rule
from qwen_conformance import QwenConformance, assert_frame_timestamps, timestamp_t

from craft_adapters import load_compressed_video, save_compressed_video, wrap


class TestQwen3VL(QwenConformance):
    model_type = "qwen3_vl"

    def temporal(self, model: Any, inputs: Any, video: int, group: Any, t_row: Any) -> Any:
        return timestamp_t(group, t_row)

    def test_frame_timestamps_in_the_prompt(self, case: tuple[Any, Any]) -> None:
        assert_frame_timestamps(case[1], self.inputs(case[1]))

    @torch.no_grad()
    def test_deepstack_shrunk_with_the_same_groups(self, case: tuple[Any, Any]) -> None:
        """Each kept row's deepstack row is the mean of its group's (slow loop here)."""
        model, processor = case
        inputs = self.inputs(processor)
        seen: list[dict[str, Any]] = []
        hook = model.model.language_model.register_forward_pre_hook(
            lambda _m, a, k: seen.append(k["deepstack_visual_embeds"]), with_kwargs=True
        )
        comp = RuleCompressor()
        try:
            model(**inputs)
            wrap(model, comp, ratio=2.0)(**inputs)
        finally:
            hook.remove()
        full, compressed = seen
        kept, assign = keep_rule(comp.coords[0])
        for deep_full, deep_comp in zip(full, compressed):
            want = torch.stack([deep_full[assign == j].mean(0) for j in range(kept.numel())])
            torch.testing.assert_close(deep_comp, want, rtol=0, atol=1e-6)

    @torch.no_grad()
    def test_saved_video_carries_the_deepstack_rows(self, case: tuple[Any, Any], tmp_path) -> None:
        """`compress_videos` -> file -> load: each kept token's deepstack rows (levels side by
        side, what craft-vllm serves) are the mean of its group's (slow loop here)."""
        model, processor = case
        inputs = self.inputs(processor)
        seen: list[Any] = []
        hook = model.model.language_model.register_forward_pre_hook(
            lambda _m, a, k: seen.append(k["deepstack_visual_embeds"]), with_kwargs=True
        )
        try:
            model(**inputs)
        finally:
            hook.remove()
        comp = RuleCompressor()
        (video,) = wrap(model, comp, ratio=2.0).compress_videos(**inputs)
        path = save_compressed_video(tmp_path / "v.craft.safetensors", video)
        loaded = load_compressed_video(path)
        kept, assign = keep_rule(comp.coords[0])
        want = [
            torch.stack([level[assign == j].mean(0) for j in range(kept.numel())])
            for level in seen[0]
        ]
        assert loaded.deepstack is not None and len(want) >= 1
        torch.testing.assert_close(loaded.deepstack, torch.cat(want, 1), rtol=0, atol=1e-6)

    def test_missing_mm_token_type_ids_is_named(self, case: tuple[Any, Any]) -> None:
        model, processor = case
        inputs = dict(self.inputs(processor))
        inputs.pop("mm_token_type_ids")
        with pytest.raises(ValueError, match="mm_token_type_ids is missing"):
            wrap(model, RuleCompressor(), ratio=2.0)(**inputs)
