"""Qwen3-VL, Qwen3.5, LLaVA-OneVision, InternVL and GLM-4.1V in vLLM == craft-adapters'
`generate()`, at ratios 2 and 16 and uncompressed (the two ends: more kept tokens than one
frame's, and fewer; test_equality.py runs 2, 4, 8 and 16 on Qwen2.5-VL).

The same check as test_equality.py on a tiny Qwen3-VL with deepstack (`tiny_qwen3.py`,
float32) and a tiny Qwen3.5 (`tiny_qwen3_5.py`: Gated DeltaNet + full attention, bfloat16
on both sides, the only dtype vLLM's CPU Gated DeltaNet kernel runs): per-frame timestamp
runs rebuilt from the kept tokens, deepstack rows fused with the main rows' assignment
(Qwen3-VL), original M-RoPE positions; a tiny LLaVA-OneVision (`tiny_llava.py`, float32):
pooled grid rows compressed, the newline row kept, original 1-D positions; a tiny InternVL
(`tiny_internvl.py`, float32): every frame token compressed, the `Frame{i}: <img> ... </img>`
text kept around each frame's kept rows, original 1-D positions; a tiny GLM-4.1V
(`tiny_glm4v.py`, float32): per-group runs rebuilt from the kept tokens (markers and seconds
text kept), original M-RoPE positions written by the variant's own pruning hook. Control: the engine's CRAFT module holds the
checkpoint's weights bit for bit and not a fresh module's (read from vLLM's worker). Besides
the greedy tokens, the first step's log-probs are compared (`engine.compare`), and the rows
the served CRAFT module kept (recorded in vLLM's worker) equal craft-adapters' (which
compresses one video at a time), all three videos compressed in ONE call (craft-core's
`compress_many`). In bfloat16
(Qwen3.5) the two vision towers' rows differ by up to one bfloat16 step (measured), so at 8x /
16x the merge plan may follow that difference: a video whose kept rows differ is left out of
the comparison only when its input rows differ (asserted), and at least one video per ratio
must be compared.
"""

from __future__ import annotations

from typing import Any

import engine
import pytest
import tiny_glm4v
import tiny_internvl
import tiny_llava
import tiny_qwen3
import tiny_qwen3_5
import torch
from conftest import small_config

from craft_adapters import build_inputs
from craft_core import CraftCompressor

RATIOS = [2, 16]
FRAMES = [16, 10, 12]


@pytest.fixture(
    scope="module",
    params=[tiny_qwen3, tiny_qwen3_5, tiny_llava, tiny_internvl, tiny_glm4v],
    ids=["qwen3_vl", "qwen3_5", "llava_onevision", "internvl", "glm4v"],
)
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def model(workdir, kind):
    return kind.build(workdir / kind.__name__)


@pytest.fixture(scope="module")
def videos(kind) -> list:
    return [kind.video(n, seed=i) for i, n in enumerate(FRAMES)]


def _served(model, kind, overrides: dict, videos: list, weights: bool = False) -> Any:
    def work(llm):
        if weights:
            engine.record_craft_calls(llm)
        tokens = engine.vllm_generate(llm, videos, kind)
        if weights:
            return tokens, engine.served_craft_state(llm), engine.craft_calls(llm)
        return tokens

    # the unmodified backbone may need its own engine settings (tiny_llava.py: vLLM bug 6)
    extra = {} if overrides else getattr(kind, "UNCOMPRESSED_ENGINE", {})
    return engine.run(model, overrides, work, dtype=kind.DTYPE, **extra)


def _reference(model, kind, compressor, ratio, videos: list) -> list:
    dtype = getattr(torch, kind.DTYPE)
    return engine.adapters_generate(model, compressor, ratio, videos, kind, dtype=dtype)


def test_uncompressed_equals_transformers(model, kind, videos) -> None:
    served = _served(model, kind, {}, videos)
    reference = _reference(model, kind, None, None, videos)
    engine.compare(served, reference, kind.DTYPE)


@pytest.mark.parametrize("ratio", RATIOS)
def test_craft_equals_craft_adapters(workdir, model, kind, videos, ratio) -> None:
    checkpoint = workdir / "craft"
    served, state, (calls, batches) = _served(
        model, kind, engine.overrides(checkpoint, ratio, kind), videos, True
    )
    assert batches == [len(videos)]  # the three videos' forward: ONE compression call
    loaded = CraftCompressor.from_pretrained(checkpoint)
    # Control: the engine holds the checkpoint's weights, not a fresh module's. (Greedy tokens
    # cannot tell them apart on these tiny models: a merge only re-weights similar tokens, and
    # with craft-core 0.5's init a fresh module gave the trained one's tokens at 4x on tiny
    # Qwen3.5 and LLaVA-OneVision.)
    assert engine.same_weights(state, loaded)
    assert not engine.same_weights(state, CraftCompressor(small_config()))
    # floor(N / ratio) video tokens; the timestamps, frame markers and newline row all stay
    for (_, length, _), frames, video in zip(served, FRAMES, videos):
        inputs = build_inputs(kind.processor(), video, engine.FPS, engine.QUESTION)
        n = kind.video_tokens(frames)
        assert length == inputs["input_ids"].shape[1] - n + n // ratio
    reference = _reference(model, kind, loaded, ratio, videos)
    same = engine.same_plans(calls, reference)
    if kind.DTYPE == "float32":
        assert same == [True] * len(videos)
    else:  # bfloat16: the videos whose plan is the same are compared (at least one)
        assert any(same), "vLLM's CRAFT kept other rows than craft-adapters' on every video"
        served = [s for s, keep in zip(served, same) if keep]
        reference = [r for r, keep in zip(reference, same) if keep]
    engine.compare(served, reference, kind.DTYPE)
