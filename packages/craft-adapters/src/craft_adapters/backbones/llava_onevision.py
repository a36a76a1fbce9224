"""LLaVA-OneVision (`llava_onevision`): SigLIP grid pooled to P x P per frame + one newline.

Only the `F x P x P` grid rows are compressed (P = 14 on the real checkpoints); the single
`image_newline` row that ends each video always survives. The language model uses 1D RoPE:
kept tokens keep their original 1D position (`attention_mask.cumsum(-1) - 1`) and decoding
continues from the original sequence length. The `(t, h, w)` handed to the compressor are
built from the known layout (frame index, row, column of the pooled grid).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from craft_adapters.attention import Recorder, per_image_hook
from craft_adapters.backbones._tiny import LLAVA_TEMPLATE, SPECIAL_IDS, text_common, tiny_tokenizer
from craft_adapters.registry import (
    BackboneAdapter,
    InputRules,
    LmmsClasses,
    VideoLayout,
    frame_grid_coords,
    register_backbone,
)


def _siglip_layer(model: Any) -> Any:
    config = model.config
    layer = getattr(config, "vision_feature_layer", -1)
    if not isinstance(layer, int):
        raise ValueError(
            f"received attention needs one vision_feature_layer, got {layer!r} (a list)"
        )
    tower = model.model.vision_tower
    layers = getattr(tower, "vision_model", tower).encoder.layers
    if layer == 0 or abs(layer) > len(layers):
        raise ValueError(f"vision_feature_layer {layer} selects no attention layer")
    return layers[len(layers) + layer if layer < 0 else layer - 1].self_attn


@register_backbone
class LlavaOnevisionAdapter(BackboneAdapter):
    model_types = ("llava_onevision",)
    uses_mrope = False
    # a fixed input size (no pixel bounds); pixel_values_videos is [B, F, C, H, W], so videos
    # of different lengths go through the processor one at a time
    input_rules = InputRules(processors=("LlavaOnevisionProcessor",), one_call_per_length=True)
    reference_archs = (("llava_ov-7b", "llava-ov-7b", "llava-onevision-7b"),)
    # simple only: lmms-eval 0.7.3's chat `llava_hf` hands the processor `images=[]` for a
    # video-only request, which transformers 5 rejects (IndexError in the image processor)
    lmms_classes = LmmsClasses("llava_hf", simple="simple.llava_hf:LlavaHf")

    @classmethod
    def expand_video_prompt(cls, processor: Any, text: str, num_frames: int) -> str:
        """F x P x P + 1 placeholders, as `LlavaOnevisionProcessor.replace_video_token`
        counts them."""
        side = int(math.sqrt(processor.num_image_tokens))
        pooled = math.ceil(side / 2)
        n = num_frames * pooled * pooled + 1
        return text.replace(processor.video_token, processor.video_token * n, 1)

    saves_compressed_videos = True  # the grid rows; the newline row is the model's own

    def video_grids(
        self, inputs: dict[str, Any]
    ) -> list[tuple[tuple[int, int, int], dict[str, Any]]]:
        """Each video's `(F, P, P)` pooled grid (the newline row is not in it)."""
        pv = inputs["pixel_values_videos"]
        frames = [int(v.shape[-4]) for v in pv] if isinstance(pv, (list, tuple)) else None
        if frames is None:
            frames = [int(pv.shape[1])] * int(pv.shape[0])
        return [((f, self.pooled_side, self.pooled_side), {}) for f in frames]

    @property
    def pooled_side(self) -> int:
        vc = self.config.vision_config
        return math.ceil((vc.image_size // vc.patch_size) / 2)

    def encode_videos(self, inputs: dict[str, Any]) -> tuple[Any, list[torch.Tensor]]:
        pv = inputs["pixel_values_videos"]
        if isinstance(pv, (list, tuple)):  # videos of different lengths, one tensor each
            feats: list[torch.Tensor] = []
            for v in pv:
                v = v if v.dim() == 5 else v.unsqueeze(0)
                out = self.model.model.get_video_features(pixel_values_videos=v, return_dict=True)
                feats.extend(list(out.pooler_output))
            return None, feats
        out = self.model.model.get_video_features(pixel_values_videos=pv, return_dict=True)
        return out, list(out.pooler_output)

    def encode_images(self, inputs: dict[str, Any]) -> Any | None:
        if inputs.get("pixel_values") is None:
            return None
        return self.model.model.get_image_features(
            inputs["pixel_values"],
            inputs.get("image_sizes"),
            batch_num_images=inputs.get("batch_num_images"),
            return_dict=True,
        )

    def video_layout(
        self, inputs: dict[str, Any], positions: torch.Tensor, features: list[torch.Tensor]
    ) -> list[VideoLayout]:
        ids = inputs["input_ids"]
        flat = (ids == self.video_token_id).nonzero()
        side = self.pooled_side
        per_frame = side * side
        layouts = []
        start = 0
        for feats in features:
            n = int(feats.shape[0])
            if (n - 1) % per_frame:
                raise ValueError(
                    f"LLaVA-OneVision video has {n} feature rows; expected F x {per_frame} + 1"
                )
            rows = flat[start : start + n]
            start += n
            b = int(rows[0, 0])
            if bool((rows[:, 0] != b).any()):
                raise ValueError("a video's placeholder tokens span two rows of the batch")
            idx = torch.arange(n - 1, device=ids.device)
            coords = frame_grid_coords(n - 1, side, ids.device)
            layouts.append(
                VideoLayout(batch_index=b, seq_index=rows[:, 1], compress_rows=idx, coords=coords)
            )
        return layouts

    fixed_rows_per_video = 1  # the newline row: never compressed, never scored

    def attention_hooks(self, recorder: Recorder) -> list[Any]:
        """A pre-hook recording the received attention of the SigLIP layer whose output is
        the selected feature (`vision_feature_layer`)."""
        layer = _siglip_layer(self.model)
        return [layer.register_forward_pre_hook(per_image_hook(recorder), with_kwargs=True)]

    def received_attention(self, recorder: Recorder) -> torch.Tensor:
        """`[total grid rows]` received attention pooled like the features (no newline)."""
        config = self.model.config
        side = config.vision_config.image_size // config.vision_config.patch_size
        out = []
        for received in recorder.calls:
            if getattr(config, "vision_feature_select_strategy", "full") == "default":
                received = received[:, 1:]
            grid = received.view(-1, 1, side, side)
            pooled = F.interpolate(grid, size=[math.ceil(side / 2)] * 2, mode="bilinear")
            out.append(pooled.flatten())
        return torch.cat(out)

    @staticmethod
    def tiny_config() -> Any:
        """A tiny random config of this backbone (`craft_adapters.tiny.build_tiny_vlm`)."""
        from transformers import LlavaOnevisionConfig

        text = {**text_common(), "model_type": "qwen2"}
        vision = {
            "model_type": "siglip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": 56,
            "patch_size": 14,
        }
        return LlavaOnevisionConfig(
            text_config=text,
            vision_config=vision,
            image_token_index=SPECIAL_IDS["<image>"],
            video_token_index=SPECIAL_IDS["<video>"],
            vision_feature_select_strategy="full",
            vision_feature_layer=-1,
            image_grid_pinpoints=[[56, 56]],
        )

    @staticmethod
    def tiny_processor() -> Any:
        """The in-memory processor of `tiny_config`'s model (`build_tiny_processor`)."""
        from transformers import (
            LlavaOnevisionImageProcessor,
            LlavaOnevisionProcessor,
            LlavaOnevisionVideoProcessor,
        )

        return LlavaOnevisionProcessor(
            image_processor=LlavaOnevisionImageProcessor(
                size={"height": 56, "width": 56}, image_grid_pinpoints=[[56, 56]]
            ),
            tokenizer=tiny_tokenizer(LLAVA_TEMPLATE),
            video_processor=LlavaOnevisionVideoProcessor(size={"height": 56, "width": 56}),
            chat_template=LLAVA_TEMPLATE,
            num_image_tokens=16,
            vision_feature_select_strategy="full",
        )
