"""Python warnings raised while `craft-train` runs reach the user in the CLI's own one-line
form (`craft-train: warning: ...`), not as `file.py:N: UserWarning` plus a source line; so
do the CLI's own warnings, once each; a reporter that cannot start is refused before any
model loads."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import TinySetup

from craft_train import cli, trainer
from craft_train.config import ConfigError, load_config


def test_warnings_are_one_line(
    tiny: TinySetup,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(tiny.config(tmp_path / "out")))
    real = cli.check_paths

    def check_paths(cfg: Any) -> None:  # a library warning while the config is checked
        warnings.warn("the manifest uses a deprecated field", UserWarning, stacklevel=1)
        warnings.warn("a future default changes", FutureWarning, stacklevel=1)
        real(cfg)

    monkeypatch.setattr(cli, "check_paths", check_paths)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert cli.main(["stage1", "--check", "--config", str(tmp_path / "c.yaml")]) == 0
        shown = warnings.showwarning
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "craft-train: warning: the manifest uses a deprecated field",
        "craft-train: warning: FutureWarning: a future default changes",
    ]
    assert shown is not cli._show_warning  # Python's own format is back after main


def test_rows_left_out_are_one_prefixed_warning_line(
    tiny: TinySetup,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A real (one-step) run: the rows left out are told once, in the CLI's own form."""
    extra = tmp_path / "extra.jsonl"
    rows = [{"video": str(tiny.root / "clip0.mp4"), "caption": "mostly red"}, {"caption": "x"}]
    extra.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = tiny.config(tmp_path / "out", optim={"max_steps": 1})
    data["data"]["manifests"].append(str(extra))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    assert cli.main(["stage1", "--config", str(tmp_path / "c.yaml")]) == 0
    said = [x for x in capsys.readouterr().err.splitlines() if "cannot be used" in x]
    assert said == [
        f"craft-train: warning: 1 data rows cannot be used and are left out (first: {extra}:2: "
        "no video (field 'video' missing or empty)); `craft-train ... --check` lists them"
    ]
    assert not [r for r in caplog.records if "cannot be used" in r.getMessage()]  # not twice


def _no_wandb_login(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No W&B credentials anywhere it looks (an empty netrc file of the test's own)."""
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("")
    monkeypatch.setenv("NETRC", str(netrc))
    return netrc


def test_wandb_without_login_is_refused_before_the_model_loads(
    tiny: TinySetup,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    netrc = _no_wandb_login(monkeypatch, tmp_path)
    data = tiny.config(tmp_path / "out", train={"report_to": ["wandb"]})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    argv = ["stage1", "--check", "--config", str(tmp_path / "c.yaml")]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == (
        "craft-train: train.report_to: wandb is not logged in (no WANDB_API_KEY, no netrc entry "
        "for api.wandb.ai); run `wandb login`, or set WANDB_MODE=offline to log to "
        "output_dir/wandb and `wandb sync` it later\n"
    )

    def no_model(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model was built before the reporters were checked")

    monkeypatch.setattr(trainer, "build_model", no_model)
    with pytest.raises(ConfigError, match="wandb is not logged in"):
        trainer.train(load_config(data=data, stage=1))
    monkeypatch.setenv("WANDB_MODE", "offline")  # offline needs no login
    assert cli.main(argv) == 0
    monkeypatch.delenv("WANDB_MODE")
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "0" * 40 + "\n")
    assert cli.main(argv) == 0  # logged in (`wandb login` writes this entry)


def test_a_missing_tensorboard_is_refused_by_name(
    tiny: TinySetup,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real(name, *a))  # fmt: skip
    data = tiny.config(tmp_path / "out", train={"report_to": ["tensorboard"]})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    assert cli.main(["stage1", "--check", "--config", str(tmp_path / "c.yaml")]) == 2
    assert capsys.readouterr().err == (
        "craft-train: train.report_to: tensorboard is not installed; pip install "
        "'craft-train[tensorboard]'\n"
    )
