"""The stage inside the language model of a two-stage method (`flashvid-llm`,
`holitom-llm`), put on a model: every craft-eval path that wraps a model for a method
(`backend.HFBackend`, the lmms-eval plugin) calls `attach_in_model` after `wrap`.

The stage (`craft_eval.baselines.in_model.InModelStage`: layer and rule) runs through
craft-adapters' `InModelDrop`; a method without one attaches nothing.
"""

from __future__ import annotations

from typing import Any

from craft_adapters.in_model import InModelDrop

#: The depth of the language models the official layers were chosen for (Qwen2-7B: 28).
OFFICIAL_DEPTH = 28


def attach_in_model(model: Any, compressor: Any) -> InModelDrop | None:
    """Hook `compressor`'s stage inside the language model onto `model` (a `wrap(...)` or
    a Hugging Face VLM); None for a method without one. A stage an earlier method left on
    the model is removed first, so it never runs under another method.

    Raises:
        ValueError: the stage's layer is not inside the model (naming the method, the
            layer and how many layers the model has).
    """
    hf = getattr(model, "model", model) if hasattr(model, "compressor") else model
    previous = getattr(hf, "_craft_in_model_drop", None)
    if previous is not None:  # a model reused for another method (Measure, world tables)
        previous.remove()
    stage = getattr(compressor, "in_model_stage", None)
    if stage is None:
        return None
    count = int(hf.config.get_text_config().num_hidden_layers)
    if not 1 <= stage.layer < count:
        raise ValueError(
            f"method {stage.name!r}: layer {stage.layer} is not inside this language model "
            f"({count} layers): give a layer in [1, {count - 1}] (--method-arg layer=N, "
            "lmms-eval model_args layer=N)"
        )
    return InModelDrop(model, stage.rule, layer=stage.layer, name=stage.name)


def in_model_fields(drop: InModelDrop | None) -> dict[str, Any]:
    """The record of the last prefill's stage inside the model (empty without one)."""
    if drop is None or drop.report is None:
        return {}
    report = drop.report
    return {
        "in_model": {
            "method": report.name,
            "layer": report.layer,
            "rows_before": report.rows_before,
            "rows_after": report.rows_after,
            "query_dependent": True,
        }
    }


def scaled_stage_options(method: str, model: Any) -> dict[str, Any]:
    """`{"layer": L}` for a two-stage `method` on a model of another depth than the
    official 28 layers: the official layer at the same relative depth,
    `round(layer * layers / 28)` within `[1, layers - 1]` (the demo's and the world
    table's choice: the world's 4-layer backbone gets layer 3), moved to the nearest layer
    (the deeper of two) whose layer L - 1 is not a linear-attention one (Qwen3.5's
    `layer_types`; none such: left for `InModelDrop` to refuse by name); `{}` for other
    methods and for "none" (the uncompressed run, no registered method)."""
    from craft_eval.methods import get_method, get_method_info

    if method == "none" or "layer" not in (get_method_info(method).options or ()):
        return {}
    official = int(get_method(method).in_model_stage.layer)  # type: ignore[attr-defined]
    text = model.config.get_text_config()
    count = int(text.num_hidden_layers)
    scaled = max(1, min(count - 1, round(official * count / OFFICIAL_DEPTH)))
    types = getattr(text, "layer_types", None) or ["full_attention"] * count
    usable = [layer for layer in range(1, count) if types[layer - 1] != "linear_attention"]
    return {"layer": min(usable, key=lambda layer: (abs(layer - scaled), -layer), default=scaled)}
