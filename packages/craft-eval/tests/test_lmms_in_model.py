"""The two-stage methods (`flashvid-llm`, `holitom-llm`) through lmms-eval's CLI entry
function with the plugin, on the tiny Qwen2.5-VL and LLaVA-OneVision: model_args
`layer=1`; every sample's `token_counts` records the stage inside the language model
(rows before / after, query-dependent)."""

from __future__ import annotations

import math
import sys
from typing import Any

import pytest
from test_lmms_plugin import BACKBONES, _argv, _read, lmms_env, tiny_models

__all__ = ["lmms_env", "tiny_models"]  # the fixtures, shared with the plugin's tests

CASES = [b for b in BACKBONES if b[1] in ("qwen2_5_vl", "llava_onevision")]
RULES = {"flashvid-llm": lambda n: math.ceil(0.3 * n), "holitom-llm": lambda n: round(0.5 * n)}


@pytest.mark.slow
@pytest.mark.parametrize("plugin,model_type,extra", CASES, ids=[c[1] for c in CASES])
def test_lmms_eval_runs_both_stages(
    plugin: str,
    model_type: str,
    extra: str,
    lmms_env: dict[str, Any],
    tiny_models: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lmms_eval.cli.dispatch import main

    model = tiny_models(model_type)
    for method, kept in RULES.items():
        out = lmms_env["root"] / f"out-{model_type}-{method}"
        args = f"method={method},ratio=2,layer=1"
        argv = _argv(plugin, model, extra, args, lmms_env["task"], out)
        monkeypatch.setattr(sys, "argv", ["lmms-eval", *argv])
        main()
        _, samples = _read(out)
        assert len(samples) == 3
        for sample in samples:
            counts = sample["token_counts"][0]
            stage = counts["in_model"]
            assert stage["method"] == method and stage["layer"] == 1
            assert stage["query_dependent"] is True
            assert stage["rows_before"] == counts["visual_tokens_after"]
            assert stage["rows_after"] == kept(stage["rows_before"])
