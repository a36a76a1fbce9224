"""FLOPs formula, KV-cache accounting and the real-size architecture configs."""

from __future__ import annotations

import pytest
import torch

from craft_adapters.registry import reference_archs
from craft_eval.efficiency import (
    cache_nbytes,
    flops_reduction,
    kv_cache_bytes_analytical,
    layer_types,
    load_arch,
    measure_efficiency,
    parse_overrides,
    prefill_flops,
    video_tokens,
)

SMALL = (
    "hidden_size=64,intermediate_size=128,num_hidden_layers=4,num_attention_heads=4,"
    "num_key_value_heads=2,head_dim=16,linear_num_key_heads=2,linear_num_value_heads=4,"
    "linear_key_head_dim=16,linear_value_head_dim=16,vocab_size=300"
)


def small(arch: str) -> str:
    """SMALL's overrides that `arch` has (an override of a field it lacks is refused)."""
    keys = {*load_arch(arch)["text_config"], "head_dim"}
    return ",".join(p for p in SMALL.split(",") if p.split("=")[0] in keys)


def test_shipped_configs_are_real_size() -> None:
    q35 = load_arch("qwen3.5-4b")["text_config"]
    assert q35["hidden_size"] == 2560 and q35["num_hidden_layers"] == 32
    assert layer_types(q35).count("full_attention") == 8  # every 4th layer
    q25 = load_arch("qwen2.5-vl-7b")["text_config"]
    assert (q25["hidden_size"], q25["num_hidden_layers"], q25["num_key_value_heads"]) == (
        3584,
        28,
        4,
    )
    assert load_arch("llava-ov-7b")["text_config"]["hidden_size"] == 3584
    assert {"qwen3_5-4b", "qwen2_5_vl-7b", "llava_ov-7b"} <= set(reference_archs())
    with pytest.raises(KeyError, match="known"):
        load_arch("gpt-4")


def test_video_token_counts_match_backbones_md() -> None:
    assert video_tokens(load_arch("qwen2.5-vl-7b"), 64) == 8192
    assert video_tokens(load_arch("qwen3.5-4b"), 64) == 6272
    assert video_tokens(load_arch("llava-ov-7b"), 64) == 12544 + 1
    assert video_tokens(load_arch("internvl3.5-8b"), 64) == 64 * 256  # one 448 px tile a frame


def test_flops_by_hand_for_a_dense_layer() -> None:
    c = {
        "model_type": "qwen2",
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 10,
    }
    L = 5  # head dim 4
    expected = 2 * L * 8 * (2 * 4 + 2 * 1 * 4) + 4 * L * L * 2 * 4 + 2 * L * 2 * 4 * 8
    expected += 6 * L * 8 * 16 + 2 * 8 * 10
    assert prefill_flops(c, L) == expected


def test_linear_attention_layers_are_linear_in_length() -> None:
    q35 = load_arch("qwen3.5-4b")["text_config"]
    linear_only = {**q35, "layer_types": ["linear_attention"] * 4, "num_hidden_layers": 4}
    head = 2 * q35["hidden_size"] * q35["vocab_size"]
    f1, f2 = prefill_flops(linear_only, 1000) - head, prefill_flops(linear_only, 2000) - head
    assert f2 == pytest.approx(2 * f1)
    full_only = {**q35, "layer_types": ["full_attention"] * 32}
    # the hybrid saves less at 8x than if every layer were full attention
    n, c = 6272 + 128, 784 + 128
    assert flops_reduction(q35, n, c) < flops_reduction(full_only, n, c)
    assert 0.8 < flops_reduction(q35, n, c) < 0.9


def test_kv_cache_only_full_attention_layers_grow() -> None:
    q35 = load_arch("qwen3.5-4b")["text_config"]
    grow = kv_cache_bytes_analytical(q35, 2000) - kv_cache_bytes_analytical(q35, 1000)
    assert (
        grow == 8 * 2 * 1000 * 4 * 256 * 2
    )  # 8 full layers x K,V x tokens x kv heads x dim x bf16
    q25 = load_arch("qwen2.5-vl-7b")["text_config"]
    assert kv_cache_bytes_analytical(q25, 1000) == 28 * 2 * 1000 * 4 * 128 * 2


def test_overrides_parse_and_rescale_mrope() -> None:
    assert parse_overrides("a=1, b=x,c=2.5") == {"a": 1, "b": "x", "c": 2.5}
    arch = load_arch("qwen2.5-vl-7b", parse_overrides("hidden_size=64,num_attention_heads=4"))
    assert sum(arch["text_config"]["rope_parameters"]["mrope_section"]) == 8


@pytest.mark.parametrize(
    ("arch", "always_kept"), [("qwen3.5-4b", 0), ("llava-ov-7b", 1), ("internvl3.5-8b", 0)]
)
def test_measured_kv_matches_analytical_on_scaled_down_model(arch: str, always_kept: int) -> None:
    result = measure_efficiency(
        arch,
        num_frames=2,
        ratios=[4.0],
        methods=["uniform"],
        text_tokens=16,
        device="cpu",
        warmup=0,
        repeats=1,
        overrides=parse_overrides(small(arch)),
        progress=False,
    )
    none, uniform = result["rows"]
    assert none["method"] == "none" and none["flops_reduction"] == 0.0
    # only the frame grid is compressed: LLaVA-OV's newline token always survives
    grid = result["video_tokens_full"] - always_kept
    assert uniform["video_tokens"] == grid // 4 + always_kept
    assert uniform["kv_mb"] == pytest.approx(uniform["kv_mb_analytical"])
    assert none["kv_mb"] == pytest.approx(none["kv_mb_analytical"])
    assert uniform["kv_mb"] < none["kv_mb"]
    assert uniform["compress_ms"] is not None and uniform["prefill_ms"] > 0
    assert 0 < uniform["flops_reduction"] < 1


def test_cache_nbytes_walks_nested_objects() -> None:
    a, b = torch.zeros(2, 3, 7, 4), torch.zeros(5)
    total, growing = cache_nbytes({"layers": [a, (a, b)]}, seq_len=7)
    assert total == a.nbytes + b.nbytes and growing == a.nbytes


@pytest.mark.gpu
def test_efficiency_on_gpu_uses_cuda_events() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    result = measure_efficiency(
        "qwen2.5-vl-7b", num_frames=8, ratios=[8.0], methods=["uniform"], progress=False
    )
    assert result["timing"].startswith("CUDA events")
    assert result["rows"][1]["prefill_ms"] < result["rows"][0]["prefill_ms"]


def test_efficiency_command(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    import json

    from craft_eval.cli import main

    argv = ["efficiency", "--arch", "llava-ov-7b", "--frames", "2", "--ratios", "2", "4"]
    argv += ["--methods", "uniform", "--repeats", "1", "--warmup", "0", "--device", "cpu"]
    assert (
        main([*argv, "--override", small("llava-ov-7b"), "--json", str(tmp_path / "e.json")]) == 0
    )
    out = capsys.readouterr().out
    assert "| uniform | 4x |" in out and "LLaVA-OV-7B (cpu, float32), 2 frames" in out
    rows = json.loads((tmp_path / "e.json").read_text())["rows"]
    assert [r["ratio"] for r in rows] == [None, 2.0, 4.0]


def test_efficiency_method_args_are_printed_and_recorded(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    from craft_eval.cli import main

    argv = ["efficiency", "--arch", "qwen2.5-vl-7b", "--frames", "2", "--ratios", "4"]
    argv += ["--methods", "craft", "--repeats", "1", "--warmup", "0", "--device", "cpu"]
    argv += ["--override", small("qwen2.5-vl-7b"), "--json", str(tmp_path / "e.json")]
    assert main([*argv, "--method-arg", "reduce=target", "--method-arg", "compile=false"]) == 0
    assert "reduce=target, compile=False" in capsys.readouterr().out
    result = json.loads((tmp_path / "e.json").read_text())
    assert result["method_options"] == {"reduce": "target", "compile": False}
    # That they reach the factory: the hostile cases (sim_dim=600, compile=yes are refused).
    assert result["rows"][1]["video_tokens"] == result["video_tokens_full"] // 4
