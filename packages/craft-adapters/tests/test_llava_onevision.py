"""LLaVA-OneVision (`llava_onevision`): the conformance suite (1-D RoPE, a pooled P x P grid
per frame), and the newline row that closes each video."""

from __future__ import annotations

import math
from typing import Any

import torch
from adapters_conformance import BackboneConformance, RuleCompressor, Video

from craft_adapters import wrap


class TestLlavaOnevision(BackboneConformance):
    model_type = "llava_onevision"
    saves_compressed_videos = True  # the grid rows (the newline row is the model's own)

    @staticmethod
    def side(model: Any) -> int:
        vc = model.config.vision_config
        return math.ceil(vc.image_size // vc.patch_size / 2)

    def expected_videos(self, model: Any, inputs: Any, positions: torch.Tensor) -> list[Video]:
        """One video per prompt: its placeholders but the last (the newline), frame by
        frame, each frame the row-major pooled grid."""
        ids = inputs["input_ids"][0]
        seq = (ids == model.config.video_token_index).nonzero().squeeze(1)[:-1]
        side = self.side(model)
        idx = torch.arange(seq.numel())
        coords = torch.stack([idx // side**2, (idx % side**2) // side, idx % side], dim=-1)
        return [Video(seq, coords)]

    def attention_layer(self, model: Any) -> torch.nn.Module:
        tower = model.model.vision_tower
        layers = getattr(tower, "vision_model", tower).encoder.layers
        j = model.config.vision_feature_layer
        return layers[len(layers) + j if j < 0 else j - 1].self_attn  # type: ignore[no-any-return]

    def attention_to_tokens(
        self, model: Any, inputs: Any, features: list[torch.Tensor], received: list[torch.Tensor]
    ) -> torch.Tensor:
        """Each frame's per-patch attention pooled by the model's own pooling (no newline)."""
        grid = torch.cat(received).float()  # [frames, patches]
        return model.model.apply_pooling(grid[:, :, None]).flatten()  # type: ignore[no-any-return]

    @torch.no_grad()
    def test_newline_always_survives(self, case: tuple[Any, Any]) -> None:
        model, processor = case
        inputs = self.inputs(processor)
        wrapped = wrap(model, RuleCompressor(), ratio=4.0)
        rows: list[torch.Tensor] = []
        hook = model.model.language_model.register_forward_pre_hook(
            lambda _m, a, k: rows.append(k["inputs_embeds"].clone()), with_kwargs=True
        )
        try:
            wrapped(**inputs)
        finally:
            hook.remove()
        ids = inputs["input_ids"][0]
        video_pos = (ids == wrapped.adapter.video_token_id).nonzero().squeeze(1)
        kept = wrapped.compressed_index(0)
        assert int(video_pos[-1]) in kept.tolist()  # the newline row is the last video token
        c_ids = ids[kept]
        last_video = int((c_ids == wrapped.adapter.video_token_id).nonzero()[-1])
        assert torch.equal(rows[0][0, last_video], model.model.image_newline)
