"""`craft-eval demo`: the whole pipeline on a laptop CPU, nothing downloaded."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from craft_eval.cli.common import UsageError, check_device, check_output, parse_budget


def add_parser(sub: Any) -> None:
    from craft_eval.demo import DEMO_FAMILIES, DEMO_METHODS, HEADLINE_ITEMS
    from craft_eval.demo_pool import default_workers

    demo = sub.add_parser("demo", help="the whole pipeline on a laptop CPU, nothing downloaded")
    demo.add_argument("--model", help="another checkpoint instead of the world's backbone")
    demo.add_argument("--backbone", help="a tiny RANDOM model of this type (pipeline check)")
    demo.add_argument("--ratio", type=float, help="one ratio only (default: 8 and 16)")
    demo.add_argument(
        "--items", type=int, default=40, help="held-out clips per family (default: 40)"
    )
    demo.add_argument(
        "--headline-items",
        type=int,
        default=HEADLINE_ITEMS,
        help="corners clips of the headline comparison (craft-trained vs DivPrune and the mean "
        f"rule, paired; with the corners family; 0: none; default: {HEADLINE_ITEMS})",
    )
    demo.add_argument(
        "--methods",
        nargs="+",
        help=f"registered methods, or `all` (default: {' '.join(DEMO_METHODS)}; "
        "craft-trained runs whenever the world ships it)",
    )
    demo.add_argument(
        "--family", default="both", help=f"{', '.join(DEMO_FAMILIES)} or both (default: both)"
    )
    demo.add_argument(
        "--workers",
        type=int,
        default=default_workers(),
        help="processes the configurations are shared out between (default: the cores, at "
        f"most 4: {default_workers()} here; 1: all in one process)",
    )
    demo.add_argument("--output", "-o", default="craft-demo")
    demo.add_argument("--device")


def command(args: argparse.Namespace) -> int:
    from craft_eval.demo import run_demo

    methods, families = check_demo_args(args)
    return run_demo(
        model_path=args.model,
        backbone=args.backbone,
        ratio=args.ratio,
        methods=methods,
        families=families,
        output=args.output,
        device=args.device,
        num_items=args.items,
        headline_items=args.headline_items,
        workers=args.workers,
    )


def check_demo_args(args: argparse.Namespace) -> tuple[list[str] | None, tuple[str, ...]]:
    """Every demo option checked before the clips are written or a model loads; returns
    `(methods or None for the default list, families)`."""
    check_device(args.device)
    check_output(args.output, "--output")
    if args.items < 1:
        raise UsageError(f"--items must be at least 1, got {args.items}")
    if args.headline_items < 0:
        raise UsageError(f"--headline-items must be at least 0, got {args.headline_items}")
    if args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
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
    return demo_methods(args.methods), demo_families(args.family)


def demo_families(family: str) -> tuple[str, ...]:
    """`--family` as the families to run."""
    from craft_eval.demo import DEMO_FAMILIES

    if family == "both":
        return DEMO_FAMILIES
    if family not in DEMO_FAMILIES:
        raise UsageError(f"--family {family}: not one of {', '.join(DEMO_FAMILIES)}, both")
    return (family,)


def demo_methods(methods: list[str] | None) -> list[str] | None:
    """`--methods` checked: registered names, or `all` alone (every registered method);
    None: the demo's default list."""
    from craft_eval.methods import get_method_info, list_methods

    if methods is None:
        return None
    if "all" in methods:
        if len(methods) > 1:
            raise UsageError("--methods all: give it alone (it means every registered method)")
        return [m.name for m in list_methods()]
    for method in methods:
        try:
            get_method_info(method)
        except KeyError as error:
            raise UsageError(f"--methods {method}: {error.args[0]}") from None
    return methods
