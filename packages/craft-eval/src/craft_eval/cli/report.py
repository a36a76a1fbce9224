"""`craft-eval report`: the Markdown table, accuracy vs compression, merge maps."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from craft_eval.cli.common import UsageError, check_output


def add_parser(sub: Any) -> None:
    report = sub.add_parser("report", help="Markdown table + accuracy-vs-compression + merge maps")
    report.add_argument("runs", help="results folder (searched for summary.json)")
    report.add_argument("--out", help="output folder (default RUNS/report)")


def command(args: argparse.Namespace) -> int:
    from craft_eval.report import write_report

    if not Path(args.runs).is_dir():
        raise UsageError(f"runs {args.runs}: no such folder")
    check_output(args.out, "--out")
    if not any(Path(args.runs).rglob("summary.json")):
        raise UsageError(f"runs {args.runs}: no summary.json under it (no finished run)")

    try:
        out = write_report(args.runs, args.out)
    except FileNotFoundError as error:  # every summary.json unreadable
        raise UsageError(f"runs {args.runs}: {error}") from None
    print(out["table"])
    print(f"\nreport: {out['markdown']}\nplot:   {out['plot']}")
    for path in out["merge_maps"]:
        print(f"merge map: {path}")
    return warn_skipped(out["skipped"])


def warn_skipped(skipped: list[str]) -> int:
    """A report that left out unreadable summaries exits 1, naming each one."""
    for line in skipped:
        print(f"craft-eval: warning: skipped {line}", file=sys.stderr)
    if skipped:
        print(
            f"craft-eval: {len(skipped)} summary file(s) skipped; the report shows the others",
            file=sys.stderr,
        )
    return 1 if skipped else 0
