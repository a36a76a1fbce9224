"""InternVL3 / InternVL3.5 (`internvl`): InternViT tiles, pixel shuffle, a Qwen LLM, 1-D RoPE.

transformers' `InternVLProcessor` turns a video into one tile per frame (448 x 448 on the
real checkpoints), writes each frame as `Frame{i}: <img><IMG_CONTEXT> x 256</img>` and
MERGES the frames into `pixel_values` `[frames, 3, H, W]` (there is no
`pixel_values_videos`); the model scatters `mm_encoder_outputs["image"]` into the
`<IMG_CONTEXT>` placeholders. So here an InternVL prompt's `pixel_values` are video frames,
one video per prompt row (the processor does not tell images from frames: a compressor is
for video prompts; pass image prompts to the unwrapped model).

Each frame's ViT grid (32 x 32 patches of 14 px) is pixel-shuffled, 2 x 2 patches into one
token, to a 16 x 16 grid stored row-major: token `i` of frame `f` is `(t, h, w) =
(f, i // 16, i % 16)`. Every row may be compressed. The language model uses 1-D RoPE: kept
tokens keep their original position and decoding continues from the full sequence's
length, as for LLaVA-OneVision. Received attention (`needs_attention`): the InternViT layer
whose output is the selected feature, per frame, CLS column dropped, averaged over each
2 x 2 pixel-shuffle group.
"""

from __future__ import annotations

from typing import Any

import torch

from craft_adapters import registry
from craft_adapters.attention import Recorder, per_image_hook
from craft_adapters.backbones._tiny import (
    chat_template,
    extra_token_ids,
    text_common,
    tiny_tokenizer,
)

# The tokenizer's InternVL tokens (attribute -> token), as in the real tokenizer_config.json.
TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}
TEMPLATE = chat_template("<video>\n", "<IMG_CONTEXT>\n")  # the real checkpoints', no system
TINY_TILE = 112  # tiny tiles: 8 x 8 patches of 14 px -> 4 x 4 = 16 tokens per frame
TINY_TOKENS = (TINY_TILE // 14 // 2) ** 2  # after the 0.5 pixel shuffle


@registry.register_backbone
class InternVLAdapter(registry.BackboneAdapter):
    model_types = ("internvl",)
    uses_mrope = False
    video_pixels_key = "pixel_values"  # the processor merges a video's frames into it
    encoder_output_key = "image"
    input_rules = registry.InputRules(processors=("InternVLProcessor",))  # fixed 448 px tiles
    reference_archs = (("internvl3_5-8b", "internvl3.5-8b"),)
    lmms_classes = registry.LmmsClasses(
        "internvl_hf", chat="chat.internvl_hf:InternVLHf"
    )  # no simple

    saves_compressed_videos = True  # every frame token (craft-vllm serves them)

    def video_grids(
        self, inputs: dict[str, Any]
    ) -> list[tuple[tuple[int, int, int], dict[str, Any]]]:
        """Each video's `(F, side, side)` grid: one video per prompt row, F its frames."""
        per_frame = self.grid_side**2
        counts = (inputs["input_ids"] == self.video_token_id).sum(dim=1)
        side = self.grid_side
        return [((int(n) // per_frame, side, side), {}) for n in counts if int(n) > 0]

    @property
    def video_token_id(self) -> int:
        return int(self.config.image_token_id)

    @property
    def grid_side(self) -> int:
        """Tokens per side of one frame after the pixel shuffle (16 on the real checkpoints)."""
        vc = self.config.vision_config
        return int(vc.image_size[0] // vc.patch_size[0] * self.config.downsample_ratio)

    def encode_videos(self, inputs: dict[str, Any]) -> tuple[Any, list[torch.Tensor]]:
        """One video per prompt row: that row's frames, `[frames * side^2, D]` rows."""
        pixels = inputs["pixel_values"]
        if not isinstance(pixels, torch.Tensor) or pixels.dim() != 4:
            raise ValueError(
                "InternVL pixel_values must be one [frames, 3, H, W] tensor (processor output)"
            )
        out = self.model.model.get_image_features(pixel_values=pixels, return_dict=True)
        frames = out.pooler_output  # [F, side^2, D]
        per_row = (inputs["input_ids"] == self.video_token_id).sum(dim=1) // frames.shape[1]
        if int(per_row.sum()) != frames.shape[0]:
            raise ValueError(
                f"input_ids hold placeholders for {int(per_row.sum())} frames but pixel_values "
                f"holds {frames.shape[0]}; pass the outputs of one processor call together"
            )
        chunks = torch.split(frames, [int(n) for n in per_row if n > 0])
        return out, [c.reshape(-1, c.shape[-1]) for c in chunks]

    def video_layout(
        self, inputs: dict[str, Any], positions: torch.Tensor, features: list[torch.Tensor]
    ) -> list[registry.VideoLayout]:
        ids = inputs["input_ids"]
        rows_with_video = [
            b for b in range(ids.shape[0]) if bool((ids[b] == self.video_token_id).any())
        ]
        side = self.grid_side
        layouts = []
        for b, feats in zip(rows_with_video, features):
            seq = (ids[b] == self.video_token_id).nonzero().squeeze(1)
            idx = torch.arange(int(feats.shape[0]), device=ids.device)
            coords = registry.frame_grid_coords(int(feats.shape[0]), side, ids.device)
            layouts.append(
                registry.VideoLayout(batch_index=b, seq_index=seq, compress_rows=idx, coords=coords)
            )
        return layouts

    def attention_hooks(self, recorder: Recorder) -> list[Any]:
        """A pre-hook on the InternViT layer whose output is the selected feature."""
        layer = int(self.config.vision_feature_layer)
        layers = self.model.model.vision_tower.encoder.layer
        attn = layers[layer if layer >= 0 else len(layers) + layer].attention
        return [attn.register_forward_pre_hook(per_image_hook(recorder), with_kwargs=True)]

    def received_attention(self, recorder: Recorder) -> torch.Tensor:
        """`[total tokens]` received attention, averaged over each 2 x 2 shuffle group."""
        side = self.grid_side
        out = []
        for received in recorder.calls:
            grid = received[:, 1:].reshape(-1, side, 2, side, 2)  # CLS dropped, as the features
            out.append(grid.mean(dim=(2, 4)).flatten())
        return torch.cat(out)

    @staticmethod
    def tiny_config() -> Any:
        """A tiny random config of this backbone (`craft_adapters.tiny.build_tiny_vlm`)."""
        from transformers import InternVLConfig

        text = {**text_common(), "model_type": "qwen3", "head_dim": 16}  # InternVL3.5: Qwen3
        vision = {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": TINY_TILE,
            "patch_size": 14,
        }
        return InternVLConfig(
            text_config=text,
            vision_config=vision,
            image_token_id=extra_token_ids(list(TOKENS.values()))["<IMG_CONTEXT>"],
            image_seq_length=TINY_TOKENS,
            downsample_ratio=0.5,
            vision_feature_layer=-1,
            vision_feature_select_strategy="default",
        )

    @staticmethod
    def tiny_processor() -> Any:
        """The in-memory processor of `tiny_config`'s model (`build_tiny_processor`)."""
        from transformers import GotOcr2ImageProcessor, InternVLProcessor, InternVLVideoProcessor

        size = {"height": TINY_TILE, "width": TINY_TILE}
        return InternVLProcessor(
            image_processor=GotOcr2ImageProcessor(size=size, crop_to_patches=False),
            tokenizer=tiny_tokenizer(TEMPLATE, TOKENS),
            video_processor=InternVLVideoProcessor(size=size),
            image_seq_length=TINY_TOKENS,
            chat_template=TEMPLATE,
        )
