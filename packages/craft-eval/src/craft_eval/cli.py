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
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from craft_eval.runner import RunConfig, run_benchmark

DEFAULT_RATIOS = (2.0, 4.0, 8.0, 16.0, 32.0)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="checkpoint folder of a supported transformers VLM")
    p.add_argument(
        "--tiny",
        metavar="MODEL_TYPE",
        help="instead of --model: a tiny RANDOM model of this backbone (qwen2_5_vl, qwen3_5, "
        "qwen3_vl, llava_onevision); for plumbing checks only",
    )
    p.add_argument("--device", help="cuda, cuda:1, cpu (default: cuda:LOCAL_RANK if available)")


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="craft-eval", description=__doc__.split("\n")[0])
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
        "--override", help='text-config overrides, e.g. "num_hidden_layers=4,hidden_size=64"'
    )
    eff.add_argument("--json", help="also write the result as JSON here")

    demo = sub.add_parser("demo", help="the whole pipeline on a laptop CPU, nothing downloaded")
    demo.add_argument("--model", help="a real checkpoint instead of the tiny random model")
    demo.add_argument("--backbone", default="qwen2_5_vl", help="tiny model's backbone")
    demo.add_argument("--ratio", type=float, default=8.0)
    demo.add_argument("--methods", nargs="+", help="default: every registered method")
    demo.add_argument("--output", "-o", default="craft-demo")
    demo.add_argument("--device")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {
        "run": _cmd_run,
        "sweep": _cmd_sweep,
        "report": _cmd_report,
        "methods": _cmd_methods,
        "efficiency": _cmd_efficiency,
        "demo": _cmd_demo,
    }[args.command]
    return int(handler(args) or 0)


# -- helpers -----------------------------------------------------------------------------------


def _roots(values: list[str], benchmarks: list[str]) -> dict[str, str]:
    pairs = dict(v.split("=", 1) for v in values if "=" in v)
    plain = [v for v in values if "=" not in v]
    out = {}
    for b in benchmarks:
        if b in pairs:
            out[b] = pairs[b]
        elif plain:
            base = Path(plain[0])
            out[b] = str(base / b) if (base / b).exists() else str(base)
        else:
            raise SystemExit(f"no --data-root for {b}")
    return out


def _device(arg: str | None) -> str:
    import torch

    if arg:
        return arg
    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return "cpu"


def _load_model(args: argparse.Namespace) -> tuple[Any, Any, str]:
    device = _device(args.device)
    if args.model:
        from craft_eval.backend import load_pretrained

        model, processor = load_pretrained(args.model, device)
        return model, processor, Path(args.model).name
    if args.tiny:
        import tempfile

        from craft_adapters.tiny import build_tiny_vlm

        model, processor = build_tiny_vlm(args.tiny, tempfile.mkdtemp(prefix="craft-tiny-"))
        return model.to(device).eval(), processor, f"tiny-{args.tiny}"
    raise SystemExit("give --model PATH (or --tiny MODEL_TYPE for a random plumbing check)")


def _kv(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _evaluate(
    args: argparse.Namespace,
    model: Any,
    processor: Any,
    tag: str,
    method: str,
    ratio: float | None,
    threshold: float | None,
    method_kwargs: dict[str, Any],
    progress: bool = True,
) -> list[dict[str, Any]]:
    from craft_eval.backend import HFBackend

    summaries = []
    roots = _roots(args.data_root, args.benchmark)
    for bench in args.benchmark:
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
            method_kwargs=method_kwargs,
        )
        run_dir = Path(args.output) / tag / config.run_name()

        def backend(config: RunConfig = config, run_dir: Path = run_dir) -> HFBackend:
            return HFBackend(
                model,
                processor,
                method=config.method,
                ratio=config.ratio,
                threshold=config.threshold,
                min_tokens=getattr(args, "min_tokens", None),
                method_kwargs=method_kwargs,
                fps=config.fps,
                max_frames=config.max_frames,
                merge_map_dir=run_dir,
                merge_maps=getattr(args, "merge_maps", 0),
            )

        summary = run_benchmark(
            config, backend, run_dir, progress=progress and not args.no_progress
        )
        if summary is not None:
            summaries.append(summary)
            s = summary["scores"]
            comp = "-" if s["comp_ratio"] is None else f"{s['comp_ratio']:.2f}x"
            print(
                f"{config.run_name()}: accuracy {s['accuracy']:.1f} "
                f"({s['n_scored']} scored, {s['n_errors']} errors), Comp. {comp} -> {run_dir}"
            )
    return summaries


# -- commands ----------------------------------------------------------------------------------


def _cmd_run(args: argparse.Namespace) -> int:
    model, processor, tag = _load_model(args)
    method_kwargs = _kv(args.method_arg)
    if args.checkpoint:
        method_kwargs["checkpoint"] = args.checkpoint
    if args.method != "none" and args.ratio is None and args.threshold is None:
        raise SystemExit("--method needs --ratio or --threshold")
    _evaluate(args, model, processor, tag, args.method, args.ratio, args.threshold, method_kwargs)
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    model, processor, tag = _load_model(args)
    _evaluate(args, model, processor, tag, "none", None, None, {})
    for method in args.methods:
        kwargs = (
            {"checkpoint": args.checkpoint}
            if args.checkpoint and method in ("craft", "scissor-merge")
            else {}
        )
        for ratio in args.ratios:
            _evaluate(args, model, processor, tag, method, ratio, None, kwargs)
    if int(os.environ.get("RANK", "0")) == 0:
        from craft_eval.report import write_report

        out = write_report(Path(args.output) / tag)
        print(out["table"])
        print(f"report: {out['markdown']}\nplot: {out['plot']}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from craft_eval.report import write_report

    out = write_report(args.runs, args.out)
    print(out["table"])
    print(f"\nreport: {out['markdown']}\nplot:   {out['plot']}")
    for path in out["merge_maps"]:
        print(f"merge map: {path}")
    return 0


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
    from craft_eval.efficiency import format_efficiency, measure_efficiency, parse_overrides

    result = measure_efficiency(
        args.arch,
        num_frames=args.frames,
        ratios=args.ratios,
        methods=args.methods,
        text_tokens=args.text_tokens,
        device=args.device,
        warmup=args.warmup,
        repeats=args.repeats,
        overrides=parse_overrides(args.override),
    )
    print(format_efficiency(result))
    if result["overrides"]:
        print(f"(scaled down with overrides {result['overrides']})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from craft_eval.demo import run_demo

    return run_demo(
        model_path=args.model,
        backbone=args.backbone,
        ratio=args.ratio,
        methods=args.methods,
        output=args.output,
        device=args.device,
    )


if __name__ == "__main__":
    sys.exit(main())
