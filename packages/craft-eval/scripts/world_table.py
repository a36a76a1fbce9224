"""The held-out table of the world: every registered craft-eval method and given CRAFT
checkpoints at every ratio, first-token accuracy and KL to the uncompressed model, paired.

    uv run python packages/craft-eval/scripts/world_table.py --clips 300 \
        --checkpoint trained=packages/craft-world/src/craft_world/checkpoints/craft \
        --out /tmp/world-table.json --markdown /tmp/world-table.md

Every number comes from craft-eval's runner with `scoring.FirstTokenScorer` (first-token
option-letter hits and KL to the uncompressed model, `scoring.paired_records`) on the same
held-out items (split "test"; `--family squares`: both tasks, 2 questions a clip; `--family
crowd`, `corners`, `quiz`: craft-world's tile families, 1 question a clip). Each method and
ratio is a run folder under `<out>.runs/` (JSONL records, written as items finish): a killed run
resumes where it stopped. The markdown has the table (accuracy % +- binomial SE, KL +- SE)
and, for every checkpoint, its paired difference to every other method at every ratio, with a verdict: "wins" (KL lower by
>= 3 paired SE and accuracy higher by >= 1 point), "KL only" (KL lower by >= 3 SE, accuracy
not 1 point higher), "loses" (KL higher by >= 3 SE), else "ties".

`--lora FOLDER`: a LoRA adapter (a craft-train run's `lora/`, CRAFT+) merged into the
backbone before anything runs: every row, the uncompressed one included, is then that
model's (use another `--out`: the runs' folders are per backbone).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

TASKS = {
    "squares": "object_existence,moving_count",
    "crowd": "moving_attribute",
    "corners": "moving_direction",
    "quiz": "counterfactual_inference",
}
"""The MVBench tasks each of craft-world's families is filed under."""


def verdict(kl_drop: float, kl_se: float, acc_gain: float) -> str:
    """`wins`, `KL only`, `loses` or `ties`: the table's reading of one paired comparison."""
    if kl_drop >= 3 * kl_se:
        return "wins" if acc_gain >= 0.01 else "KL only"
    if -kl_drop >= 3 * kl_se:
        return "loses"
    return "ties"


def _cell(s: dict[str, Any]) -> str:
    """`accuracy ± SE (KL mean ± SE)` of one run's scores (accuracy in points)."""
    return (
        f"{100 * s['first_token_accuracy']:.1f} ± {100 * s['first_token_accuracy_se']:.1f} "
        f"(KL {s['first_token_kl_mean']:.3f} ± {s['first_token_kl_se']:.3f})"
    )


def markdown(rows: dict[str, Any], ratios: list[float], names: list[str], mine: list[str]) -> str:
    """The table and the paired comparisons of every checkpoint in `mine`; `rows` maps
    "uncompressed" and "NAME@RATIO" to `(scores, records)` of a run."""
    from craft_eval.scoring import paired_records

    unc = rows["uncompressed"][0]
    lines = [
        f"{unc['first_token_n']} held-out questions; uncompressed accuracy "
        f"{100 * unc['first_token_accuracy']:.1f} +- {100 * unc['first_token_accuracy_se']:.1f}",
        "",
        "| method | " + " | ".join(f"{r:g}x" for r in ratios) + " |",
        "| --- |" + " --- |" * len(ratios),
    ]
    for name in names:
        cells = ["-" if f"{name}@{r:g}" not in rows else _cell(rows[f"{name}@{r:g}"][0])
                 for r in ratios]  # fmt: skip
        label = f"**{name}**" if name in mine else name
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for me in mine:
        lines += ["", f"Paired, `{me}` minus each method on the same items "
                  "(KL drop > 0: closer to the uncompressed model):", "",
                  "| ratio | vs | KL drop ± SE | accuracy gain (points) ± SE | verdict |",
                  "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for r in ratios:
            a = rows.get(f"{me}@{r:g}")
            for other in names:
                b = rows.get(f"{other}@{r:g}")
                if other == me or a is None or b is None:
                    continue
                d, se = paired_records(b[1], a[1], "first_token_kl")
                g, g_se = paired_records(a[1], b[1], "first_token_correct")
                lines.append(
                    f"| {r:g}x | {other} | {d:+.4f} ± {se:.4f} | {100 * g:+.1f} ± "
                    f"{100 * g_se:.1f} | {verdict(d, se, g)} |"
                )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clips", type=int, default=300, help="held-out clips")
    parser.add_argument("--family", choices=list(TASKS), default="squares")
    parser.add_argument("--backbone", help="a world backbone folder (default: the shipped one)")
    parser.add_argument("--ratios", nargs="+", type=float, default=[2.0, 4.0, 8.0, 16.0, 32.0])
    parser.add_argument("--methods", nargs="*", help="default: every registered method")
    parser.add_argument("--checkpoint", nargs="*", default=[], help="NAME=FOLDER (CRAFT modules)")
    parser.add_argument("--lora", help="a LoRA adapter folder merged into the backbone (CRAFT+)")
    parser.add_argument("--out", required=True, help="JSON summary (per-item data next to it)")
    parser.add_argument("--markdown", help="also write the markdown table here")
    args = parser.parse_args(argv)
    if args.clips < 2 or any(r < 1 for r in args.ratios):
        parser.error("--clips must be >= 2 and every ratio >= 1")
    specs = [c.split("=", 1) for c in args.checkpoint]
    if any(len(s) != 2 or not Path(s[1]).is_dir() for s in specs):
        parser.error(f"--checkpoint takes NAME=FOLDER with an existing folder: {args.checkpoint}")
    if args.lora is not None and not (Path(args.lora) / "adapter_config.json").is_file():
        parser.error(f"--lora {args.lora}: no adapter_config.json there (a run's lora/ folder)")
    torch.set_num_threads(1)

    from craft_core import TokenBudget
    from craft_eval.in_model import scaled_stage_options
    from craft_eval.measure import Measure
    from craft_eval.methods import list_methods
    from craft_world import load_backbone, make_clips

    model, processor = load_backbone(args.backbone)
    if args.lora is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.lora).merge_and_unload().eval()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.family == "squares" else f"-{args.family}"
    data = make_clips(out.parent / f"clips-{args.clips}{suffix}", args.clips, family=args.family)
    bench = Measure(model, processor, data, out.with_suffix(".runs"), subset=TASKS[args.family])
    base = bench.run("none")
    rows = {"uncompressed": (base.scores, base.records)}
    names = args.methods if args.methods is not None else [m.name for m in list_methods()]
    # untrained CRAFT family: a fresh module, as the demo's "craft"
    modules: dict[str, str | None] = {**dict.fromkeys(names), **dict(specs)}
    summary: dict[str, Any] = {"items": len(base.records),
                               "uncompressed": base.scores["first_token_accuracy"]}  # fmt: skip
    for ratio in args.ratios:
        budget = TokenBudget(ratio=ratio)  # --ratios, parsed once
        for name, checkpoint in modules.items():
            key = f"{name}@{ratio:g}"
            done = bench.run(name, budget, method="craft" if checkpoint else name,
                             checkpoint=checkpoint,
                             method_kwargs=None if checkpoint else scaled_stage_options(name, model))  # fmt: skip
            rows[key] = s = (done.scores, done.records)
            summary[key] = {"accuracy": s[0]["first_token_accuracy"],
                            "accuracy_se": s[0]["first_token_accuracy_se"],
                            "kl": s[0]["first_token_kl_mean"], "kl_se": s[0]["first_token_kl_se"]}  # fmt: skip
            print(key, summary[key], flush=True)
            out.write_text(json.dumps(summary, indent=1))
    text = markdown(rows, args.ratios, list(modules), [n for n, _ in specs])
    if args.markdown:
        Path(args.markdown).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
