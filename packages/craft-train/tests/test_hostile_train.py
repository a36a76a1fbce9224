"""Hostile input to craft-train, table-driven (issue 12): non-finite and out-of-range config
values, broken config files and overrides on the command line, a run that diverges (it must
stop and never save non-finite weights), resuming with a changed config, and a SIGKILLed
`craft-train` process that resumes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import TinySetup
from safetensors.torch import load_file

from craft_train import cli
from craft_train.config import ConfigError, config_drift, load_config
from craft_train.trainer import TrainingDiverged, train

CONFIG_CASES: list[tuple[str, str]] = [
    # (override, field the error must name)
    ("optim.lr=.inf", "optim.lr"),
    ("optim.lr=.nan", "optim.lr"),
    ("optim.lr=-1", "optim.lr"),
    ("optim.lr=0", "optim.lr"),
    ("optim.lr=fast", "optim.lr"),
    ("optim.max_grad_norm=.inf", "optim.max_grad_norm"),
    ("optim.max_grad_norm=.nan", "optim.max_grad_norm"),
    ("optim.weight_decay=.nan", "optim.weight_decay"),
    ("optim.warmup_ratio=.inf", "optim.warmup_ratio"),
    ("optim.grad_accum=0", "optim.grad_accum"),
    ("optim.per_device_batch_size=0", "optim.per_device_batch_size"),
    ("optim.epochs=0", "optim.epochs"),
    ("optim.seed=-1", "optim.seed"),
    ("optim.betas=[0.9]", "optim.betas"),
    ("model.lora.lr=.inf", "model.lora.lr"),
    ("data.max_frames=0", "data.max_frames"),
    ("data.fps=.nan", "data.fps"),
    ("train.save_steps=0", "train.save_steps"),
    ("optim.colour=red", "optim.colour"),
    ("nosection.x=1", "nosection"),
    ("optim=3", "optim"),
    ("optim.lr", "optim.lr"),
    ("=3", "no field"),
    # issue 25: a boolean is not a number (lax pydantic would read true as 1)
    ("optim.epochs=true", "optim.epochs"),
    ("optim.grad_accum=true", "optim.grad_accum"),
    ("optim.lr=true", "optim.lr"),
    ("data.max_frames=yes", "data.max_frames"),
    ("data.fps=true", "data.fps"),
    ("model.lora.rank=true", "model.lora.rank"),
    ("train.save_steps=false", "train.save_steps"),
    ("budget.ratios=[true, 8]", "budget.ratios"),
    ("optim.betas=[0.9, true]", "optim.betas"),
]


def test_control_bool_fields_still_take_booleans(tiny: TinySetup, tmp_path: Path) -> None:
    cfg = load_config(
        data=tiny.config(tmp_path), overrides=["model.lora.enabled=true", "optim.lr=1"], stage=1
    )
    assert cfg.model.lora.enabled is True and cfg.optim.lr == 1.0


@pytest.mark.parametrize(("override", "field"), CONFIG_CASES)
def test_bad_config_values_name_the_field(
    tiny: TinySetup, tmp_path: Path, override: str, field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(data=tiny.config(tmp_path), overrides=[override], stage=1)
    assert field in str(info.value)


CLI_CASES: list[tuple[str, list[str], int, str]] = [
    ("missing-config", ["stage1", "--config", "{tmp}/nope.yaml"], 2, "nope.yaml"),
    ("not-yaml", ["stage1", "--config", "{tmp}/bad.yaml"], 2, "not valid YAML"),
    ("yaml-list", ["stage1", "--config", "{tmp}/list.yaml"], 2, "mapping"),
    ("lr-inf", ["stage1", "--config", "{tmp}/ok.yaml", "--set", "optim.lr=.inf"], 2, "optim.lr"),
    ("lr-nan-bare", ["stage1", "--config", "{tmp}/ok.yaml", "optim.lr=.nan"], 2, "optim.lr"),
    ("bad-override", ["stage1", "--config", "{tmp}/ok.yaml", "--set", "lr"], 2, "section.field"),
    ("stage-mismatch", ["stage2", "--config", "{tmp}/ok.yaml"], 2, "stage"),
    (
        "manifest-missing",
        ["stage1", "--config", "{tmp}/ok.yaml", "--set", "data.manifests=[/nope.jsonl]"],
        2,
        "data.manifests",
    ),
    (
        "resume-missing",
        ["stage1", "--config", "{tmp}/ok.yaml", "--set", "train.resume=/nope"],
        2,
        "train.resume",
    ),
    (
        "check-all-videos-missing",
        ["stage1", "--check", "--config", "{tmp}/novideo.yaml"],
        2,
        "all 2 videos are missing",
    ),
    (
        "run-all-videos-missing",
        ["stage1", "--config", "{tmp}/novideo.yaml"],
        2,
        "all 2 videos are missing",
    ),
    ("no-command", [], 2, "usage"),
    ("unknown-command", ["stage3"], 2, "stage3"),
]


@pytest.mark.parametrize(
    ("argv", "code", "text"), [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES]
)
def test_cli_errors_are_one_line(
    tiny: TinySetup,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    code: int,
    text: str,
) -> None:
    (tmp_path / "bad.yaml").write_text("optim: [unclosed\n")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(tiny.config(tmp_path / "out")))
    rows = [{"video": f"gone{i}.mp4", "caption": "c", "source": "s"} for i in range(2)]
    (tmp_path / "novideo.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    novideo = tiny.config(tmp_path / "out", data={"manifests": [str(tmp_path / "novideo.jsonl")]})
    (tmp_path / "novideo.yaml").write_text(yaml.safe_dump(novideo))
    try:
        got = cli.main([a.format(tmp=tmp_path) for a in argv])
    except SystemExit as exit_:
        got = int(exit_.code or 0)
    err = capsys.readouterr().err
    assert got == code, err
    assert text in err and "Traceback" not in err


def test_unexpected_error_is_one_line_unless_debug(
    tiny: TinySetup, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(tiny.config(tmp_path / "out")))

    def full_disk(cfg: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("craft_train.trainer.train", full_disk)
    assert cli.main(["stage1", "--config", str(tmp_path / "ok.yaml")]) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "Traceback" not in err
    with pytest.raises(OSError):
        cli.main(["--debug", "stage1", "--config", str(tmp_path / "ok.yaml")])


def _finite_checkpoints(out: Path) -> list[Path]:
    found = []
    for weights in out.rglob("model.safetensors"):
        tensors = load_file(str(weights))
        assert all(bool(torch.isfinite(t).all()) for t in tensors.values()), weights
        found.append(weights)
    return found


@pytest.mark.parametrize("clip", [None, 1.0], ids=["no-clip", "clip-1"])
def test_a_diverging_run_stops_and_saves_no_nonfinite_weights(
    tiny: TinySetup, tmp_path: Path, clip: float | None
) -> None:
    """lr = 1e30 is finite and accepted by the config; the weights blow up at once."""
    out = tmp_path / "run"
    cfg = load_config(
        data=tiny.config(
            out, optim={"lr": 1e30, "max_grad_norm": clip, "max_steps": 4}, train={"save_steps": 1}
        ),
        stage=1,
    )
    with pytest.raises(TrainingDiverged, match=r"non-finite|not finite"):
        train(cfg)
    assert not (out / "craft").exists()  # no final weights
    _finite_checkpoints(out)  # whatever checkpoint was written before is finite


def test_control_a_sane_lr_does_not_diverge(tiny: TinySetup, tmp_path: Path) -> None:
    """The control of the test above: the same run at a sane lr ends with finite weights."""
    out = tmp_path / "run"
    cfg = load_config(data=tiny.config(out, optim={"lr": 2e-2, "max_steps": 2}), stage=1)
    assert train(cfg).global_step == 2
    assert _finite_checkpoints(out)


class _Stop(Exception):
    pass


def _stop_after(n: int) -> Any:
    def on_step(info: Any) -> None:
        if info.step >= n:
            raise _Stop

    return on_step


@pytest.fixture(scope="module")
def interrupted(tiny: TinySetup, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A run of 4 steps stopped after its checkpoint at step 2."""
    out = tmp_path_factory.mktemp("interrupted") / "run"
    data = tiny.config(out, optim={"max_steps": 4}, train={"save_steps": 2})
    with pytest.raises(_Stop):
        train(load_config(data=data, stage=1), on_step=_stop_after(2))
    return {"out": out, "data": data, "config": (out / "config.yaml").read_text()}


DRIFT_CASES: list[tuple[str, dict[str, Any], bool]] = [
    # (id, changed sections, refused?)
    ("lr", {"optim": {"lr": 1e-3}}, True),
    ("seed", {"optim": {"seed": 7}}, True),
    ("grad-accum", {"optim": {"grad_accum": 1}}, True),
    ("max-frames", {"data": {"max_frames": 4}}, True),
    ("budget", {"budget": {"ratios": [2.0]}}, True),
    ("craft-gate", {"model": {"craft": {"gate_hidden": 16}}}, True),
    ("logging-steps", {"train": {"logging_steps": 3}}, False),
    ("progress-bar", {"train": {"progress_bar": True}}, False),
    ("save-limit", {"train": {"save_total_limit": 5}}, False),
]


@pytest.mark.parametrize(
    ("change", "refused"), [c[1:] for c in DRIFT_CASES], ids=[c[0] for c in DRIFT_CASES]
)
def test_config_drift_on_resume(
    interrupted: dict[str, Any], change: dict[str, Any], refused: bool
) -> None:
    data = json.loads(json.dumps(interrupted["data"]))
    for section, values in change.items():
        merged = {**data.get(section, {}), **values}
        if section == "model" and "craft" in values:
            merged["craft"] = {**data["model"]["craft"], **values["craft"]}
        data[section] = merged
    cfg = load_config(data=data, stage=1)
    saved = yaml.safe_load(interrupted["config"])
    assert bool(config_drift(saved, cfg)) == refused


def test_resume_with_changed_lr_is_refused_and_config_yaml_kept(
    interrupted: dict[str, Any],
) -> None:
    data = json.loads(json.dumps(interrupted["data"]))
    data["optim"]["lr"] = 1e-3
    with pytest.raises(ConfigError, match=r"optim\.lr"):
        train(load_config(data=data, stage=1))
    assert (interrupted["out"] / "config.yaml").read_text() == interrupted["config"]


def test_sigkill_then_resume_ends_like_an_uninterrupted_run(
    tiny: TinySetup, tmp_path: Path
) -> None:
    """`craft-train stage1` is SIGKILLed once its first checkpoint exists; the same command
    resumes and ends with the merge module of a run that was never interrupted."""
    ref_out, out = tmp_path / "ref", tmp_path / "killed"
    options = {"optim": {"max_steps": 3}, "train": {"save_steps": 1}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(tiny.config(out, **options)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "craft_train.cli", "stage1", "--config"]
    proc = subprocess.Popen([*command, str(tmp_path / "run.yaml")], env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / "checkpoint-1" / "train_state.json").exists():
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "craft").exists(), "the run finished before it could be killed"
    done = subprocess.run(
        [*command, str(tmp_path / "run.yaml")], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    train(load_config(data=tiny.config(ref_out, **options), stage=1))
    ref = load_file(str(ref_out / "craft" / "model.safetensors"))
    mine = load_file(str(out / "craft" / "model.safetensors"))
    for name in ref:
        torch.testing.assert_close(mine[name], ref[name], rtol=1e-5, atol=1e-6)
    steps = [json.loads(r)["step"] for r in (out / "log.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 3


def test_check_counts_missing_videos_when_some_exist(
    tiny: TinySetup, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Some videos missing: `--check` passes (training skips them) but says how many."""
    rows = [json.loads(line) for line in tiny.captions.read_text().splitlines()]
    rows = [{**r, "video": str(tiny.root / r["video"])} for r in rows[:3]]
    rows.append({"video": str(tmp_path / "gone.mp4"), "caption": "c", "source": "even"})
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = tiny.config(tmp_path / "out", data={"manifests": [str(tmp_path / "m.jsonl")]})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    assert cli.main(["stage1", "--check", "--config", str(tmp_path / "c.yaml")]) == 0
    captured = capsys.readouterr()
    assert "config ok" in captured.out
    assert "missing video" in captured.err and "gone.mp4" in captured.err
    # control: every video present, no warning
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(tiny.config(tmp_path / "out")))
    assert cli.main(["stage1", "--check", "--config", str(tmp_path / "c.yaml")]) == 0
    assert "missing" not in capsys.readouterr().err


def test_a_full_disk_while_saving_a_checkpoint_keeps_the_last_good_one(
    tiny: TinySetup,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """ENOSPC simulated in the writer of the second checkpoint: the run stops saying so, the
    half-written folder is gone, checkpoint-1 is complete, and the same command resumes."""
    from craft_train import trainer
    from craft_train.checkpoint import find_latest_checkpoint

    out = tmp_path / "run"
    data = tiny.config(out, optim={"max_steps": 3}, train={"save_steps": 1})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    real, calls = trainer.save_rng_state, []

    def writer(folder: Path, rank: int) -> None:
        calls.append(folder)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(folder, rank)

    monkeypatch.setattr(trainer, "save_rng_state", writer)
    assert cli.main(["stage1", "--config", str(tmp_path / "c.yaml")]) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "checkpoint-2" in err
    assert "checkpoint-1" in err and "kept" in err and "Traceback" not in err
    assert find_latest_checkpoint(out) == out / "checkpoint-1"
    assert not list(out.glob("*.tmp")) and not (out / "craft").exists()
    assert _finite_checkpoints(out)
    monkeypatch.setattr(trainer, "save_rng_state", real)  # disk freed: the same command resumes
    assert cli.main(["stage1", "--config", str(tmp_path / "c.yaml")]) == 0
    assert find_latest_checkpoint(out) == out / "checkpoint-3" and (out / "craft").is_dir()
