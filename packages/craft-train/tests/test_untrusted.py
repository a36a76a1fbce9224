"""Untrusted checkpoint files (issue 32): a checkpoint folder from someone else must not run
code at resume. Each `.pt` file of a checkpoint is replaced by a pickle that would create a
marker file when unpickled; resuming refuses it, naming the file, and the marker never appears.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import TinySetup

from craft_train import cli
from craft_train.checkpoint import UnsafeCheckpoint, find_latest_checkpoint, load_state_file
from craft_train.config import load_config
from craft_train.trainer import StepInfo, train


class _Payload:
    """Unpickling this runs `open(marker, "w")`: what a hostile checkpoint file would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


class _Stop(Exception):
    pass


@pytest.fixture(scope="module")
def stopped_run(tiny: TinySetup, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run stopped after step 1: `checkpoint-1` holds every `.pt` file a resume reads."""
    out = tmp_path_factory.mktemp("untrusted") / "run"
    cfg = load_config(data=tiny.config(out, optim={"max_steps": 2}, train={"save_steps": 1}))

    def stop(info: StepInfo) -> None:
        if info.step == 1:
            raise _Stop

    with pytest.raises(_Stop):
        train(cfg, on_step=stop)
    assert find_latest_checkpoint(out) == out / "checkpoint-1"
    return out


def _copy_run(stopped_run: Path, tiny: TinySetup, tmp_path: Path) -> tuple[Path, Path]:
    out = tmp_path / "run"
    shutil.copytree(stopped_run, out)
    data = tiny.config(out, optim={"max_steps": 2}, train={"save_steps": 1})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    return out, tmp_path / "c.yaml"


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng_state_0.pt"])
def test_resume_refuses_a_pickle_that_runs_code(
    name: str,
    stopped_run: Path,
    tiny: TinySetup,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out, config = _copy_run(stopped_run, tiny, tmp_path)
    marker = tmp_path / "pwned"
    target = out / "checkpoint-1" / name
    torch.save({"state": {}, "payload": _Payload(marker)}, target)
    # the payload is live: the unsafe loader would run it
    torch.load(target, weights_only=False)
    assert marker.exists()
    marker.unlink()

    assert cli.main(["stage1", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert str(target) in err and "refused" in err and "trust" in err, err
    assert "Traceback" not in err
    assert not marker.exists()
    assert not (out / "craft").exists()  # the run did not go on


def test_control_an_untouched_checkpoint_resumes(
    stopped_run: Path, tiny: TinySetup, tmp_path: Path
) -> None:
    out, config = _copy_run(stopped_run, tiny, tmp_path)
    assert cli.main(["stage1", "--config", str(config)]) == 0
    assert find_latest_checkpoint(out) == out / "checkpoint-2" and (out / "craft").is_dir()


def test_load_state_file_names_the_file(tmp_path: Path) -> None:
    marker, path = tmp_path / "pwned", tmp_path / "state.pt"
    torch.save([1, _Payload(marker)], path)
    with pytest.raises(UnsafeCheckpoint, match=r"state\.pt"):
        load_state_file(path)
    assert not marker.exists()
    # control: what craft-train itself writes (tensors, numbers, tuples) loads
    torch.save({"python": (3, tuple(range(5)), None), "torch": torch.ones(2)}, path)
    assert load_state_file(path)["python"] == (3, (0, 1, 2, 3, 4), None)
