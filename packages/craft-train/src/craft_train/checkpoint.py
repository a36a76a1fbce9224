"""Checkpoint folders: what they hold, how they are found, and how old ones are pruned.

    output_dir/
      config.yaml                 the resolved config of the run
      log.jsonl                   one JSON object per logged step
      checkpoint-500/
        craft/                    merge module: CraftCompressor.from_pretrained(".../craft")
        lora/                     LoRA adapter (CRAFT+): PeftModel.from_pretrained(vlm, ".../lora")
        deepspeed/                DeepSpeed engine state (ZeRO-2 optimizer shards), or
        optimizer.pt              the optimizer state without DeepSpeed
        scheduler.pt              the LR schedule
        rng_state_<rank>.pt       RNG states of every rank
        train_state.json          written LAST: a folder without it is incomplete
      craft/, lora/, train_state.json   the final result

A checkpoint is written into `checkpoint-N.tmp` and renamed when complete, so a run killed
while saving leaves no folder that looks finished.

The `.pt` files are read with `load_state_file` (`torch.load(weights_only=True)`): tensors and
plain values only, so a checkpoint folder from someone else cannot run code at resume. A file
holding anything else is refused with `UnsafeCheckpoint`, naming it.
"""

from __future__ import annotations

import json
import pickle
import random
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from craft_train.config import ConfigError

__all__ = [
    "TRAIN_STATE",
    "TrainState",
    "UnsafeCheckpoint",
    "find_latest_checkpoint",
    "load_rng_state",
    "load_state_file",
    "prune_checkpoints",
    "save_rng_state",
]

TRAIN_STATE = "train_state.json"
LOG_FILE = "log.jsonl"  # a run folder's log, one JSON object per line
CONFIG_FILE = "config.yaml"  # the resolved config the run was started with
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


class UnsafeCheckpoint(ConfigError):
    """A checkpoint file holds pickled objects other than tensors and plain values (the CLI
    exits with 2, as for any bad input)."""


def load_state_file(path: Path) -> Any:
    """A `.pt` file written by `torch.save` of a state dict, loaded without running code.

    `weights_only=True` unpickles tensors, numbers, strings, lists, tuples and dicts only: the
    optimizer, LR-schedule and RNG states need nothing else. Unpickling any other object can
    run arbitrary code, so a file that holds one is refused (`UnsafeCheckpoint`), naming it.
    """
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UnsafeCheckpoint(
            f"{path} holds Python objects other than tensors and plain values, which could "
            f"run code when loaded; refused ({first}). craft-train never writes such a file: "
            "resume only from checkpoint folders you trust"
        ) from err


@dataclass
class TrainState:
    """Where a run stands; enough, with the weights and optimizer, to continue it exactly."""

    global_step: int
    total_steps: int
    steps_per_epoch: int
    world_size: int
    examples: int
    skipped_videos: int = 0
    finished: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def save(self, folder: Path) -> None:
        (folder / TRAIN_STATE).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, folder: Path) -> TrainState:
        return cls(**json.loads((folder / TRAIN_STATE).read_text()))


def checkpoint_step(folder: Path) -> int | None:
    """N of a complete `checkpoint-N` folder, else None."""
    match = _CHECKPOINT.match(folder.name)
    if match is None or not (folder / TRAIN_STATE).is_file():
        return None
    return int(match.group(1))


def find_latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The complete `checkpoint-N` folder of `output_dir` with the largest N, or None."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    found = [(step, p) for p in folder.iterdir() if (step := checkpoint_step(p)) is not None]
    return max(found)[1] if found else None


def prune_checkpoints(output_dir: str | Path, keep: int | None) -> None:
    """Delete all but the newest `keep` complete checkpoints, and stale `.tmp` folders."""
    folder = Path(output_dir)
    for tmp in folder.glob("checkpoint-*.tmp"):
        shutil.rmtree(tmp, ignore_errors=True)
    if keep is None:
        return
    found = sorted((step, p) for p in folder.iterdir() if (step := checkpoint_step(p)) is not None)
    for _, path in found[:-keep] if keep > 0 else found:
        shutil.rmtree(path, ignore_errors=True)


def save_rng_state(folder: Path, rank: int) -> None:
    """Python, torch CPU and CUDA generator states of this rank (LoRA dropout uses them)."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    torch.save(state, folder / f"rng_state_{rank}.pt")


def load_rng_state(folder: Path, rank: int) -> bool:
    """Restore what `save_rng_state` wrote; False when this rank has no file."""
    path = folder / f"rng_state_{rank}.pt"
    if not path.is_file():
        return False
    state = load_state_file(path)
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    return True
