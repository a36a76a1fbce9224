"""`train.report_to`: TensorBoard events read back with tensorboard's own reader, W&B in
offline mode read back from its run file; both equal `log.jsonl`, rank 0 only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TinySetup

from craft_train.config import ConfigError, load_config
from craft_train.trainer import StepInfo, train


class Killed(Exception):
    pass


def _log_rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]


def _tensorboard(out: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def _wandb_history(out: Path) -> list[dict]:
    """Every history record of the newest offline W&B run in `out/wandb`."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    (path,) = sorted(out.glob("wandb/offline-run-*/run-*.wandb"))[-1:]
    store = datastore.DataStore()
    store.open_for_scan(str(path))
    rows = []
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return rows


def _config(tiny: TinySetup, out: Path, report_to: list[str]) -> dict:
    return tiny.config(out, optim={"max_steps": 6, "epochs": 10},
                       train={"save_steps": 2, "report_to": report_to})  # fmt: skip


def test_tensorboard_events_equal_the_log_after_a_killed_run_resumes(
    tiny: TinySetup, tmp_path: Path
) -> None:
    out = tmp_path / "tb"
    cfg = load_config(data=_config(tiny, out, ["tensorboard"]), stage=1)

    def kill_after_3(info: StepInfo) -> None:
        if info.step == 3:  # checkpoint-2 on disk; step 3 is logged, then lost
            raise Killed

    with pytest.raises(Killed):
        train(cfg, on_step=kill_after_3)
    train(cfg)
    rows = _log_rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    loss = _tensorboard(out, "train/loss")
    assert [s for s, _ in loss] == [1, 2, 3, 4, 5, 6]  # step 3 once: the killed run's purged
    assert [v for _, v in loss] == pytest.approx([r["loss"] for r in rows], rel=1e-6)
    lr = _tensorboard(out, "train/lr")
    assert [v for _, v in lr] == pytest.approx([r["lr"] for r in rows], rel=1e-6)
    kept = _tensorboard(out, "train/tokens_kept_per_video")
    videos = cfg.optim.per_device_batch_size * cfg.optim.grad_accum
    assert [v for _, v in kept] == pytest.approx([r["tokens_after"] / videos for r in rows])
    for tag in ("train/grad_norm", "train/step_seconds", "train/skipped_videos"):
        assert len(_tensorboard(out, tag)) == 6, tag


def test_wandb_offline_run_holds_the_logged_steps(
    tiny: TinySetup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")  # no Sentry from a test
    out = tmp_path / "wb"
    train(load_config(data=_config(tiny, out, ["wandb", "tensorboard"]), stage=1))
    rows = _log_rows(out)
    history = _wandb_history(out)
    assert [h["_step"] for h in history] == [r["step"] for r in rows]
    assert [h["train/loss"] for h in history] == pytest.approx([r["loss"] for r in rows])
    assert [h["train/grad_norm"] for h in history] == pytest.approx([r["grad_norm"] for r in rows])
    assert (out / "wandb_run_id").read_text().strip() in str(next(out.glob("wandb/offline-*")))
    assert len(_tensorboard(out, "train/loss")) == 6  # both at once


def test_report_to_none_writes_log_jsonl_only(tiny: TinySetup, tmp_path: Path) -> None:
    out = tmp_path / "none"
    data = _config(tiny, out, ["none"])
    data["optim"]["max_steps"] = 2
    train(load_config(data=data, stage=1))
    assert len(_log_rows(out)) == 2
    assert not (out / "tensorboard").exists() and not (out / "wandb").exists()


@pytest.mark.parametrize("bad", [["none", "wandb"], ["wandb", "wandb"], ["mlflow"]])
def test_bad_report_to_is_a_config_error(tiny: TinySetup, tmp_path: Path, bad: list) -> None:
    with pytest.raises(ConfigError, match=r"train\.report_to"):
        load_config(data=_config(tiny, tmp_path, bad), stage=1)
