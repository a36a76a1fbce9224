"""Qwen3-VL in vLLM == craft-adapters' `generate()`, at ratios 2, 4, 8, 16 and uncompressed.

The same check as test_equality.py on a tiny Qwen3-VL with deepstack (`tiny_qwen3.py`):
per-frame timestamp runs rebuilt from the kept tokens, deepstack rows fused with the main
rows' assignment, original M-RoPE positions. Control: a FRESH (unloaded) CRAFT module on the
library side disagrees with vLLM (at ratio 4).
"""

from __future__ import annotations

import engine
import pytest
import tiny_qwen3
from conftest import small_config

from craft_adapters import build_inputs
from craft_core import CraftCompressor

RATIOS = [2, 4, 8, 16]
CONTROL = 4
FRAMES = [16, 10, 12]


@pytest.fixture(scope="module")
def model(workdir):
    return tiny_qwen3.build(workdir / "qwen3_vl")


@pytest.fixture(scope="module")
def videos() -> list:
    return [tiny_qwen3.video(n, seed=i) for i, n in enumerate(FRAMES)]


def _agree(served: list, reference: list) -> list[bool]:
    return [engine.agree(s[0], r[0], r[2]) for s, r in zip(served, reference)]


def test_uncompressed_equals_transformers(model, videos) -> None:
    served = engine.run(model, {}, lambda llm: engine.vllm_generate(llm, videos, tiny_qwen3))
    reference = engine.adapters_generate(model, None, None, videos, tiny_qwen3)
    assert _agree(served, reference) == [True] * len(videos)
    assert [n for _, n in served] == [r[1] for r in reference]


@pytest.mark.parametrize("ratio", RATIOS)
def test_craft_equals_craft_adapters(workdir, model, videos, ratio) -> None:
    checkpoint = workdir / "craft"
    served = engine.run(
        model,
        engine.overrides(checkpoint, ratio, tiny_qwen3),
        lambda llm: engine.vllm_generate(llm, videos, tiny_qwen3),
    )
    loaded = CraftCompressor.from_pretrained(checkpoint)
    reference = engine.adapters_generate(model, loaded, ratio, videos, tiny_qwen3)
    assert _agree(served, reference) == [True] * len(videos)
    # floor(N / ratio) video tokens; the timestamps and frame markers all stay
    assert [n for _, n in served] == [r[1] for r in reference]
    for (_, length), frames, video in zip(served, FRAMES, videos):
        inputs = build_inputs(tiny_qwen3.processor(), video, engine.FPS, engine.QUESTION)
        n = frames // 2 * tiny_qwen3.PER_PAIR
        assert length == inputs["input_ids"].shape[1] - n + n // ratio
    if ratio == CONTROL:  # what an ignored checkpoint gives (once: each run costs a generate)
        fresh = CraftCompressor(small_config())
        control = engine.adapters_generate(model, fresh, ratio, videos, tiny_qwen3)
        assert not all(_agree(served, control))
