"""`craft-eval`: run benchmarks, sweep ratios, report, list methods, measure efficiency, demo.

    craft-eval run --model PATH --benchmark mvbench --data-root /data --method craft \\
        --checkpoint ckpt/ --ratio 8 --output runs/
    craft-eval sweep --model PATH --benchmark mvbench --data-root /data --methods craft divprune
    craft-eval report runs/
    craft-eval methods
    craft-eval efficiency --arch qwen3.5-4b --frames 64 --ratios 4 8 16 --methods craft
    craft-eval demo

Data parallel: `torchrun --nproc-per-node 8 -m craft_eval.cli run ...` (each rank takes
every 8th item; rank 0 merges).

One module per command (`add_parser(sub)`, `command(args) -> int`); what they share, the
budget parser (`common.parse_budget`, every `--ratio` / `--threshold` / `--min-tokens` into
one `craft_core.TokenBudget`) and the checks, is in `common`.

Every argument, annotation file, checkpoint and method option is checked before a model is
loaded. A usage error prints one line naming the option and exits with 2; any other failure
prints one line and exits with 1 (`--debug` shows the traceback instead).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

from craft_eval.cli import audit, demo, efficiency, methods, report, run, sweep
from craft_eval.cli.common import UsageError, parse_budget

__all__ = ["COMMANDS", "UsageError", "build_parser", "main", "parse_budget"]

COMMANDS = {
    "run": run,
    "sweep": sweep,
    "report": report,
    "methods": methods,
    "efficiency": efficiency,
    "audit": audit,
    "demo": demo,
}
"""Each subcommand's module, in the order `--help` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="craft-eval", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--debug", action="store_true", help="show the Python traceback of any error"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings():  # restores Python's own format when main returns
            warnings.showwarning = _show_warning
            return int(COMMANDS[args.command].command(args) or 0)
    except KeyboardInterrupt:
        print("craft-eval: interrupted; the same command resumes a run", file=sys.stderr)
        return 130
    except Exception as error:
        if args.debug:
            raise
        if isinstance(error, (UsageError, SystemExit)):
            print(f"craft-eval: error: {error}", file=sys.stderr)
            return 2
        print(
            f"craft-eval: {type(error).__name__}: {error} (--debug shows the traceback)",
            file=sys.stderr,
        )
        return 1


def _show_warning(message: Warning | str, category: type[Warning], *args: Any, **kw: Any) -> None:
    """A Python warning as the CLI's own line: `craft-eval: warning: ...` (no file:line, no
    source line: the user did not write that code)."""
    kind = "" if category is UserWarning else f"{category.__name__}: "
    print(f"craft-eval: warning: {kind}{message}", file=sys.stderr)
