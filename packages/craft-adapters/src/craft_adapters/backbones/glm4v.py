"""GLM-4.1V (`glm4v`, transformers' `Glm4vForConditionalGeneration`): a Qwen-style M-RoPE VLM.

Its video is laid out like Qwen3-VL's: the processor writes each temporal group (two frames)
as `<|begin_of_image|><|image|> x n<|end_of_image|>` followed by its timestamp in seconds, so
each group is its own placeholder run; `get_rope_index` gives a group the rows `(s_k, s_k +
row, s_k + col)`, and `(t, h, w)` are read off them as for Qwen3-VL (`timestamp_coords`).
Unlike Qwen, video rows sit on the IMAGE token (`<|image|>`, `mm_token_type_ids` 2 tells
them from an image's), hence `video_token_id`. No deepstack.

lmms-eval 0.7.3's only GLM class (`simple/glm4v.py:GLM4V`) hands a video to the processor as
an IMAGE item (`{"type": "image", "url": path}`): no `pixel_values_videos` would reach the
wrapper, which would then run uncompressed. So no plugin model is generated from it
(`lmms_classes = None`); craft-eval writes `craft_glm4v` by hand with a video route.
craft-vllm serves it (`craft_vllm/glm4v.py`).
"""

from __future__ import annotations

from typing import Any

import torch

from craft_adapters.backbones._qwen import QwenAdapter
from craft_adapters.backbones._tiny import (
    chat_template,
    extra_token_ids,
    mrope,
    text_common,
    tiny_tokenizer,
)
from craft_adapters.backbones.qwen3_vl import timestamp_coords
from craft_adapters.registry import InputRules, register_backbone

# The tokenizer's GLM-4.1V tokens (attribute -> token), as in the real tokenizer.
TOKENS = {
    "image_token": "<|image|>",
    "video_token": "<|video|>",
    "boi_token": "<|begin_of_image|>",
    "eoi_token": "<|end_of_image|>",
    "bov_token": "<|begin_of_video|>",
    "eov_token": "<|end_of_video|>",
}
TEMPLATE = chat_template(
    "<|begin_of_video|><|video|><|end_of_video|>", "<|begin_of_image|><|image|><|end_of_image|>"
)


@register_backbone
class Glm4vAdapter(QwenAdapter):
    model_types = ("glm4v",)
    # the processor samples / resizes itself; the fps reaches its timestamps via the metadata
    input_rules = InputRules(processors=("Glm4vProcessor",), video_metadata=True)
    reference_archs = (("glm4_1v-9b", "glm-4.1v-9b", "glm-4.1v-9b-thinking"),)
    lmms_classes = None  # lmms-eval 0.7.3 feeds GLM videos as images; craft_glm4v is hand-written

    @property
    def video_token_id(self) -> int:
        return int(self.config.image_token_id)

    def video_mask(self, inputs: dict[str, Any]) -> torch.Tensor:
        """`<|image|>` tokens the processor typed as video (`mm_token_type_ids` 2)."""
        mask = inputs["input_ids"] == self.video_token_id
        types = inputs.get("mm_token_type_ids")
        return mask if types is None else mask & (types == 2)

    def _video_coords(self, pos: torch.Tensor) -> torch.Tensor:
        return timestamp_coords(pos)

    @staticmethod
    def tiny_config() -> Any:
        """A tiny random config of this backbone (`craft_adapters.tiny.build_tiny_vlm`)."""
        from transformers import Glm4vConfig

        ids = extra_token_ids(list(TOKENS.values()))
        text = {
            **text_common(),
            "rope_parameters": mrope([2, 1, 1], partial_rotary_factor=0.5),
        }
        vision = {
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "image_size": 56,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": 64,
        }
        return Glm4vConfig(
            text_config=text,
            vision_config=vision,
            image_token_id=ids["<|image|>"],
            video_token_id=ids["<|video|>"],
            image_start_token_id=ids["<|begin_of_image|>"],
            image_end_token_id=ids["<|end_of_image|>"],
            video_start_token_id=ids["<|begin_of_video|>"],
            video_end_token_id=ids["<|end_of_video|>"],
        )

    @staticmethod
    def tiny_processor() -> Any:
        """The in-memory processor of `tiny_config`'s model (`build_tiny_processor`)."""
        from transformers import Glm4vImageProcessor, Glm4vProcessor, Glm4vVideoProcessor

        size = {"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 64}
        return Glm4vProcessor(
            image_processor=Glm4vImageProcessor(size=size, patch_size=14, merge_size=2),
            tokenizer=tiny_tokenizer(TEMPLATE, TOKENS),
            video_processor=Glm4vVideoProcessor(
                size=size, max_image_size={"longest_edge": 28 * 28 * 64}, patch_size=14
            ),
            chat_template=TEMPLATE,
        )
