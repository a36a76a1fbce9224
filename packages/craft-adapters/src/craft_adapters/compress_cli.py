"""`craft-compress`: a folder, glob or list of videos compressed once into payloads.

    craft-compress --videos videos/ --model Qwen/Qwen2.5-VL-7B-Instruct \\
        --craft runs/craft --threshold 0.9 --output library/
    torchrun --nproc_per_node 8 -m craft_adapters.compress_cli ...   # data-parallel

The loop, the index and resuming live in `compress_library.py`; this module reads the
options (the budget ONCE, into a `TokenBudget`), the torchrun environment (RANK, WORLD_SIZE,
LOCAL_RANK), loads the backbone and the CRAFT module, and turns every bad argument into one
line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any

from craft_adapters.compress_library import (
    INDEX,
    DiskFull,
    Settings,
    compress_share,
    list_videos,
    settings_check,
)

PROG = "craft-compress"
BUDGET_OPTIONS = ("--ratio", "--threshold", "--min-tokens")


class UsageError(Exception):
    """A bad argument: one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's usage block -> one line
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Compress a video library once with CRAFT.")
    p.add_argument("--videos", required=True, help="a folder, a glob, a .jsonl/.csv list, a file")
    p.add_argument("--model", required=True, help="backbone: a folder or a Hub id (cached)")
    p.add_argument("--craft", required=True, help="CRAFT checkpoint: a folder or a Hub id")
    p.add_argument("--output", required=True, help="folder of payloads and index.jsonl")
    p.add_argument("--ratio", help="fixed-ratio budget (>= 1)")
    p.add_argument("--threshold", help="adaptive budget, in (-1, 1] (the paper's mode)")
    p.add_argument("--min-tokens", help="threshold mode's floor (default max(1, N // 128))")
    p.add_argument("--fps", type=float, default=2.0, help="sampling rate (default 2)")
    p.add_argument("--frames", type=int, default=64, help="frame cap (default 64)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda:LOCAL_RANK if available)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def distributed_env(env: os._Environ[str] | dict[str, str]) -> tuple[int, int, int]:
    """(rank, world, local_rank) as torchrun / accelerate set them; (0, 1, 0) unset."""
    values = []
    for name, default in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", 0)):
        text = env.get(name, "")
        try:
            values.append(int(text) if text.strip() else default)
        except ValueError:
            raise UsageError(f"environment {name}={text!r} is not an int") from None
    rank, world, local = values
    if world < 1 or not 0 <= rank < world or local < 0:
        raise UsageError(
            f"environment RANK={rank}, WORLD_SIZE={world}: need 0 <= RANK < WORLD_SIZE"
        )
    return rank, world, local


def _budget(args: argparse.Namespace) -> Any:
    from craft_core import TokenBudget

    if args.ratio is None and args.threshold is None:
        raise UsageError("give the budget: --ratio R or --threshold T")
    try:
        return TokenBudget.parse(args.ratio, args.threshold, args.min_tokens, names=BUDGET_OPTIONS)
    except ValueError as error:
        raise UsageError(str(error)) from None


def _device(arg: str | None, local_rank: int) -> Any:
    import torch

    if arg is None and not torch.cuda.is_available():
        return torch.device("cpu")
    if arg is None:
        if local_rank >= torch.cuda.device_count():
            raise UsageError(
                f"environment LOCAL_RANK={local_rank}, but this machine has "
                f"{torch.cuda.device_count()} CUDA device(s); pass --device"
            )
        return torch.device(f"cuda:{local_rank}")
    try:
        device = torch.device(arg)
    except RuntimeError:
        raise UsageError(f"--device {arg!r}: not a device (cpu, cuda, cuda:1)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {arg}: CUDA is not available here")
    return device


def _name(spec: str) -> str:
    """A local folder as its absolute path (the same on every rank), else the Hub id."""
    return str(Path(spec).resolve()) if Path(spec).exists() else spec


def _load(args: argparse.Namespace, budget: Any, device: Any) -> tuple[Any, Any, Settings]:
    """The wrapped backbone, its processor and the settings every payload records."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    from craft_adapters.compressed import checkpoint_sha256
    from craft_adapters.wrapper import wrap
    from craft_core import CraftCompressor

    dtype = args.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.type == "cuda" else "float32"
    transformers.utils.logging.disable_progress_bar()  # the CLI's stderr is its own lines
    try:  # the config first: a bad --model or --craft is named before the weights load
        config = AutoConfig.from_pretrained(_name(args.model))
        hidden = int(config.get_text_config().hidden_size)
    except Exception as error:  # OSError (not found, offline), ValueError (unknown config)
        raise UsageError(f"--model {args.model}: cannot be loaded ({_line(error)})") from None
    try:
        compressor = CraftCompressor.from_pretrained(
            _name(args.craft), hidden_size=hidden, device=device
        )
    except Exception as error:  # FileNotFoundError, the Hub's errors, another width
        raise UsageError(f"--craft {args.craft}: {_line(error)}") from None
    try:
        model = AutoModelForImageTextToText.from_pretrained(
            _name(args.model), dtype=getattr(torch, dtype)
        )
        processor = AutoProcessor.from_pretrained(_name(args.model))
    except Exception as error:
        raise UsageError(f"--model {args.model}: cannot be loaded ({_line(error)})") from None
    try:
        craft = wrap(model.to(device).eval(), compressor.eval(), budget=budget)
    except ValueError as error:
        raise UsageError(f"--model {args.model}: {_line(error)}") from None
    _preflight(craft, processor, args.model)
    settings = Settings(
        backbone=_name(args.model),
        model_type=str(model.config.model_type),
        hidden_size=hidden,
        craft_checkpoint=_name(args.craft),
        craft_sha256=checkpoint_sha256(compressor),
        budget=budget.describe(),
        dtype=dtype,
    )
    return craft, processor, settings


def _preflight(craft: Any, processor: Any, model: str) -> None:
    """A 2-frame synthetic video through `compress_videos`: a backbone that cannot make
    payloads is a usage error now, not one failed row per video."""
    import numpy as np

    from craft_adapters.inputs import build_inputs

    ramp = np.arange(112, dtype=np.uint8)
    frames = np.stack([np.stack([ramp[:, None] + ramp[None, :] + c for c in (0, 40, 80)], -1)] * 2)
    try:
        craft.compress_videos(**build_inputs(processor, frames, 2.0, ""))
    except ValueError as error:
        raise UsageError(f"--model {model}: cannot make payloads ({_line(error)})") from None


def _line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def run(args: argparse.Namespace) -> int:
    budget = _budget(args)
    rank, world, local_rank = distributed_env(os.environ)
    if not (math.isfinite(args.fps) and args.fps > 0):
        raise UsageError(f"--fps {args.fps}: must be a finite number > 0")
    if args.frames < 1:
        raise UsageError(f"--frames {args.frames}: must be >= 1")
    try:
        entries = list_videos(args.videos, args.fps, args.frames)
    except ValueError as error:
        raise UsageError(f"--videos {error}") from None
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--output {out}: exists and is not a folder")
    device = _device(args.device, local_rank)
    craft, processor, settings = _load(args, budget, device)
    try:
        out.mkdir(parents=True, exist_ok=True)
        settings_check(out, settings)
    except ValueError as error:
        raise UsageError(f"--output {error}") from None
    rows, merged = compress_share(
        craft,
        processor,
        entries,
        out,
        settings,
        rank=rank,
        world=world,
        progress=not args.no_progress,
    )
    return _summary(rows, merged, out, rank, world)


def _summary(rows: list[dict], merged: list[dict] | None, out: Path, rank: int, world: int) -> int:
    """One line; exit 1 from the process that merged an index listing a video not done."""
    who = "" if world == 1 else f"rank {rank}/{world}: "
    if merged is None:
        done = sum(r["status"] == "done" for r in rows)
        print(
            f"{PROG}: {who}{done} of {len(rows)} done; the last rank merges {INDEX}",
            file=sys.stderr,
        )
        return 0
    bad = [r for r in merged if r["status"] != "done"]
    print(
        f"{PROG}: {who}{len(merged) - len(bad)} of {len(merged)} videos done, {len(bad)} "
        f"not ({out / INDEX})",
        file=sys.stderr,
    )
    return 1 if bad else 0


def _terminate(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds: temporary files are removed on the way out


def main(argv: list[str] | None = None) -> int:
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return run(build_parser().parse_args(argv))
    except UsageError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    except DiskFull as error:
        print(
            f"{PROG}: {error.strerror}: stopped; every payload and index row written is "
            "whole; free space and run the same command again",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; the same command resumes", file=sys.stderr)
        return 130
    except Exception as error:
        if debug:
            raise
        print(
            f"{PROG}: {type(error).__name__}: {_line(error)} (--debug shows the traceback)",
            file=sys.stderr,
        )
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
