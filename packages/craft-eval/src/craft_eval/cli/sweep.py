"""`craft-eval sweep`: several methods x ratios (+ the uncompressed run), then the report."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from craft_eval.cli import common
from craft_eval.cli.common import (
    UsageError,
    add_data_args,
    add_model_args,
    check_method,
    check_model_args,
    parse_budget,
)
from craft_eval.cli.report import warn_skipped
from craft_eval.cli.run import build_configs, evaluate, failed_runs

DEFAULT_RATIOS = (2.0, 4.0, 8.0, 16.0, 32.0)


def add_parser(sub: Any) -> None:
    sweep = sub.add_parser("sweep", help="several methods x ratios (+ the uncompressed run)")
    add_model_args(sweep)
    add_data_args(sweep)
    sweep.add_argument("--methods", nargs="+", default=["craft"])
    sweep.add_argument("--ratios", nargs="+", type=float, default=list(DEFAULT_RATIOS))
    sweep.add_argument("--checkpoint", help="for the methods that need one")


def command(args: argparse.Namespace) -> int:
    tag = check_model_args(args)
    loaded: dict[tuple[Any, ...], list[Any]] = {}
    plan = build_configs(args, tag, "none", None, {}, loaded)
    for method in args.methods:
        kwargs = (
            {"checkpoint": args.checkpoint} if args.checkpoint and takes_checkpoint(method) else {}
        )
        check_method(method, kwargs, args.allow_untrained)
        for ratio in args.ratios:
            plan += build_configs(args, tag, method, parse_budget(method, ratio), kwargs, loaded)
    model, processor, tag = common.load_model(args)
    summaries = evaluate(
        args, model, processor, [replace(c, model=tag) for c in plan], loaded=loaded
    )
    failed = failed_runs(summaries)
    if int(os.environ.get("RANK", "0")) == 0:
        from craft_eval.report import write_report

        out = write_report(Path(args.output) / tag)
        print(out["table"])
        print(f"report: {out['markdown']}\nplot: {out['plot']}")
        return max(failed, warn_skipped(out["skipped"]))
    return failed


def takes_checkpoint(method: str) -> bool:
    """Whether `method` is one of those that load a trained checkpoint (`MethodInfo.needs`)."""
    from craft_eval.methods import get_method_info

    try:
        return "checkpoint" in get_method_info(method).needs
    except KeyError as error:
        raise UsageError(f"--methods {method}: {error.args[0]}") from None
