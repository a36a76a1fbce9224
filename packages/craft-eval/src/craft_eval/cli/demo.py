"""`craft-eval demo`: the whole pipeline on a laptop CPU, nothing downloaded."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from craft_eval.cli.common import UsageError, check_device, check_output, parse_budget


def add_parser(sub: Any) -> None:
    demo = sub.add_parser("demo", help="the whole pipeline on a laptop CPU, nothing downloaded")
    demo.add_argument("--model", help="another checkpoint instead of the world's backbone")
    demo.add_argument("--backbone", help="a tiny RANDOM model of this type (pipeline check)")
    demo.add_argument("--ratio", type=float, help="one ratio only (default: 4, 8 and 16)")
    demo.add_argument("--items", type=int, default=40, help="held-out clips (2 questions each)")
    demo.add_argument("--methods", nargs="+", help="default: every registered method")
    demo.add_argument("--output", "-o", default="craft-demo")
    demo.add_argument("--device")


def command(args: argparse.Namespace) -> int:
    from craft_eval.demo import run_demo

    check_demo_args(args)
    return run_demo(
        model_path=args.model,
        backbone=args.backbone,
        ratio=args.ratio,
        methods=args.methods,
        output=args.output,
        device=args.device,
        num_items=args.items,
    )


def check_demo_args(args: argparse.Namespace) -> None:
    """Every demo option checked before the clips are written or a model loads."""
    from craft_eval.methods import get_method_info

    check_device(args.device)
    check_output(args.output, "--output")
    if args.items < 1:
        raise UsageError(f"--items must be at least 1, got {args.items}")
    if args.model and args.backbone:
        raise UsageError("give --model or --backbone, not both")
    if args.model and not (Path(args.model) / "config.json").is_file():
        raise UsageError(f"--model {args.model}: not a checkpoint folder (no config.json)")
    if args.backbone:
        from craft_adapters import supported_model_types

        if args.backbone not in supported_model_types():
            known = ", ".join(supported_model_types())
            raise UsageError(f"--backbone {args.backbone}: unknown backbone; known: {known}")
    if args.ratio is not None:
        parse_budget("demo", args.ratio)
    for method in args.methods or []:
        try:
            get_method_info(method)
        except KeyError as error:
            raise UsageError(f"--methods {method}: {error.args[0]}") from None
