"""What the `craft-eval` commands share: the usage error, the one budget parser, the model
and data options and their checks (each before any model loads), the model loader."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from craft_core import TokenBudget
from craft_eval.runner import _BUDGET_OPTIONS


class UsageError(Exception):
    """A bad argument, file or option: one line on stderr, exit code 2."""


def add_model_args(p: argparse.ArgumentParser) -> None:
    from craft_adapters.registry import supported_model_types

    p.add_argument("--model", help="checkpoint folder of a supported transformers VLM")
    p.add_argument(
        "--tiny",
        metavar="MODEL_TYPE",
        help="instead of --model: a tiny RANDOM model of this backbone "
        f"({', '.join(supported_model_types())}); for plumbing checks only",
    )
    p.add_argument("--device", help="cuda, cuda:1, cpu (default: cuda:LOCAL_RANK if available)")
    p.add_argument(
        "--allow-untrained",
        action="store_true",
        help="run a method that needs --checkpoint untrained (G = 0.5): plumbing checks only",
    )


def add_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--benchmark",
        "-b",
        nargs="+",
        required=True,
        help="videomme longvideobench mvbench egoschema mlvu tempcompass",
    )
    p.add_argument(
        "--data-root",
        nargs="+",
        required=True,
        help="DIR (benchmark B read from DIR/B) or B=DIR pairs",
    )
    p.add_argument("--protocol", default="lmms-eval", help="lmms-eval (default) or original")
    p.add_argument(
        "--fallback", choices=["random", "empty"], help="unparseable replies (LVB, EgoSchema)"
    )
    p.add_argument("--subset", help="MVBench tasks (comma-separated) / EgoSchema subset|full")
    p.add_argument("--limit", type=int, help="first N items only")
    p.add_argument("--fps", type=float, default=2.0)
    p.add_argument("--frames", type=int, default=64, help="frame cap (default 64)")
    p.add_argument("--output", "-o", default="runs", help="results folder (default runs/)")
    p.add_argument("--merge-maps", type=int, default=1, help="save merge-map data for N items")
    p.add_argument("--no-progress", action="store_true")


def data_roots(values: list[str], benchmarks: list[str]) -> dict[str, str]:
    pairs = dict(v.split("=", 1) for v in values if "=" in v)
    plain = [v for v in values if "=" not in v]
    unknown = sorted(set(pairs) - set(benchmarks))
    if unknown:
        raise UsageError(f"--data-root {unknown[0]}=...: {unknown[0]} is not among --benchmark")
    if len(plain) > 1:
        raise UsageError("--data-root: give one DIR, or B=DIR pairs")
    out = {}
    for b in benchmarks:
        if b in pairs:
            out[b] = pairs[b]
        elif plain:
            base = Path(plain[0])
            out[b] = str(base / b) if (base / b).is_dir() else str(base)
        else:
            raise UsageError(f"--data-root: none given for {b}")
        if not Path(out[b]).is_dir():
            raise UsageError(f"--data-root {out[b]} ({b}): no such folder")
    return out


def check_device(arg: str | None, option: str = "--device") -> None:
    """A device this machine has, else UsageError naming `option` and what is allowed."""
    if arg is None:
        return
    import torch

    try:
        device = torch.device(arg)
    except (RuntimeError, ValueError):
        raise UsageError(f"{option} {arg}: not a device; allowed: cpu, cuda, cuda:N") from None
    if device.type == "cpu":
        return
    if device.type != "cuda":
        raise UsageError(f"{option} {arg}: unsupported device type; allowed: cpu, cuda, cuda:N")
    if not torch.cuda.is_available():
        raise UsageError(f"{option} {arg}: CUDA is not available on this machine; allowed: cpu")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise UsageError(f"{option} {arg}: this machine has {count} CUDA device(s)")


def check_output(path: str | None, option: str, *, is_file: bool = False) -> None:
    """UsageError when `option`'s folder (or a file's parent folder) cannot be made there:
    a file stands where a folder is meant, or a folder's parent is a file."""
    if path is None:
        return
    target = Path(path)
    folder = target.parent if is_file else target
    if is_file and target.is_dir():
        raise UsageError(f"{option} {path}: is a folder; give a file path")
    for step in (folder, *folder.parents):
        if step.exists():
            if not step.is_dir():
                raise UsageError(f"{option} {path}: {step} is a file, not a folder")
            return


def pick_device(arg: str | None) -> str:
    import torch

    if arg:
        return arg
    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return "cpu"


def check_model_args(args: argparse.Namespace) -> str:
    """The run's model tag; raises UsageError before anything heavy is loaded."""
    check_device(args.device)
    check_output(args.output, "--output")
    if args.model and args.tiny:
        raise UsageError("give --model or --tiny, not both")
    if args.model:
        path = Path(args.model)
        if not (path / "config.json").is_file():
            raise UsageError(f"--model {args.model}: not a checkpoint folder (no config.json)")
        return path.resolve().name
    if args.tiny:
        from craft_adapters import supported_model_types

        if args.tiny not in supported_model_types():
            known = ", ".join(supported_model_types())
            raise UsageError(f"--tiny {args.tiny}: unknown backbone; known: {known}")
        return f"tiny-{args.tiny}"
    raise UsageError("give --model PATH (or --tiny MODEL_TYPE for a random plumbing check)")


def load_model(args: argparse.Namespace) -> tuple[Any, Any, str]:
    device = pick_device(args.device)
    if args.model:
        from craft_eval.backend import load_pretrained

        try:
            model, processor = load_pretrained(args.model, device)
        except (OSError, ValueError, KeyError) as error:
            raise UsageError(f"--model {args.model}: cannot be loaded ({error})") from None
        return model, processor, Path(args.model).resolve().name
    if args.tiny:
        import tempfile

        from craft_adapters.tiny import build_tiny_vlm

        model, processor = build_tiny_vlm(args.tiny, tempfile.mkdtemp(prefix="craft-tiny-"))
        return model.to(device).eval(), processor, f"tiny-{args.tiny}"
    raise UsageError("give --model PATH (or --tiny MODEL_TYPE for a random plumbing check)")


def kv(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise UsageError(f"--method-arg {pair!r}: expected KEY=VALUE")
        key = key.strip()
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def parse_budget(
    method: str,
    ratio: float | None,
    threshold: float | None = None,
    min_tokens: int | None = None,
    *,
    names: tuple[str, str, str] = _BUDGET_OPTIONS,
) -> TokenBudget | None:
    """The one budget parser of every command: `--ratio` / `--threshold` / `--min-tokens`
    of `--method` into a `TokenBudget`, checked once by craft-core's rules (errors name the
    option; craft-core states the one-of rule). None for `--method none`, which takes none
    of them."""
    if method == "none":
        given = [n for n, v in zip(names, (ratio, threshold, min_tokens)) if v is not None]
        if given:
            raise UsageError(
                f"{', '.join(given)} given with --method none (the uncompressed model)"
            )
        return None
    try:
        return TokenBudget.parse(ratio, threshold, min_tokens, names=names)
    except ValueError as error:
        raise UsageError(str(error)) from None


def check_method(method: str, kwargs: dict[str, Any], allow_untrained: bool) -> None:
    """Method name, its option keys and its checkpoint, checked before any model loads
    (`craft_eval.methods.build`, the one check every path uses; a checkpoint is loaded)."""
    from craft_eval.methods.build import CLI, build_compressor, check_method

    try:
        info = check_method(method, kwargs, allow_untrained=allow_untrained, spelling=CLI)
        if info is not None and kwargs.get("checkpoint") is not None:
            build_compressor(method, kwargs, spelling=CLI)  # loads (and checks) it; cheap
    except ValueError as error:
        raise UsageError(str(error)) from None
    if info is not None and "checkpoint" in info.needs and kwargs.get("checkpoint") is None:
        print(f"craft-eval: warning: {method} runs UNTRAINED (no --checkpoint)", file=sys.stderr)
