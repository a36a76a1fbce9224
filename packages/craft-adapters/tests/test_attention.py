"""The wrapper hands the vision tower's received attention only to compressors that ask
(`needs_attention`). That it IS the eager attention of the right layer, mapped to the
compressed rows, is the conformance suite's `test_received_attention_equals_eager`, run on
every backbone."""

from __future__ import annotations

from typing import Any

import torch
from adapters_conformance import RuleCompressor
from adapters_testkit import make_frames

from craft_adapters import build_inputs, wrap
from craft_adapters.attention import encode_videos_with_attention, wants_attention


def test_wrapper_hands_attention_only_to_methods_that_ask(tiny_models: dict[str, Any]) -> None:
    model, processor = tiny_models["qwen2_5_vl"]
    inputs = build_inputs(processor, make_frames(4, seed=3), 2.0, "describe")
    asks = RuleCompressor(needs_attention=True)
    assert wants_attention(asks) and not wants_attention(object())
    wrap(model, asks, ratio=1.0)(**inputs)
    _, _, direct = encode_videos_with_attention(wrap(model, None).adapter, dict(inputs), asks)
    assert asks.importance[0] is not None
    torch.testing.assert_close(asks.importance[0], direct[0])
    silent = RuleCompressor(needs_attention=False)
    wrap(model, silent, ratio=1.0)(**inputs)
    assert silent.importance == [None]
