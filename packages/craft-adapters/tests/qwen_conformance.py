"""The conformance fixtures the Qwen-family backbones share (M-RoPE, 2 x 2 merge, one
`video_grid_thw` row per video); each Qwen test file subclasses `QwenConformance` and says
how its temporal coordinate is made (`temporal`)."""

from __future__ import annotations

from typing import Any

import torch
from adapters_conformance import BackboneConformance, Video


class QwenConformance(BackboneConformance):
    def temporal(
        self, model: Any, inputs: Any, video: int, group: torch.Tensor, t_row: torch.Tensor
    ) -> torch.Tensor:
        """`[n]` expected t of video `video` from each row's temporal group and the plain
        model's temporal position row `t_row` `[n]`."""
        raise NotImplementedError

    def expected_videos(self, model: Any, inputs: Any, positions: torch.Tensor) -> list[Video]:
        merge = model.config.vision_config.spatial_merge_size
        # the processor's own marking of video rows (2), whatever token holds them
        placeholders = (inputs["mm_token_type_ids"][0] == 2).nonzero().squeeze(1)
        out, start = [], 0
        for v, (gt, gh, gw) in enumerate(inputs["video_grid_thw"].tolist()):
            gh, gw = gh // merge, gw // merge
            n = gt * gh * gw
            seq = placeholders[start : start + n]
            start += n
            idx = torch.arange(n)
            group = idx // (gh * gw)
            t = self.temporal(model, inputs, v, group, positions[0, 0, seq])
            out.append(Video(seq, torch.stack([t, (idx % (gh * gw)) // gw, idx % gw], dim=-1)))
        return out

    def attention_layer(self, model: Any) -> torch.nn.Module:
        return model.model.visual.blocks[-1].attn  # type: ignore[no-any-return]

    def patch_order(self, model: Any, inputs: Any, features: list[torch.Tensor]) -> Any:
        """Which merged row of the last block's order each feature row is (None: the same)."""
        return None

    def attention_to_tokens(
        self, model: Any, inputs: Any, features: list[torch.Tensor], received: list[torch.Tensor]
    ) -> torch.Tensor:
        """Per patch (the spans' keys in the block's order), mean of each merge group."""
        unit = model.config.vision_config.spatial_merge_size**2
        merged = torch.cat([r[0] for r in received]).view(-1, unit).mean(dim=1)
        order = self.patch_order(model, inputs, features)
        return merged if order is None else merged[order]


def timestamp_t(group: torch.Tensor, t_row: torch.Tensor) -> torch.Tensor:
    """Qwen3-VL / Qwen3.5: each temporal group is its own placeholder run after a text
    timestamp; t is where its run starts, counted from the first run (model units)."""
    starts = torch.stack([t_row[group == g][0] for g in range(int(group.max()) + 1)])
    return starts[group] - starts[0]


def assert_frame_timestamps(processor: Any, inputs: Any) -> None:
    """Qwen3-VL / Qwen3.5 write each frame group's timestamp `k / fps` before its run (four
    frames at 2 fps: groups of two frames, centred at 0.2 s and 1.2 s here)."""
    text = processor.tokenizer.decode(inputs["input_ids"][0])
    assert "<0.2 seconds>" in text and "<1.2 seconds>" in text, text
