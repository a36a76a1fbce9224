"""`train.report_to`: a run's logged steps to TensorBoard and / or Weights & Biases (rank 0).

    train: {report_to: [tensorboard, wandb], wandb_project: craft}
    pip install 'craft-train[tensorboard]' 'craft-train[wandb]'

Every logged step (the row `log.jsonl` gets) becomes scalars under `train/`: loss, lr,
grad_norm, tokens_kept_per_video, kept_fraction, step_seconds, skipped_videos, epoch.
TensorBoard writes to `output_dir/tensorboard`; a resumed run purges the events past its
checkpoint, so every step appears once. W&B runs in `output_dir/wandb` under the id kept in
`output_dir/wandb_run_id`, so a resumed run continues the same W&B run; `WANDB_MODE=offline`
works as usual. Neither package is required. `check_reporters` (run with
`config.check_paths` by the CLI and `train`, before any model loads) refuses a backend that
is not installed, and W&B online without a login (no `WANDB_API_KEY`, no entry for its host
in the netrc file).
"""

from __future__ import annotations

import importlib.util
import netrc
import os
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from craft_train.config import ConfigError, TrainingConfig

__all__ = ["Reporter", "check_reporters", "open_reporter", "scalars"]

WANDB_OFFLINE = ("offline", "dryrun", "disabled")


def check_reporters(cfg: TrainingConfig) -> None:
    """Every backend of `train.report_to` can start: installed, and W&B logged in unless
    `WANDB_MODE` is offline / disabled.

    Raises:
        ConfigError: naming the backend and what to do.
    """
    for name in cfg.train.report_to:
        if name != "none" and importlib.util.find_spec(name) is None:
            raise ConfigError(
                f"train.report_to: {name} is not installed; pip install 'craft-train[{name}]'"
            )
    if "wandb" in cfg.train.report_to and not _wandb_can_log():
        raise ConfigError(
            "train.report_to: wandb is not logged in (no WANDB_API_KEY, no netrc entry for "
            f"{_wandb_host()}); run `wandb login`, or set WANDB_MODE=offline to log to "
            "output_dir/wandb and `wandb sync` it later"
        )


def _wandb_host() -> str:
    return urlsplit(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").netloc


def _wandb_can_log() -> bool:
    """Offline, or credentials where W&B looks for them (its environment variables, then
    the netrc file: `$NETRC`, else `~/.netrc` / `~/_netrc`). Only whether they are there is
    looked at, not what they hold."""
    if os.environ.get("WANDB_MODE", "online").lower() in WANDB_OFFLINE:
        return True
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    candidates = [os.environ["NETRC"]] if os.environ.get("NETRC") else ["~/.netrc", "~/_netrc"]
    for name in candidates:
        path = Path(name).expanduser()
        if path.is_file():
            try:
                return netrc.netrc(str(path)).authenticators(_wandb_host()) is not None
            except (netrc.NetrcParseError, OSError):
                return False
    return False


WANDB_ID_FILE = "wandb_run_id"


def scalars(row: dict[str, Any], videos_per_step: int) -> dict[str, float]:
    """The `train/...` scalars of one log row (rank 0's tokens: `videos_per_step` videos)."""
    out = {
        "train/loss": row["loss"],
        "train/lr": row["lr"],
        "train/step_seconds": row["seconds"],
        "train/skipped_videos": row["skipped_videos"],
        "train/epoch": row["epoch"],
        "train/tokens_kept_per_video": row["tokens_after"] / videos_per_step,
    }
    if row["grad_norm"] is not None:
        out["train/grad_norm"] = row["grad_norm"]
    if row["tokens_before"]:
        out["train/kept_fraction"] = row["tokens_after"] / row["tokens_before"]
    return {k: float(v) for k, v in out.items()}


class Reporter:
    """The open backends of one run (rank 0 only); `log(row)` after every logged step."""

    def __init__(self, cfg: TrainingConfig, output_dir: Path, start_step: int) -> None:
        self.videos_per_step = cfg.optim.per_device_batch_size * cfg.optim.grad_accum
        self.writer: Any = None
        self.run: Any = None
        names = cfg.train.report_to
        if "tensorboard" in names:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: a run resumed at step N hides the events a killed run wrote past N
            purge = start_step + 1 if start_step else None
            self.writer = SummaryWriter(str(output_dir / "tensorboard"), purge_step=purge)
        if "wandb" in names:
            self.run = _wandb_run(cfg, output_dir)

    def log(self, row: dict[str, Any]) -> None:
        values = scalars(row, self.videos_per_step)
        step = int(row["step"])
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(key, value, step)
        if self.run is not None:
            self.run.log(values, step=step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.run is not None:
            self.run.finish()


def _wandb_run(cfg: TrainingConfig, output_dir: Path) -> Any:
    """A W&B run in `output_dir/wandb`, resumed when the folder holds a run id."""
    import wandb

    id_file = output_dir / WANDB_ID_FILE
    run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
    id_file.write_text(run_id + "\n")
    (output_dir / "wandb").mkdir(parents=True, exist_ok=True)
    return wandb.init(
        project=cfg.train.wandb_project,
        name=output_dir.name,
        id=run_id,
        resume="allow",
        dir=str(output_dir),
        config=cfg.model_dump(mode="json"),
    )


def open_reporter(cfg: TrainingConfig, output_dir: Path, start_step: int) -> Reporter | None:
    """The reporter of `train.report_to`; None for `[]` or `[none]`. Call on rank 0 only."""
    if not [name for name in cfg.train.report_to if name != "none"]:
        return None
    return Reporter(cfg, output_dir, start_step)
