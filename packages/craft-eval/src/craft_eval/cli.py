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

Every argument, annotation file, checkpoint and method option is checked before a model is
loaded. A usage error prints one line naming the option and exits with 2; any other failure
prints one line and exits with 1 (`--debug` shows the traceback instead).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

from craft_eval.runner import _BUDGET_OPTIONS, RunConfig, run_benchmark

DEFAULT_RATIOS = (2.0, 4.0, 8.0, 16.0, 32.0)


class UsageError(Exception):
    """A bad argument, file or option: one line on stderr, exit code 2."""


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="checkpoint folder of a supported transformers VLM")
    p.add_argument(
        "--tiny",
        metavar="MODEL_TYPE",
        help="instead of --model: a tiny RANDOM model of this backbone (qwen2_5_vl, qwen3_5, "
        "qwen3_vl, llava_onevision); for plumbing checks only",
    )
    p.add_argument("--device", help="cuda, cuda:1, cpu (default: cuda:LOCAL_RANK if available)")
    p.add_argument(
        "--allow-untrained",
        action="store_true",
        help="let a method that needs --checkpoint (craft, scissor-merge) run without one, "
        "on a fresh untrained module (G = 0.5); for plumbing checks only",
    )


def _add_data_args(p: argparse.ArgumentParser) -> None:
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


def _add_audit_parser(sub: Any) -> None:
    """`craft-eval audit`: training files against the benchmarks' videos."""
    audit = sub.add_parser("audit", help="training data against the benchmarks (exit 1: overlap)")
    audit.add_argument("train", nargs="+", help="training data files, or one mixture YAML")
    audit.add_argument("--benchmark", "-b", nargs="+", required=True, help="benchmarks to audit")
    audit.add_argument("--data-root", nargs="+", required=True, help="DIR or B=DIR pairs")
    audit.add_argument("--subset", help="MVBench tasks / EgoSchema subset, as for run")
    audit.add_argument("--write-clean", metavar="DIR", help="write the files minus overlaps")
    audit.add_argument("--no-hash", action="store_true", help="match video names only")
    audit.add_argument("--no-progress", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="craft-eval", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--debug", action="store_true", help="show the Python traceback of any error"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="evaluate one method on benchmarks (resumable JSONL)")
    _add_model_args(run)
    _add_data_args(run)
    run.add_argument("--method", default="none", help="registry name; none = uncompressed")
    budget = run.add_mutually_exclusive_group()
    budget.add_argument("--ratio", type=float)
    budget.add_argument("--threshold", type=float)
    run.add_argument("--min-tokens", type=int)
    run.add_argument("--checkpoint", help="CRAFT / Scissor-Merge checkpoint folder")
    run.add_argument("--method-arg", action="append", default=[], metavar="KEY=VALUE")

    sweep = sub.add_parser("sweep", help="several methods x ratios (+ the uncompressed run)")
    _add_model_args(sweep)
    _add_data_args(sweep)
    sweep.add_argument("--methods", nargs="+", default=["craft"])
    sweep.add_argument("--ratios", nargs="+", type=float, default=list(DEFAULT_RATIOS))
    sweep.add_argument("--checkpoint")

    report = sub.add_parser("report", help="Markdown table + accuracy-vs-compression + merge maps")
    report.add_argument("runs", help="results folder (searched for summary.json)")
    report.add_argument("--out", help="output folder (default RUNS/report)")

    sub.add_parser("methods", help="list the registered compression methods")

    eff = sub.add_parser("efficiency", help="Table 2 on a real-size random-weight architecture")
    eff.add_argument("--arch", required=True, help="qwen3.5-4b, qwen2.5-vl-7b, llava-ov-7b")
    eff.add_argument("--frames", type=int, default=64)
    eff.add_argument("--ratios", nargs="+", type=float, default=[8.0])
    eff.add_argument("--methods", nargs="+", default=["craft"])
    eff.add_argument("--text-tokens", type=int, default=128)
    eff.add_argument("--warmup", type=int, default=1)
    eff.add_argument("--repeats", type=int, default=5)
    eff.add_argument("--device")
    eff.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        help="weights and activations (default: bfloat16 on a GPU, float32 on CPU)",
    )
    eff.add_argument(
        "--override", help='text-config overrides, e.g. "num_hidden_layers=4,hidden_size=64"'
    )
    eff.add_argument("--json", help="also write the result as JSON here")

    _add_audit_parser(sub)

    demo = sub.add_parser("demo", help="the whole pipeline on a laptop CPU, nothing downloaded")
    demo.add_argument("--model", help="another checkpoint instead of the world's backbone")
    demo.add_argument("--backbone", help="a tiny RANDOM model of this type (pipeline check)")
    demo.add_argument("--ratio", type=float, help="one ratio only (default: 4, 8 and 16)")
    demo.add_argument("--items", type=int, default=40, help="held-out clips (2 questions each)")
    demo.add_argument("--methods", nargs="+", help="default: every registered method")
    demo.add_argument("--output", "-o", default="craft-demo")
    demo.add_argument("--device")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings():  # restores Python's own format when main returns
            warnings.showwarning = _show_warning
            return _dispatch(args)
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


def _dispatch(args: argparse.Namespace) -> int:
    handler = {
        "run": _cmd_run,
        "sweep": _cmd_sweep,
        "report": _cmd_report,
        "methods": _cmd_methods,
        "efficiency": _cmd_efficiency,
        "demo": _cmd_demo,
        "audit": _cmd_audit,
    }[args.command]
    return int(handler(args) or 0)


# -- helpers -----------------------------------------------------------------------------------


def _roots(values: list[str], benchmarks: list[str]) -> dict[str, str]:
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


def _device(arg: str | None) -> str:
    import torch

    if arg:
        return arg
    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return "cpu"


def _check_model_args(args: argparse.Namespace) -> str:
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


def _load_model(args: argparse.Namespace) -> tuple[Any, Any, str]:
    device = _device(args.device)
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


def _kv(pairs: list[str]) -> dict[str, Any]:
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


def _check_method(method: str, kwargs: dict[str, Any], allow_untrained: bool) -> None:
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


def _configs(
    args: argparse.Namespace,
    tag: str,
    method: str,
    ratio: float | None,
    threshold: float | None,
    method_kwargs: dict[str, Any],
    min_tokens: int | None = None,
    loaded: dict[tuple[Any, ...], list[Any]] | None = None,
) -> list[RunConfig]:
    """One checked RunConfig per benchmark (arguments, annotations, videos, protocol).

    The items each config reads are loaded (checked) once and kept in `loaded` under
    `_items_key(config)`, so that the run does not read the annotations again."""
    from craft_eval.runner import load_items
    from craft_eval.tasks import get_benchmark

    configs = []
    names = []
    for bench in args.benchmark:
        try:
            names.append(get_benchmark(bench).name)
        except KeyError as error:
            raise UsageError(f"--benchmark {bench}: {error.args[0]}") from None
    roots = _roots(args.data_root, names)
    for bench in names:
        config = RunConfig(
            benchmark=bench,
            data_root=roots[bench],
            model=tag,
            method=method,
            ratio=ratio,
            threshold=threshold,
            checkpoint=method_kwargs.get("checkpoint"),
            protocol=args.protocol,
            fallback=args.fallback,
            fps=args.fps,
            max_frames=args.frames,
            subset=args.subset,
            limit=args.limit,
            method_kwargs={k: v for k, v in method_kwargs.items() if k != "checkpoint"},
            min_tokens=min_tokens,
        )
        try:
            config.validate()
            get_benchmark(bench).describe_protocol(config.protocol, config.fallback)
            key = _items_key(config)
            items = loaded[key] if loaded and key in loaded else load_items(config)
        except (ValueError, FileNotFoundError) as error:
            raise UsageError(str(error)) from None
        if loaded is not None:
            loaded[key] = items
        configs.append(config)
    if args.merge_maps < 0:
        raise UsageError(f"--merge-maps must be >= 0, got {args.merge_maps}")
    return configs


def _items_key(config: RunConfig) -> tuple[Any, ...]:
    """What decides a config's items: benchmark, data root, subset and limit."""
    return (config.benchmark, str(config.data_root), config.subset, config.limit)


def _evaluate(
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
                ratio=config.ratio,
                threshold=config.threshold,
                min_tokens=config.min_tokens,
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
            items=(loaded or {}).get(_items_key(config)),
        )
        if summary is not None:
            summaries.append({**summary, "_run": config.run_name()})
            print(f"{config.run_name()}: {_score_line(summary)} -> {run_dir}")
    return summaries


def _failed_runs(summaries: list[dict[str, Any]]) -> int:
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


def _score_line(summary: dict[str, Any]) -> str:
    s = summary["scores"]
    comp = "-" if s.get("comp_ratio") is None else f"{s['comp_ratio']:.2f}x"
    acc = "n/a (answers not public)" if s.get("accuracy") is None else f"{s['accuracy']:.1f}"
    line = f"accuracy {acc} ({s['n_scored']} scored, {s['n_errors']} errors), Comp. {comp}"
    if summary.get("submission"):
        line += f"; submission file {summary['submission']}"
    return line


# -- commands ----------------------------------------------------------------------------------


def _cmd_run(args: argparse.Namespace) -> int:
    tag = _check_model_args(args)
    method_kwargs = _kv(args.method_arg)
    if args.checkpoint:
        method_kwargs["checkpoint"] = args.checkpoint
    loaded: dict[tuple[Any, ...], list[Any]] = {}
    configs = _configs(
        args, tag, args.method, args.ratio, args.threshold, method_kwargs, args.min_tokens, loaded
    )
    _check_method(args.method, method_kwargs, args.allow_untrained)
    model, processor, tag = _load_model(args)
    summaries = _evaluate(
        args, model, processor, [replace(c, model=tag) for c in configs], loaded=loaded
    )
    return _failed_runs(summaries)


def _cmd_sweep(args: argparse.Namespace) -> int:
    tag = _check_model_args(args)
    loaded: dict[tuple[Any, ...], list[Any]] = {}
    plan = _configs(args, tag, "none", None, None, {}, loaded=loaded)
    for method in args.methods:
        kwargs = (
            {"checkpoint": args.checkpoint}
            if args.checkpoint and method in ("craft", "scissor-merge")
            else {}
        )
        _check_method(method, kwargs, args.allow_untrained)
        for ratio in args.ratios:
            plan += _configs(args, tag, method, ratio, None, kwargs, loaded=loaded)
    model, processor, tag = _load_model(args)
    summaries = _evaluate(
        args, model, processor, [replace(c, model=tag) for c in plan], loaded=loaded
    )
    failed = _failed_runs(summaries)
    if int(os.environ.get("RANK", "0")) == 0:
        from craft_eval.report import write_report

        out = write_report(Path(args.output) / tag)
        print(out["table"])
        print(f"report: {out['markdown']}\nplot: {out['plot']}")
        return max(failed, _warn_skipped(out["skipped"]))
    return failed


def _cmd_report(args: argparse.Namespace) -> int:
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
    return _warn_skipped(out["skipped"])


def _warn_skipped(skipped: list[str]) -> int:
    """A report that left out unreadable summaries exits 1, naming each one."""
    for line in skipped:
        print(f"craft-eval: warning: skipped {line}", file=sys.stderr)
    if skipped:
        print(
            f"craft-eval: {len(skipped)} summary file(s) skipped; the report shows the others",
            file=sys.stderr,
        )
    return 1 if skipped else 0


def _cmd_methods(args: argparse.Namespace) -> int:
    from craft_eval.methods import list_methods

    rows = list_methods()
    width = max(len(m.name) for m in rows)
    print(f"{'name':<{width}}  kind   needs            description")
    for m in rows:
        needs = ", ".join(m.needs) or "-"
        print(f"{m.name:<{width}}  {m.kind:<5}  {needs:<15}  {m.description}")
        print(f"{'':<{width}}  {'':<5}  {'':<15}  saliency: {m.saliency}")
    return 0


def _cmd_efficiency(args: argparse.Namespace) -> int:
    import math

    import torch

    from craft_eval.efficiency import (
        format_efficiency,
        load_arch,
        measure_efficiency,
        parse_overrides,
    )
    from craft_eval.methods import get_method_info

    checks = [
        ("--frames", args.frames >= 1, args.frames),
        ("--text-tokens", args.text_tokens >= 0, args.text_tokens),
        ("--warmup", args.warmup >= 0, args.warmup),
        ("--repeats", args.repeats >= 1, args.repeats),
    ] + [("--ratios", math.isfinite(r) and r >= 1, r) for r in args.ratios]
    for option, ok, value in checks:
        if not ok:
            raise UsageError(f"{option}: {value} is out of range")
    check_device(args.device)
    check_output(args.json, "--json", is_file=True)
    try:
        overrides = parse_overrides(args.override)
        load_arch(args.arch, overrides)
        for method in args.methods:
            get_method_info(method)
    except (KeyError, ValueError, TypeError) as error:
        raise UsageError(str(error.args[0] if error.args else error)) from None
    try:
        result = measure_efficiency(
            args.arch,
            num_frames=args.frames,
            ratios=args.ratios,
            methods=args.methods,
            text_tokens=args.text_tokens,
            device=args.device,
            dtype=getattr(torch, args.dtype) if args.dtype else None,
            warmup=args.warmup,
            repeats=args.repeats,
            overrides=overrides,
        )
    except MemoryError as error:
        raise UsageError(str(error)) from None
    print(format_efficiency(result))
    if result["overrides"]:
        print(f"(scaled down with overrides {result['overrides']})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


def _cmd_audit(args: argparse.Namespace) -> int:
    """`craft-eval audit`: the table, exit 1 on overlap (`craft_eval.audit`)."""
    from craft_eval.audit import AuditError, audit, table, training_files, write_clean
    from craft_eval.tasks import get_benchmark

    try:
        benchmarks = [get_benchmark(b).name for b in args.benchmark]
    except KeyError as error:
        raise UsageError(f"--benchmark: {error.args[0]}") from None
    try:
        files, mixture = training_files(args.train)
        found, rows = audit(files, _roots(args.data_root, benchmarks), subset=args.subset,
                            hash_content=not args.no_hash, progress=not args.no_progress)  # fmt: skip
        print(table(found, rows, benchmarks))
        for o in found:
            print(f"overlap: {o.where}: {o.video} is in {o.benchmark} (same {o.by})")
        if args.write_clean:
            path = write_clean(files, found, Path(args.write_clean), mixture)
            rows_out = len({o.where for o in found})
            print(f"clean files without the {rows_out} overlapping rows: {path}")
    except AuditError as error:
        raise UsageError(str(error)) from None
    return 1 if found else 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from craft_eval.demo import run_demo

    _check_demo_args(args)
    return run_demo(
        model_path=args.model,
        backbone=args.backbone,
        ratio=args.ratio,
        methods=args.methods,
        output=args.output,
        device=args.device,
        num_items=args.items,
    )


def _check_demo_args(args: argparse.Namespace) -> None:
    """Every demo option checked before the clips are written or a model loads."""
    from craft_core import TokenBudget
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
        try:
            TokenBudget.parse(args.ratio, None, None, names=_BUDGET_OPTIONS)
        except ValueError as error:
            raise UsageError(str(error)) from None
    for method in args.methods or []:
        try:
            get_method_info(method)
        except KeyError as error:
            raise UsageError(f"--methods {method}: {error.args[0]}") from None


if __name__ == "__main__":
    sys.exit(main())
