"""`craft-eval efficiency`: Table 2 on a real-size random-weight architecture."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from craft_eval.cli.common import UsageError, check_device, check_output, kv, parse_budget
from craft_eval.runner import _BUDGET_OPTIONS


def add_parser(sub: Any) -> None:
    from craft_adapters.registry import reference_archs

    eff = sub.add_parser("efficiency", help="Table 2 on a real-size random-weight architecture")
    archs = ", ".join(alias[0] if alias else key for key, alias in reference_archs().items())
    eff.add_argument("--arch", required=True, help=f"a shipped architecture: {archs}")
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
    eff.add_argument(
        "--method-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of every method measured, e.g. precision=fast (CRAFT's float32 merge) "
        "or compile=true (CRAFT's compiled loop: CUDA graphs, CUDA only)",
    )
    eff.add_argument("--json", help="also write the result as JSON here")


def command(args: argparse.Namespace) -> int:
    import torch

    from craft_eval.efficiency import (
        format_efficiency,
        load_arch,
        measure_efficiency,
        parse_overrides,
    )
    from craft_eval.methods.build import CLI, build_compressor

    checks = [
        ("--frames", args.frames >= 1, args.frames),
        ("--text-tokens", args.text_tokens >= 0, args.text_tokens),
        ("--warmup", args.warmup >= 0, args.warmup),
        ("--repeats", args.repeats >= 1, args.repeats),
    ]
    for option, ok, value in checks:
        if not ok:
            raise UsageError(f"{option}: {value} is out of range")
    for ratio in args.ratios:
        parse_budget("efficiency", ratio, names=("--ratios", *_BUDGET_OPTIONS[1:]))
    check_device(args.device)
    check_output(args.json, "--json", is_file=True)
    options = kv(args.method_arg)
    try:
        overrides = parse_overrides(args.override)
        hidden = int(load_arch(args.arch, overrides)["text_config"]["hidden_size"])
        for method in args.methods:
            # Built once here (an unknown method is named too): an option a method does not take, or a bad value, is named
            # before the language model is built.
            build_compressor(
                method, options, hidden_size=hidden, allow_untrained=True, spelling=CLI
            )
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
            method_options=options,
        )
    except MemoryError as error:
        raise UsageError(str(error)) from None
    print(format_efficiency(result))
    if result["overrides"]:
        print(f"(scaled down with overrides {result['overrides']})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0
