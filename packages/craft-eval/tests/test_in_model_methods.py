"""FlashVID's and HoliTom's stage inside the language model: the rules against slow
re-statements of the official code, the two-stage methods in the registry, and the stage
on a tiny model through `craft-eval`'s backend (the layer mechanics themselves are tested
against a hand-spliced reference in craft-adapters' `tests/test_in_model.py`).

Official code: FlashVID @ 1d37422 `flashvid/utils.py:fastv_prune`; HoliTom @ e9b2972
`holitom/modeling_qwen2.py:Qwen2Model_holitom.forward` (the layer-k merge loop).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from craft_eval.baselines.in_model import flashvid_rule, holitom_rule
from craft_eval.methods import get_method, get_method_info


def official_flashvid(score: torch.Tensor, retention: float) -> list[int]:
    """`attn_based_token_selection` with `ceil(n * llm_retention_ratio)` (ties: smaller)."""
    count = math.ceil(score.numel() * retention)
    return sorted(sorted(range(score.numel()), key=lambda i: (-float(score[i]), i))[:count])


def official_holitom(hidden: torch.Tensor, score: torch.Tensor, r: float):  # type: ignore[no-untyped-def]
    """The layer-k merge as published: top `round(n * (1 - r))` by the score; the cosine
    of every other row with the kept ones, computed once; then, one row after the other in
    ascending order, `h[t] = (h[t] + h[i]) / 2` into the most similar kept row t."""
    n = hidden.shape[0]
    top = sorted(range(n), key=lambda i: (-float(score[i]), i))[: round(n * (1 - r))]
    others = [i for i in range(n) if i not in top]
    h = hidden.clone()
    for i in others:
        sims = [float(torch.cosine_similarity(hidden[i], hidden[t], dim=0)) for t in top]
        t = top[sims.index(max(sims))]
        h[t] = (h[t] + h[i]) / 2
    kept = sorted(top)
    return kept, h[kept]


@pytest.mark.parametrize(("n", "seed"), [(7, 0), (40, 1), (196, 2), (301, 3)])
def test_rules_equal_the_official_arithmetic(n: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, 32, generator=g)
    score = torch.softmax(torch.randn(n, generator=g), dim=0)
    score[: n // 5] = score[n // 5]  # ties: the smaller position first
    kept, rows = flashvid_rule(0.3)(hidden, score)
    assert rows is None and kept.tolist() == official_flashvid(score, 0.3)
    kept, rows = holitom_rule(0.5)(hidden, score)
    want_kept, want_rows = official_holitom(hidden, score, 0.5)
    assert kept.tolist() == want_kept
    torch.testing.assert_close(rows, want_rows, rtol=1e-5, atol=1e-6)


def test_two_stage_methods_are_registered_query_dependent() -> None:
    for name, before, layer in (("flashvid-llm", "flashvid", 20), ("holitom-llm", "holitom", 18)):
        info = get_method_info(name)
        assert info.needs == ("attention",) and "layer" in (info.options or ())
        method = get_method(name)
        assert method.query_dependent and method.needs_attention
        assert method.in_model_stage.layer == layer
        assert get_method(name, layer=3).in_model_stage.layer == 3
        features = torch.randn(4 * 36, 16, generator=torch.Generator().manual_seed(0))
        t, h, w = torch.meshgrid(torch.arange(4), torch.arange(6), torch.arange(6), indexing="ij")
        coords = torch.stack([t.flatten(), h.flatten(), w.flatten()], dim=1)
        both = method(features, coords, ratio=5.0)
        alone = get_method(before)(features, coords, ratio=5.0)
        assert torch.equal(both.kept_index, alone.kept_index)
        assert torch.equal(both.features, alone.features)
        assert both.info["in_model"] == {"layer": layer, "query_dependent": True}
    with pytest.raises(ValueError, match="layer must be an int"):
        get_method("flashvid-llm", layer=0)
    with pytest.raises(ValueError, match="llm_retention must lie"):
        get_method("flashvid-llm", llm_retention=1.5)
    with pytest.raises(ValueError, match="llm_merged must lie"):
        get_method("holitom-llm", llm_merged=1.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    from craft_adapters.tiny import build_tiny_vlm

    return build_tiny_vlm("qwen2_5_vl", tmp_path_factory.mktemp("qwen"))  # type: ignore[no-any-return]


def test_the_backend_runs_both_stages_and_records_them(tiny: tuple[Any, Any]) -> None:
    """Through `HFBackend`: the video rows reaching layer 1 are the first stage's; the
    stage keeps ceil(30%) of them; the record says query-dependent; a session refuses."""
    import numpy as np

    import craft_adapters
    from craft_core import TokenBudget
    from craft_eval.backend import HFBackend

    model, processor = tiny
    backend = HFBackend(
        model,
        processor,
        method="flashvid-llm",
        budget=TokenBudget(ratio=2.0),
        method_kwargs={"layer": 1},
    )
    frames = np.random.default_rng(0).integers(0, 255, (4, 56, 56, 3), dtype=np.uint8)
    inputs = craft_adapters.build_inputs(processor, frames, 2.0, "What is it?")
    with torch.no_grad():
        backend.model(**inputs)
    report = backend.in_model.report
    kept = backend.model.last_compression.tokens_after
    assert report.rows_before == kept and report.rows_after == math.ceil(0.3 * kept)
    with pytest.raises(ValueError, match=r"'flashvid-llm'.*query-dependent"):
        backend.model.encode_video(**inputs)
    backend.in_model.remove()


def test_a_layer_outside_the_model_is_named(tiny: tuple[Any, Any]) -> None:
    from craft_core import TokenBudget
    from craft_eval.backend import HFBackend

    model, processor = tiny
    with pytest.raises(ValueError, match=r"'holitom-llm': layer 18 .* \(2 layers\)"):
        HFBackend(model, processor, method="holitom-llm", budget=TokenBudget(ratio=2.0))


def test_flops_count_every_layer_before_the_drop_on_every_token() -> None:
    """`craft-eval efficiency`: layers before L on the first stage's rows, the rest on the
    kept ones, plus the score; checked against the per-layer formula written out here."""
    from craft_eval.efficiency import measure_efficiency, parse_overrides

    small = "hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,"
    small += "num_key_value_heads=2,vocab_size=300"
    result = measure_efficiency(
        "qwen2.5-vl-7b",
        num_frames=4,
        ratios=[4.0],
        methods=["flashvid-llm"],
        text_tokens=16,
        device="cpu",
        warmup=0,
        repeats=1,
        overrides=parse_overrides(small),
        progress=False,
        method_options={"layer": 1},
    )
    none, row = result["rows"]
    d, m, h, g, e, vocab = 64, 128, 4, 2, 16, 300

    def layer(n: int) -> float:
        return (
            2 * n * d * (h * e + 2 * g * e) + 4 * n * n * h * e + 2 * n * h * e * d + 6 * n * d * m
        )

    full = none["seq_len"]
    first = row["seq_len"]
    kept = 16 + math.ceil(0.3 * row["video_tokens"])
    staged = layer(first) + layer(kept) + 2 * first * h * e + 2 * d * vocab
    assert row["in_model_layer"] == 1
    assert row["flops_reduction"] == pytest.approx(1 - staged / (2 * layer(full) + 2 * d * vocab))
    every_layer_kept = 1 - (2 * layer(kept) + 2 * d * vocab) / (2 * layer(full) + 2 * d * vocab)
    assert row["flops_reduction"] < every_layer_kept


def test_the_demo_and_world_tables_scale_the_layer_to_the_model() -> None:
    """The official layers (20, 18 of 28) at the same relative depth; at least 1, below
    the model's last layer; nothing for a method without a stage inside the LM."""
    from types import SimpleNamespace

    from craft_eval.in_model import scaled_stage_options

    def model(layers: int) -> Any:
        text = SimpleNamespace(num_hidden_layers=layers)
        return SimpleNamespace(config=SimpleNamespace(get_text_config=lambda: text))

    assert scaled_stage_options("flashvid-llm", model(4)) == {"layer": 3}
    assert scaled_stage_options("holitom-llm", model(4)) == {"layer": 3}
    assert scaled_stage_options("flashvid-llm", model(28)) == {"layer": 20}
    assert scaled_stage_options("holitom-llm", model(2)) == {"layer": 1}
    assert scaled_stage_options("flashvid", model(4)) == {}


def test_a_model_reused_for_another_method_drops_the_old_stage(tiny: tuple[Any, Any]) -> None:
    """Measure and the world tables build one backend per method on ONE model: a stage left
    by an earlier method is removed, never run under the next (two on one model: refused)."""
    from craft_adapters.in_model import InModelDrop, top_fraction
    from craft_core import TokenBudget
    from craft_eval.backend import HFBackend

    model, processor = tiny
    budget = TokenBudget(ratio=2.0)
    first = HFBackend(model, processor, method="holitom-llm", budget=budget,
                      method_kwargs={"layer": 1})  # fmt: skip
    with pytest.raises(ValueError, match="already carries method 'holitom-llm'"):
        InModelDrop(model, top_fraction(0.5), layer=1, name="again")
    second = HFBackend(model, processor, method="flashvid-llm", budget=budget,
                       method_kwargs={"layer": 1})  # fmt: skip
    assert model._craft_in_model_drop is second.in_model is not first.in_model
    third = HFBackend(model, processor, method="holitom", budget=budget)
    assert third.in_model is None and not hasattr(model, "_craft_in_model_drop")
