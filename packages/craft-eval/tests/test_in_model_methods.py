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


def plain_mean(hidden: torch.Tensor, score: torch.Tensor, r: float) -> torch.Tensor:
    """The control: each kept row the plain mean of itself and its members (NOT HoliTom's
    weighting, which halves once per member, so later members weigh more)."""
    kept, _ = official_holitom(hidden, score, r)
    others = [i for i in range(hidden.shape[0]) if i not in kept]
    sims = torch.nn.functional.normalize(hidden[others], dim=-1)
    owner = (sims @ torch.nn.functional.normalize(hidden[kept], dim=-1).T).argmax(-1)
    rows = hidden[kept].clone()
    count = torch.ones(len(kept))
    for i, t in zip(others, owner.tolist(), strict=True):
        rows[t] += hidden[i]
        count[t] += 1
    return rows / count[:, None]


@pytest.mark.parametrize(("n", "seed"), [(7, 4), (40, 1), (196, 2), (301, 3)])
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
    # every case can tell the official weighting from a plain mean (a kept row with >= 2
    # members; with one member the two agree)
    assert (plain_mean(hidden, score, 0.5) - want_rows).abs().max() > 1e-2


def test_holitom_merge_weights_by_hand() -> None:
    """Three rows merge into kept row 0 in ascending order: `h = (h + h_i) / 2` each time,
    so `h_0 / 8 + h_2 / 8 + h_3 / 4 + h_4 / 2` (a plain mean gives x = 1.75, the members
    in descending order x = 2.0); row 1 absorbs nothing and stays as it is."""
    hidden = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.1], [3.0, 0.2], [1.0, 0.05]])
    score = torch.tensor([0.9, 0.8, 0.1, 0.2, 0.3])  # round(5 * 0.4) = 2 kept: 0 and 1
    kept, rows = holitom_rule(0.6)(hidden, score)
    assert kept.tolist() == [0, 1]
    want = torch.tensor([[1.625, 0.0875], [0.0, 1.0]])
    torch.testing.assert_close(rows, want, rtol=0, atol=1e-6)


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
    with pytest.raises(ValueError, match="flashvid-llm: llm_retention must be a number in"):
        get_method("flashvid-llm", llm_retention=1.5)
    with pytest.raises(ValueError, match="holitom-llm: llm_merged must be a number in"):
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


def test_efficiency_times_the_prefill_with_the_drop() -> None:
    """`craft-eval efficiency` (a 2-layer model, the stage at layer 1): FLOPs count layers
    before L on the first stage's rows, the rest on the kept ones, plus the score (the
    per-layer formula written out here); the prefill it times RAN the drop: its KV cache
    holds every row in layer 0 and the kept ones in layer 1, as the analytical count says
    (without the drop it would hold every row in both)."""
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
    assert row["in_model_layer"] == 1 and row["in_model_tokens"] == kept
    per_token = 2 * g * e * 4 / 2**20  # K and V of one layer, float32, in MB
    assert row["kv_mb"] == pytest.approx(row["kv_mb_analytical"])
    assert row["kv_mb"] == pytest.approx((first + kept) * per_token)
    assert row["kv_mb_growing"] == pytest.approx(row["kv_mb"])
    assert row["flops_reduction"] == pytest.approx(1 - staged / (2 * layer(full) + 2 * d * vocab))
    every_layer_kept = 1 - (2 * layer(kept) + 2 * d * vocab) / (2 * layer(full) + 2 * d * vocab)
    assert row["flops_reduction"] < every_layer_kept


def test_the_demo_and_world_tables_scale_the_layer_to_the_model() -> None:
    """The official layers (20, 18 of 28) at the same relative depth; at least 1, below
    the model's last layer; nothing for a method without a stage inside the LM."""
    from types import SimpleNamespace

    from craft_eval.in_model import scaled_stage_options

    def model(layers: int, types: list[str] | None = None) -> Any:
        text = SimpleNamespace(num_hidden_layers=layers, layer_types=types)
        return SimpleNamespace(config=SimpleNamespace(get_text_config=lambda: text))

    hybrid = (["linear_attention"] * 3 + ["full_attention"]) * 8  # Qwen3.5-4B's 32 layers

    assert scaled_stage_options("flashvid-llm", model(4)) == {"layer": 3}
    assert scaled_stage_options("holitom-llm", model(4)) == {"layer": 3}
    assert scaled_stage_options("flashvid-llm", model(28)) == {"layer": 20}
    assert scaled_stage_options("holitom-llm", model(2)) == {"layer": 1}
    assert scaled_stage_options("flashvid", model(4)) == {}
    # Qwen3.5: L - 1 a softmax-attention layer; 20 * 32 / 28 -> 23 -> 24, 18 -> 21 -> 20
    assert scaled_stage_options("flashvid-llm", model(32, hybrid)) == {"layer": 24}
    assert scaled_stage_options("holitom-llm", model(32, hybrid)) == {"layer": 20}
    assert scaled_stage_options("flashvid-llm", model(4, hybrid[:4])) == {"layer": 3}  # none


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
