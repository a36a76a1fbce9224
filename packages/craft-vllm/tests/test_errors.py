"""Bad CRAFT settings are refused before serving, naming the key; never a silent fallback.

Each case starts a real engine (the other bad values of the same checks: test_options.py).
"""

from __future__ import annotations

import engine
import pytest
import tiny


def _start(workdir, hf_overrides: dict) -> str:
    """Start an engine with `hf_overrides`; return the error message it fails with."""
    with pytest.raises(Exception) as caught:
        engine.run(workdir / "model", hf_overrides, lambda llm: None)
    chain, error = [], caught.value
    while error is not None:  # vLLM may wrap the model's error: read the whole chain
        chain.append(str(error))
        error = error.__cause__ or error.__context__
    return " | ".join(chain)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"craft_ratio": None, "craft_threshold": 0.9}, "threshold mode is refused"),
        ({"craft_checkpoint": "/nonexistent/craft"}, "does not exist"),
        ({"craft_checkpoint": "{d96}"}, "hidden size 96"),
        ({"craft_ratio": 100000}, "leaves no token"),
        ({"architectures": None}, "does not run CRAFT"),
    ],
    ids=["threshold", "missing-folder", "hidden-size", "no-token", "no-arch"],
)
def test_refused_before_serving(workdir, extra: dict, expected: str) -> None:
    overrides = engine.overrides(workdir / "craft", 4)
    for key, value in extra.items():
        value = value.format(d96=workdir / "craft_d96") if isinstance(value, str) else value
        if value is None:
            overrides.pop(key)
        else:
            overrides[key] = value
    assert expected in _start(workdir, overrides)


def test_video_too_short_for_the_ratio_is_refused_per_request(workdir) -> None:
    """A video with fewer tokens than the ratio: that request fails, naming the ratio."""

    def work(llm):
        with pytest.raises(Exception, match="leaves no token"):
            engine.vllm_generate(llm, [tiny.video(2, seed=0)])  # 16 tokens at ratio 32
        return engine.vllm_generate(llm, [tiny.video(16, seed=0)])  # the engine still serves

    served = engine.run(workdir / "model", engine.overrides(workdir / "craft", 32), work)
    assert served[0][1] == engine.text_tokens() + 128 // 32
