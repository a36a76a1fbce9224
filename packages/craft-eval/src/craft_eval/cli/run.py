"""`craft-eval run`: one method on benchmarks (resumable JSONL), and the evaluation loop
`sweep` shares (checked configs, one `HFBackend` per run, the score lines)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from craft_core import TokenBudget
from craft_eval.cli import common
from craft_eval.cli.common import (
    UsageError,
    add_data_args,
    add_model_args,
    check_method,
    check_model_args,
    data_roots,
    kv,
    parse_budget,
)
from craft_eval.runner import RunConfig, run_benchmark


def add_parser(sub: Any) -> None:
    run = sub.add_parser("run", help="evaluate one method on benchmarks (resumable JSONL)")
    add_model_args(run)
    add_data_args(run)
    run.add_argument("--method", default="none", help="registry name; none = uncompressed")
    budget = run.add_mutually_exclusive_group()
    budget.add_argument("--ratio", type=float, help="fixed-ratio budget (>= 1)")
    budget.add_argument("--threshold", type=float, help="similarity-threshold budget, (-1, 1]")
    run.add_argument("--min-tokens", type=int, help="floor of the threshold mode")
    run.add_argument("--checkpoint", help="checkpoint folder of a method that needs one")
    run.add_argument("--method-arg", action="append", default=[], metavar="KEY=VALUE")


def command(args: argparse.Namespace) -> int:
    tag = check_model_args(args)
    method_kwargs = kv(args.method_arg)
    if args.checkpoint:
        method_kwargs["checkpoint"] = args.checkpoint
    loaded: dict[tuple[Any, ...], list[Any]] = {}
    budget = parse_budget(args.method, args.ratio, args.threshold, args.min_tokens)
    configs = build_configs(args, tag, args.method, budget, method_kwargs, loaded)
    check_method(args.method, method_kwargs, args.allow_untrained)
    model, processor, tag = common.load_model(args)
    summaries = evaluate(
        args, model, processor, [replace(c, model=tag) for c in configs], loaded=loaded
    )
    return failed_runs(summaries)


def build_configs(
    args: argparse.Namespace,
    tag: str,
    method: str,
    budget: TokenBudget | None,
    method_kwargs: dict[str, Any],
    loaded: dict[tuple[Any, ...], list[Any]] | None = None,
) -> list[RunConfig]:
    """One checked RunConfig per benchmark (arguments, annotations, videos, protocol), with
    `budget` (`parse_budget`'s).

    The items each config reads are loaded (checked) once and kept in `loaded` under
    `items_key(config)`, so that the run does not read the annotations again."""
    from craft_eval.runner import load_items
    from craft_eval.tasks import get_benchmark

    configs = []
    names = []
    for bench in args.benchmark:
        try:
            names.append(get_benchmark(bench).name)
        except KeyError as error:
            raise UsageError(f"--benchmark {bench}: {error.args[0]}") from None
    roots = data_roots(args.data_root, names)
    for bench in names:
        config = RunConfig(
            benchmark=bench,
            data_root=roots[bench],
            model=tag,
            method=method,
            budget=budget,
            checkpoint=method_kwargs.get("checkpoint"),
            method_kwargs={k: v for k, v in method_kwargs.items() if k != "checkpoint"},
            **_data_fields(args),
        )
        try:
            config.validate()
            get_benchmark(bench).describe_protocol(config.protocol, config.fallback)
            key = items_key(config)
            items = loaded[key] if loaded and key in loaded else load_items(config)
        except (ValueError, FileNotFoundError) as error:
            raise UsageError(str(error)) from None
        if loaded is not None:
            loaded[key] = items
        configs.append(config)
    if args.merge_maps < 0:
        raise UsageError(f"--merge-maps must be >= 0, got {args.merge_maps}")
    return configs


def _data_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The `RunConfig` fields of the data options (`common.add_data_args`)."""
    return {
        "protocol": args.protocol,
        "fallback": args.fallback,
        "fps": args.fps,
        "max_frames": args.frames,
        "subset": args.subset,
        "limit": args.limit,
    }


def items_key(config: RunConfig) -> tuple[Any, ...]:
    """What decides a config's items: benchmark, data root, subset and limit."""
    return (config.benchmark, str(config.data_root), config.subset, config.limit)


def evaluate(
    args: argparse.Namespace,
    model: Any,
    processor: Any,
    configs: list[RunConfig],
    progress: bool = True,
    loaded: dict[tuple[Any, ...], list[Any]] | None = None,
) -> list[dict[str, Any]]:
    from craft_eval.backend import HFBackend

    summaries = []
    for config in configs:
        run_dir = Path(args.output) / config.model / config.run_name()
        kwargs = dict(config.method_kwargs)
        if config.checkpoint is not None:
            kwargs["checkpoint"] = config.checkpoint

        def backend(
            config: RunConfig = config, run_dir: Path = run_dir, kwargs: dict[str, Any] = kwargs
        ) -> HFBackend:
            return HFBackend(
                model,
                processor,
                method=config.method,
                budget=config.token_budget(),
                method_kwargs=kwargs,
                fps=config.fps,
                max_frames=config.max_frames,
                merge_map_dir=run_dir,
                merge_maps=args.merge_maps,
            )

        summary = run_benchmark(
            config,
            backend,
            run_dir,
            progress=progress and not args.no_progress,
            items=(loaded or {}).get(items_key(config)),
        )
        if summary is not None:
            summaries.append({**summary, "_run": config.run_name()})
            print(f"{config.run_name()}: {score_line(summary)} -> {run_dir}")
    return summaries


def failed_runs(summaries: list[dict[str, Any]]) -> int:
    """Exit code of run/sweep: 1 when a run's every item failed (named on stderr), else 0.
    Some items failing is a result (their count is in the score line), not a failure."""
    failed = [
        s
        for s in summaries
        if s["scores"]["n_items"] and s["scores"]["n_errors"] == s["scores"]["n_items"]
    ]
    for s in failed:
        first = (s["scores"].get("errors") or [{}])[0].get("error")
        print(f"craft-eval: every item of {s['_run']} failed (first: {first})", file=sys.stderr)
    if failed:
        print(f"craft-eval: {len(failed)} of {len(summaries)} runs failed", file=sys.stderr)
    return 1 if failed else 0


def score_line(summary: dict[str, Any]) -> str:
    s = summary["scores"]
    comp = "-" if s.get("comp_ratio") is None else f"{s['comp_ratio']:.2f}x"
    acc = "n/a (answers not public)" if s.get("accuracy") is None else f"{s['accuracy']:.1f}"
    line = f"accuracy {acc} ({s['n_scored']} scored, {s['n_errors']} errors), Comp. {comp}"
    if summary.get("submission"):
        line += f"; submission file {summary['submission']}"
    return line
