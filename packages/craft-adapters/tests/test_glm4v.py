"""GLM-4.1V (`glm4v`, the sixth backbone): the conformance suite, its video rows on the image
token, and the real-size config of GLM-4.1V-9B."""

from __future__ import annotations

from typing import Any

import torch
from qwen_conformance import QwenConformance, timestamp_t

from craft_adapters import wrap
from craft_adapters.registry import load_reference_arch


class TestGlm4v(QwenConformance):
    model_type = "glm4v"
    # transformers' Glm4vModel counts every <|image|> for the image AND for the video: the
    # unmodified model refuses an image beside a video ("Image features and image tokens do
    # not match")
    images_beside_video = False

    def temporal(self, model: Any, inputs: Any, video: int, group: Any, t_row: Any) -> Any:
        return timestamp_t(group, t_row)

    def test_video_rows_sit_on_the_image_token(self, case: tuple[Any, Any]) -> None:
        model, processor = case
        inputs = self.inputs(processor)
        adapter = wrap(model, None).adapter
        video = inputs["mm_token_type_ids"] == 2
        assert adapter.video_token_id == model.config.image_token_id != model.config.video_token_id
        assert torch.equal(adapter.video_mask(inputs), video) and bool(video.any())


def test_glm4_1v_9b_config_is_the_public_one() -> None:
    """The efficiency shape ships with the backbone: GLM-4.1V-9B's public values, read back
    through transformers' own config (half the head rotary: 2 x (8 + 12 + 12) = 64 of 128)."""
    from transformers import Glm4vTextConfig

    arch = load_reference_arch("GLM-4.1V-9B-Thinking")
    text = dict(arch["text_config"])
    text.pop("model_type")
    config = Glm4vTextConfig(**text)
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (
        4096,
        40,
        13696,
    )
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (
        32,
        2,
        151552,
    )
    head = config.hidden_size // config.num_attention_heads
    rope = config.rope_parameters
    assert 2 * sum(rope["mrope_section"]) == head * rope["partial_rotary_factor"] == 64
    assert arch["_key"] == "glm4_1v-9b" and arch["model_type"] == "glm4v"
