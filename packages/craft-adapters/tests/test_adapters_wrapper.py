"""`wrap`'s own errors and settings on one tiny backbone (the backbone-generic checks are
the conformance suite, `adapters_conformance.py`, run from each `test_<model_type>.py`)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from adapters_testkit import KeepEvery, make_frames

from craft_adapters import build_inputs, build_session_inputs, wrap

GEN = {"max_new_tokens": 4, "do_sample": False}


def _inputs(processor: Any, frames: int = 4, prompt: str = "What?", seed: int = 0) -> Any:
    return build_inputs(processor, make_frames(frames, seed), 2.0, prompt)


def test_bad_inputs_raise_clear_errors(tiny_models: dict[str, Any]) -> None:
    from craft_core import CraftCompressor, CraftConfig

    class Fake:
        class config:
            model_type = "bert"

    with pytest.raises(ValueError, match="unsupported model_type 'bert'"):
        wrap(Fake(), None)
    model, _ = tiny_models["qwen2_5_vl"]
    with pytest.raises(ValueError, match="hidden size 32 != language model hidden size 64"):
        wrap(model, CraftCompressor(CraftConfig(hidden_size=32)), ratio=2.0)
    with pytest.raises(ValueError, match=r"ratio=\.\.\. or threshold"):
        wrap(model, KeepEvery(2))
    with pytest.raises(ValueError, match="ratio must be a finite number >= 1"):
        wrap(model, KeepEvery(2), ratio=0.5)


@pytest.mark.gpu
@torch.no_grad()
def test_bf16_cuda_generate_and_session(tiny_models: dict[str, Any]) -> None:
    """On CUDA in bf16 with inputs left on the CPU: compressed generate and a session run."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from craft_core import CraftCompressor, CraftConfig

    for name in ("qwen3_5", "llava_onevision"):
        model, processor = tiny_models[name]
        model = model.to("cuda", torch.bfloat16)
        try:
            comp = CraftCompressor(CraftConfig(hidden_size=64, gate_hidden=32, round_embed_dim=16))
            wrapped = wrap(model, comp.to("cuda"), ratio=2.0)
            inputs = _inputs(processor)
            out = wrapped.generate(**inputs, **GEN)
            assert inputs["input_ids"].shape[1] < out.shape[1] <= inputs["input_ids"].shape[1] + 4
            video_inputs, q_ids = build_session_inputs(processor, make_frames(4), 2.0, ["Why?"])
            answer = wrapped.encode_video(**video_inputs).ask(q_ids[0], **GEN)
            assert answer.shape[0] == 1 and 1 <= answer.shape[1] <= 4
        finally:
            model.to("cpu", torch.float32)


@torch.no_grad()
@pytest.mark.parametrize("setting", [{"use_cache": False}, {"logits_to_keep": 0}])
def test_encode_video_refuses_the_settings_it_fixes(
    tiny_models: dict[str, Any], setting: dict[str, Any]
) -> None:
    """A session is one cached prefill: a caller's use_cache / logits_to_keep is refused by
    name, never silently overridden."""
    model, processor = tiny_models["qwen2_5_vl"]
    video_inputs, _ = build_session_inputs(processor, make_frames(4, seed=3), 2.0, ["Why?"])
    wrapped = wrap(model, KeepEvery(2), ratio=2.0)
    with pytest.raises(ValueError, match=next(iter(setting))):
        wrapped.encode_video(**video_inputs, **setting)
