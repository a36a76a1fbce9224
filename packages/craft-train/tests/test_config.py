"""Configs: YAML + overrides, every shipped example parses with the paper's values, and a bad
config is rejected with the offending field named before anything loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from craft_train.cli import main, shipped_configs
from craft_train.config import ConfigError, apply_overrides, check_paths, load_config
from craft_train.distributed import load_deepspeed_config, resolve_deepspeed

CONFIGS = Path(__file__).parents[1] / "src" / "craft_train" / "configs"


def _minimal(tmp_path: Path, stage: int = 1) -> dict:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"video": "a.mp4", "caption": "x", "source": "s"}) + "\n")
    return {
        "stage": stage,
        "model": {"backbone": "some/model", "init_from": None if stage == 1 else str(tmp_path)},
        "data": {"manifests": [str(manifest)]},
        "optim": {"lr": 1e-3},
        "train": {"output_dir": str(tmp_path / "out")},
    }


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_shipped_configs_carry_the_paper_hyperparameters(name: str) -> None:
    cfg = load_config(CONFIGS / name)
    assert cfg.optim.lr == (6e-6 if cfg.stage == 2 else 4e-3)  # distill: stage 1's rate
    assert (cfg.model.init_from is None) == (cfg.stage != 2)
    o = cfg.optim
    assert (o.scheduler, o.warmup_ratio, o.weight_decay, o.max_grad_norm) == (
        "cosine",
        0.02,
        1e-2,
        1.0,
    )
    assert (o.epochs, o.per_device_batch_size, o.grad_accum, o.bf16) == (1, 1, 4, True)
    assert o.gradient_checkpointing
    d = cfg.data
    assert (d.fps, d.max_frames, d.max_seq_len) == (2.0, 768, 32768)
    assert cfg.mixture().default_cap == 30000
    lora = cfg.model.lora
    assert (lora.rank, lora.alpha, lora.dropout, lora.lr) == (32, 64, 0.05, 1e-4)
    assert lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    b = cfg.budget
    assert (b.p_threshold, b.thresholds, b.ratios) == (
        0.5,
        [0.75, 0.8, 0.85, 0.9, 0.95],
        [2, 4, 8, 16, 32],
    )
    assert cfg.train.deepspeed == "zero2"


def test_three_backbones_two_stages_shipped() -> None:
    names = shipped_configs()
    for model in ("qwen3_5_4b", "qwen2_5_vl_7b", "llava_ov_7b"):
        assert f"{model}_stage1.yaml" in names and f"{model}_stage2.yaml" in names


def test_overrides_parse_yaml_values(tmp_path: Path) -> None:
    cfg = load_config(
        data=_minimal(tmp_path),
        overrides=[
            "optim.lr=1e-3",
            "budget.ratios=[2, 4]",
            "model.lora.enabled=true",
            "train.deepspeed=null",
        ],
    )
    assert cfg.optim.lr == 1e-3 and cfg.budget.ratios == [2, 4]
    assert cfg.model.lora.enabled and cfg.train.deepspeed is None


def test_override_creates_missing_sections() -> None:
    data: dict = {}
    apply_overrides(data, ["a.b.c=3"])
    assert data == {"a": {"b": {"c": 3}}}


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("optim.lr=-1", "optim.lr"),
        ("optim.lr=fast", "optim.lr"),
        ("optim.grad_acum=4", "optim.grad_acum"),  # misspelt: unknown fields are errors
        ("budget.thresholds=[0.9, 1.5]", "budget.thresholds"),
        ("budget.ratios=[0.5]", "budget.ratios"),
        ("model.lora.rank=0", "model.lora.rank"),
        ("model.craft.rank=7", "model.craft"),
        ("model.craft.hidden_size=64", "model.craft"),
        ("data.fps=0", "data.fps"),
        ("optim.warmup_ratio=1.5", "optim.warmup_ratio"),
        ("data.mixture.sources.x.cap=0", "data.mixture.sources.x.cap"),
        ("train.deepspeed=zero2", None),  # fine
    ],
)
def test_bad_values_are_rejected_naming_the_field(
    tmp_path: Path, override: str, field: str | None
) -> None:
    if field is None:
        load_config(data=_minimal(tmp_path), overrides=[override])
        return
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(data=_minimal(tmp_path), overrides=[override])


def test_stage2_needs_init_from(tmp_path: Path) -> None:
    data = _minimal(tmp_path, stage=2)
    data["model"]["init_from"] = None
    with pytest.raises(ConfigError, match=r"model\.init_from"):
        load_config(data=data)


def test_stage_mismatch_with_the_subcommand(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="stage"):
        load_config(data=_minimal(tmp_path), stage=2)


def test_check_paths_names_the_field(tmp_path: Path) -> None:
    data = _minimal(tmp_path)
    data["data"]["manifests"].append(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ConfigError, match=r"data\.manifests\.1"):
        check_paths(load_config(data=data))
    data = _minimal(tmp_path)
    data["train"]["deepspeed"] = str(tmp_path / "nope.json")
    with pytest.raises(ConfigError, match=r"train\.deepspeed"):
        check_paths(load_config(data=data))


def test_mixture_file(tmp_path: Path) -> None:
    mix = tmp_path / "mix.yaml"
    mix.write_text(yaml.safe_dump({"default_cap": 5, "sources": {"s": {"target": 9}}}))
    data = _minimal(tmp_path)
    data["data"]["mixture"] = str(mix)
    cfg = load_config(data=data)
    assert cfg.mixture().sources["s"].target == 9
    mix.write_text(yaml.safe_dump({"sources": {"s": {"cap": 3, "target": 9}}}))
    with pytest.raises(ConfigError, match=r"sources\.s"):
        load_config(data=data)


def test_deepspeed_auto_values_are_filled_from_the_config(tmp_path: Path) -> None:
    cfg = load_config(data=_minimal(tmp_path), overrides=["optim.grad_accum=3", "optim.bf16=false"])
    ds = resolve_deepspeed(load_deepspeed_config("zero2"), cfg)
    assert ds["zero_optimization"]["stage"] == 2
    assert ds["gradient_accumulation_steps"] == 3
    assert ds["train_micro_batch_size_per_gpu"] == 1
    assert ds["gradient_clipping"] == 1.0
    assert ds["bf16"]["enabled"] is False
    assert "auto" not in json.dumps(ds)
    clash = load_deepspeed_config("zero2") | {"gradient_accumulation_steps": 8}
    with pytest.raises(ConfigError, match=r"optim\.grad_accum"):
        resolve_deepspeed(clash, cfg)


@pytest.mark.parametrize(
    ("text", "fault"), [("{not json", "not valid JSON"), ("[1, 2]", "must be a JSON object")]
)
def test_a_bad_deepspeed_file_is_named(tmp_path: Path, text: str, fault: str) -> None:
    path = tmp_path / "ds.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"^train\.deepspeed: .*ds\.json: {fault}"):
        load_deepspeed_config(str(path))


def test_cli_rejects_bad_config_before_loading_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_minimal(tmp_path)))
    assert main(["stage1", "--config", str(path), "--set", "optim.weight_decay=-1"]) == 2
    assert "optim.weight_decay" in capsys.readouterr().err
    assert main(["stage2", "--config", str(path)]) == 2
    assert "stage" in capsys.readouterr().err
    assert main(["stage1", "--config", str(path), "optim.max_steps=0"]) == 2
    assert "optim.max_steps" in capsys.readouterr().err


def test_cli_show_config_and_configs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["configs"]) == 0
    assert "qwen3_5_4b_stage1.yaml" in capsys.readouterr().out
    assert main(["show-config", "--config", "qwen3_5_4b_stage1.yaml", "--set", "optim.lr=0.5"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["optim"]["lr"] == 0.5 and shown["stage"] == 1
