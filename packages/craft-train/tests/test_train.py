"""End-to-end training of the merge module (CPU, no DeepSpeed).

On the tiny random VLM: only the merge module (and, for CRAFT+, the LoRA adapters) may
change; checkpoints and logs; a killed run resumes to the same weights as an uninterrupted
one; stage 2 starts from stage 1. Learning (with a control that must not learn) is tested
in `test_distill.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import TinySetup
from safetensors.torch import load_file

from craft_core import CraftCompressor
from craft_train.checkpoint import find_latest_checkpoint
from craft_train.config import load_config
from craft_train.model import build_model
from craft_train.trainer import StepInfo, train


def test_stage1_trains_only_the_merge_module(tiny: TinySetup, tmp_path: Path) -> None:
    out = tmp_path / "stage1"
    cfg = load_config(
        data=tiny.config(out, optim={"max_steps": 24, "epochs": 10}, train={"save_steps": 12}),
        stage=1,
    )
    fresh = build_model(cfg).compressor  # the seeded initial merge module
    result = train(cfg)
    assert result.global_step == 24 and len(result.losses) == 24
    trained = CraftCompressor.from_pretrained(out / "craft")

    # The backbone is bit-identical to the checkpoint it was loaded from.
    assert result.bundle is not None
    from transformers import AutoModelForImageTextToText

    original = AutoModelForImageTextToText.from_pretrained(
        tiny.backbone, dtype=torch.float32
    ).state_dict()
    current = result.bundle.backbone.state_dict()
    assert set(original) == set(current)
    changed = [k for k in original if not torch.equal(original[k], current[k])]
    assert changed == []

    # The merge module moved, W_up first (adaLN-Zero starts it at 0), the rest after it.
    init, final = fresh.state_dict(), trained.state_dict()
    for name in (
        "merge.w_up.weight",
        "merge.w_down.weight",
        "merge.w_mod.weight",
        "merge.w_q.weight",
    ):
        assert not torch.equal(init[name], final[name]), name
    assert torch.equal(init["projection"], final["projection"])  # W_rand is never trained
    # The saved module is the one in memory.
    for name, tensor in result.bundle.compressor.state_dict().items():
        assert torch.equal(tensor.float(), final[name]), name

    # Checkpoints, logs.
    ckpt = out / "checkpoint-12"
    for part in (
        "craft/model.safetensors",
        "craft/config.json",
        "optimizer.pt",
        "scheduler.pt",
        "rng_state_0.pt",
        "train_state.json",
    ):
        assert (ckpt / part).is_file(), part
    assert find_latest_checkpoint(out) == out / "checkpoint-24"
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 25))
    assert all(r["tokens_after"] <= r["tokens_before"] for r in rows)
    assert all(
        r["tokens_after"] < r["tokens_before"] for r in rows if r["budget"].startswith("ratio")
    )
    assert {r["budget"].split("=")[0] for r in rows} == {"ratio", "threshold"}
    assert json.loads((out / "train_state.json").read_text())["finished"]


@pytest.fixture(scope="module")
def craft_plus_stage1(tiny: TinySetup, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 6-step CRAFT+ (LoRA) stage-1 run, checkpoints every 2 steps."""
    out = tmp_path_factory.mktemp("plus") / "stage1"
    cfg = load_config(data=_plus_config(tiny, out), stage=1)
    train(cfg)
    return out


def _plus_config(tiny: TinySetup, out: Path) -> dict:
    return tiny.config(
        out,
        model={"lora": {"enabled": True, "lr": 1e-3}},
        optim={"max_steps": 6, "epochs": 10},
        train={"save_steps": 2, "save_total_limit": 2},
    )


class Killed(Exception):
    pass


def test_killed_run_resumes_to_the_same_weights(
    tiny: TinySetup, craft_plus_stage1: Path, tmp_path: Path
) -> None:
    out = tmp_path / "killed"
    cfg = load_config(data=_plus_config(tiny, out), stage=1)

    def kill_after_5(info: StepInfo) -> None:
        if info.step == 5:  # checkpoint-4 is on disk, step 5 is lost
            raise Killed

    with pytest.raises(Killed):
        train(cfg, on_step=kill_after_5)
    assert find_latest_checkpoint(out) == out / "checkpoint-4"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]

    resumed = train(cfg)
    assert resumed.resumed_from == out / "checkpoint-4"
    assert len(resumed.losses) == 2

    reference = load_file(str(craft_plus_stage1 / "craft" / "model.safetensors"))
    mine = load_file(str(out / "craft" / "model.safetensors"))
    for name in reference:
        torch.testing.assert_close(mine[name], reference[name], rtol=1e-5, atol=1e-6)
    ref_lora = load_file(str(craft_plus_stage1 / "lora" / "adapter_model.safetensors"))
    my_lora = load_file(str(out / "lora" / "adapter_model.safetensors"))
    assert set(ref_lora) == set(my_lora) and ref_lora
    for name in ref_lora:
        torch.testing.assert_close(my_lora[name], ref_lora[name], rtol=1e-5, atol=1e-6)
    # The log is continuous: the lost step 5 is logged once, with the uninterrupted loss.
    ref_rows = [json.loads(x) for x in (craft_plus_stage1 / "log.jsonl").read_text().splitlines()]
    my_rows = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in my_rows] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(ref_rows, my_rows):
        assert a["budget"] == b["budget"] and a["lr"] == pytest.approx(b["lr"])
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


def test_craft_plus_trains_lora_and_leaves_base_weights(
    tiny: TinySetup, craft_plus_stage1: Path
) -> None:
    lora = load_file(str(craft_plus_stage1 / "lora" / "adapter_model.safetensors"))
    names = list(lora)
    assert names and all("language_model" in n for n in names)  # never the vision tower
    assert {n.split(".")[-3] for n in names if "lora_A" in n} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
    }
    assert any(float(t.abs().sum()) > 0 for n, t in lora.items() if "lora_B" in n)  # B starts at 0
    config = json.loads((craft_plus_stage1 / "lora" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["lora_dropout"]) == (32, 64, 0.05)


def test_stage2_starts_from_stage1(
    tiny: TinySetup, craft_plus_stage1: Path, tmp_path: Path
) -> None:
    out = tmp_path / "stage2"
    data = tiny.config(
        out,
        stage=2,
        model={"init_from": str(craft_plus_stage1), "lora": {"enabled": True}},
        optim={"lr": 6e-6, "max_steps": 2, "epochs": 10},
    )
    cfg = load_config(data=data, stage=2)
    stage1 = load_file(str(craft_plus_stage1 / "craft" / "model.safetensors"))
    start = build_model(cfg)
    for name, tensor in start.compressor.state_dict().items():
        assert torch.equal(tensor, stage1[name]), name
    stage1_lora = load_file(str(craft_plus_stage1 / "lora" / "adapter_model.safetensors"))
    start_lora = start.lora_state_dict()
    for name, tensor in stage1_lora.items():
        assert torch.equal(start_lora[name], tensor), name

    result = train(cfg)
    assert result.global_step == 2
    final = load_file(str(out / "craft" / "model.safetensors"))
    moved = [n for n in stage1 if not torch.equal(stage1[n], final[n])]
    assert moved  # it trained ...
    for name in stage1:  # ... from stage 1, with stage 2's small learning rate
        torch.testing.assert_close(final[name], stage1[name], atol=1e-4, rtol=0)


def test_videos_that_fail_to_decode_are_skipped_and_counted(
    tiny: TinySetup, tmp_path: Path
) -> None:
    (tmp_path / "garbage.mp4").write_bytes(b"not a video at all" * 100)
    rows = [json.loads(x) for x in tiny.captions.read_text().splitlines()][:6]
    for row in rows:
        row["video"] = str(tiny.root / row["video"])
    rows.insert(1, {"video": str(tmp_path / "garbage.mp4"), "caption": "x", "source": "even"})
    rows.insert(3, {"video": str(tmp_path / "missing.mp4"), "caption": "y", "source": "odd"})
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    data = tiny.config(out, data={"manifests": [str(manifest)]}, optim={"epochs": 1})
    result = train(load_config(data=data, stage=1))
    assert result.global_step == 4  # 8 rows / (batch 1 x accumulation 2)
    assert result.skipped_videos == 2
    state = json.loads((out / "train_state.json").read_text())
    assert state["skipped_videos"] == 2
    assert json.loads((out / "log.jsonl").read_text().splitlines()[-1])["skipped_videos"] == 2


def test_a_step_compresses_its_videos_in_one_call(
    tiny: TinySetup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step of two videos (a micro-batch of 2, no accumulation) is ONE `compress_many`
    call of the CRAFT module, and trains as the path before craft-core 1.1 (the module
    called once per video): the same losses (`==`; the forward is the same bits) and weights
    within 1e-6 (the batched backward sums the videos' gradients in another order)."""
    import craft_adapters.splice as splice

    seen: list[int] = []
    own = CraftCompressor.compress_many

    def spy(self: CraftCompressor, features: list, coords: list, budget: object, **kw: object):  # type: ignore[no-untyped-def]
        seen.append(len(features))
        return own(self, features, coords, budget, **kw)  # type: ignore[arg-type]

    def run(out: Path) -> tuple[list[float], dict[str, torch.Tensor]]:
        optim = {"max_steps": 2, "epochs": 10, "grad_accum": 1, "per_device_batch_size": 2}
        cfg = load_config(data=tiny.config(out, optim=optim), stage=1)
        result = train(cfg)
        assert result.bundle is not None
        return result.losses, result.bundle.compressor.state_dict()

    monkeypatch.setattr(CraftCompressor, "compress_many", spy)
    losses, weights = run(tmp_path / "batched")
    assert seen == [2, 2]  # one call a step, both videos
    alone: list[int] = []

    def one_a_video(comp: object, feats: list, coords: list, budget: object, **kw: object) -> list:
        alone.extend(1 for _ in feats)
        return [comp(f, c, budget) for f, c in zip(feats, coords)]  # type: ignore[operator]

    monkeypatch.setattr(splice, "compress_many", one_a_video)
    want_losses, want_weights = run(tmp_path / "alone")
    assert seen == [2, 2] and alone == [1, 1, 1, 1]
    assert losses == want_losses
    worst = max(float((weights[k] - v).abs().max()) for k, v in want_weights.items())
    print(f"largest weight difference after 2 steps: {worst:.3g}")
    for name, tensor in want_weights.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-6, msg=name)
