"""Processes, devices and DeepSpeed: everything about where the training runs.

The shipped DeepSpeed config (`zero2`) uses `"auto"` for the values the training config
already decides (micro-batch, accumulation, clipping, bf16, bucket sizes); `resolve_deepspeed`
fills them in, so the JSON and the YAML can never disagree.
"""

from __future__ import annotations

import copy
import os
import socket
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from craft_train.config import ConfigError, TrainingConfig
from craft_train.data import json_object

__all__ = ["load_deepspeed_config", "make_accelerator", "resolve_deepspeed"]

_BUCKET = 500_000_000


def load_deepspeed_config(name_or_path: str) -> dict[str, Any]:
    """`zero2` (the shipped file) or a JSON file's content."""
    if name_or_path == "zero2":
        text = resources.files("craft_train").joinpath("deepspeed_configs/zero2.json").read_text()
    else:
        text = Path(name_or_path).read_text()
    return json_object(text, f"train.deepspeed: {name_or_path}")


def resolve_deepspeed(ds: dict[str, Any], cfg: TrainingConfig) -> dict[str, Any]:
    """Replace the `"auto"` values of a DeepSpeed config with those of the training config.

    A value that is NOT "auto" must agree with the training config: a disagreement raises
    ConfigError naming both fields, rather than training with one of them silently.
    """
    out = copy.deepcopy(ds)
    optim = cfg.optim
    wanted: dict[str, tuple[Any, str]] = {
        "train_micro_batch_size_per_gpu": (
            optim.per_device_batch_size,
            "optim.per_device_batch_size",
        ),
        "gradient_accumulation_steps": (optim.grad_accum, "optim.grad_accum"),
        "gradient_clipping": (optim.max_grad_norm or 0.0, "optim.max_grad_norm"),
    }
    for key, (value, field) in wanted.items():
        if out.get(key, "auto") == "auto":
            out[key] = value
        elif out[key] != value:
            raise ConfigError(f"train.deepspeed: {key} = {out[key]} but {field} = {value}")
    if out.get("train_batch_size") == "auto":
        del out["train_batch_size"]  # DeepSpeed derives it: micro x accumulation x world size
    for precision, enabled in (("bf16", optim.bf16), ("fp16", False)):
        section = out.get(precision)
        if isinstance(section, dict) and section.get("enabled") == "auto":
            section["enabled"] = enabled
        elif isinstance(section, dict) and bool(section.get("enabled")) != enabled:
            raise ConfigError(
                f"train.deepspeed: {precision}.enabled = {section.get('enabled')} but "
                f"optim.bf16 = {optim.bf16}"
            )
    if optim.bf16 and not isinstance(out.get("bf16"), dict):
        out["bf16"] = {"enabled": True}
    zero = out.setdefault("zero_optimization", {})
    for key in ("reduce_bucket_size", "allgather_bucket_size"):
        if zero.get(key) == "auto":
            zero[key] = _BUCKET
    leftover = [k for k, v in _walk(out) if v == "auto"]
    if leftover:
        raise ConfigError(f"train.deepspeed: no value known for 'auto' at {leftover}")
    if "optimizer" in out or "scheduler" in out:
        raise ConfigError(
            "train.deepspeed: leave out 'optimizer' and 'scheduler'; craft-train builds AdamW "
            "(one learning rate per parameter group) and the schedule from the `optim` section"
        )
    return out


def _walk(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        return [kv for k, v in node.items() for kv in _walk(v, f"{prefix}{k}.")]
    return [(prefix.rstrip("."), node)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _single_process_env() -> None:
    """A plain `python -m craft_train.cli` run is rank 0 of 1 (DeepSpeed wants the env)."""
    if "RANK" in os.environ or "LOCAL_RANK" in os.environ:
        return
    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
    )


def _skip_cpu_shm_build() -> None:
    """Without CUDA, stop DeepSpeed from JIT-compiling its shared-memory all-reduce op.

    The op speeds up CPU *inference* collectives; building it takes minutes on a small
    machine, every first run in a fresh environment. Gloo does the same reductions.
    """
    if torch.cuda.is_available():
        return
    import importlib

    # Not `import deepspeed.comm.torch as m`: that resolves to the torch package itself.
    module = importlib.import_module("deepspeed.comm.torch")
    module.build_shm_op = lambda: None  # type: ignore[attr-defined]


def make_accelerator(cfg: TrainingConfig) -> Any:
    """An `accelerate.Accelerator`: DeepSpeed ZeRO-2 when `train.deepspeed` is set.

    Works under `deepspeed`, `torchrun`, `accelerate launch`, or as one plain process.
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    # A second run in the same process (stage 2 after stage 1, a resumed run in a test) gets
    # a fresh accelerator state; the process group (PartialState) is kept.
    AcceleratorState._reset_state()
    GradientState._reset_state()
    mixed = "bf16" if cfg.optim.bf16 else "no"
    if cfg.train.deepspeed is None:
        return Accelerator(mixed_precision=mixed, gradient_accumulation_steps=cfg.optim.grad_accum)
    from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs

    _single_process_env()
    handlers = []
    if not torch.cuda.is_available():
        # accelerate picks no backend for DeepSpeed on a CPU (and then counts one process);
        # naming gloo makes it initialise DeepSpeed's process group and count every rank.
        _skip_cpu_shm_build()
        handlers.append(InitProcessGroupKwargs(backend="gloo"))
    ds = resolve_deepspeed(load_deepspeed_config(cfg.train.deepspeed), cfg)
    plugin = DeepSpeedPlugin(hf_ds_config=ds)
    return Accelerator(
        mixed_precision=mixed,
        deepspeed_plugin=plugin,
        gradient_accumulation_steps=cfg.optim.grad_accum,
        kwargs_handlers=handlers,
    )
