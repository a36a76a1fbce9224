"""`craft-eval audit`: training data against the benchmarks' videos (exit 1: overlap)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from craft_eval.cli.common import UsageError, data_roots


def add_parser(sub: Any) -> None:
    audit = sub.add_parser("audit", help="training data against the benchmarks (exit 1: overlap)")
    audit.add_argument("train", nargs="+", help="training data files, or one mixture YAML")
    audit.add_argument("--benchmark", "-b", nargs="+", required=True, help="benchmarks to audit")
    audit.add_argument("--data-root", nargs="+", required=True, help="DIR or B=DIR pairs")
    audit.add_argument("--subset", help="MVBench tasks / EgoSchema subset, as for run")
    audit.add_argument("--write-clean", metavar="DIR", help="write the files minus overlaps")
    audit.add_argument("--no-hash", action="store_true", help="match video names only")
    audit.add_argument("--no-progress", action="store_true")


def command(args: argparse.Namespace) -> int:
    """`craft-eval audit`: the table, exit 1 on overlap (`craft_eval.audit`)."""
    from craft_eval.audit import AuditError, audit, table, training_files, write_clean
    from craft_eval.tasks import get_benchmark

    try:
        benchmarks = [get_benchmark(b).name for b in args.benchmark]
    except KeyError as error:
        raise UsageError(f"--benchmark: {error.args[0]}") from None
    try:
        files, mixture = training_files(args.train)
        found, rows, unread = audit(files, data_roots(args.data_root, benchmarks),
                                    subset=args.subset, hash_content=not args.no_hash,
                                    progress=not args.no_progress)  # fmt: skip
        print(table(found, rows, benchmarks))
        for o in found:
            print(f"overlap: {o.where}: {o.video} is in {o.benchmark} (same {o.by})")
        for problem in unread:
            print(f"not checked (not JSON; no trainer reads it): {problem}")
        if args.write_clean:
            overlapping = {o.where for o in found}
            drop = overlapping | {p.where for p in unread}
            path = write_clean(files, drop, Path(args.write_clean), mixture)
            print(f"clean files without the {len(overlapping)} overlapping rows"
                  f"{f' and the {len(drop) - len(overlapping)} not read' if unread else ''}: "
                  f"{path}")  # fmt: skip
    except AuditError as error:
        raise UsageError(str(error)) from None
    return 1 if found else 0
