"""The held-out table of the world: every registered craft-eval method and given CRAFT
checkpoints at every ratio, first-token accuracy and KL to the uncompressed model, paired.

    uv run python packages/craft-eval/scripts/world_table.py --clips 300 \
        --checkpoint trained=packages/craft-world/src/craft_world/checkpoints/craft \
        --out /tmp/world-table.json --markdown /tmp/world-table.md

Every number comes from `craft_world.measure` (`evaluate`, `paired`) on the same held-out
items (split "test", both tasks, 2 questions a clip). Each method's per-item hits and KL are
saved to `<out>.items.pt` as they finish: a killed run resumes where it stopped. The
markdown has the table (accuracy % +- binomial SE, KL +- SE) and, for every checkpoint, its
paired difference to every other method at every ratio, with a verdict: "wins" (KL lower by
>= 3 paired SE and accuracy higher by >= 1 point), "KL only" (KL lower by >= 3 SE, accuracy
not 1 point higher), "loses" (KL higher by >= 3 SE), else "ties".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch


def verdict(kl_drop: float, kl_se: float, acc_gain: float) -> str:
    """`wins`, `KL only`, `loses` or `ties`: the table's reading of one paired comparison."""
    if kl_drop >= 3 * kl_se:
        return "wins" if acc_gain >= 0.01 else "KL only"
    if -kl_drop >= 3 * kl_se:
        return "loses"
    return "ties"


def markdown(rows: dict[str, Any], ratios: list[float], names: list[str], mine: list[str]) -> str:
    """The table and the paired comparisons of every checkpoint in `mine`."""
    from craft_world.measure import Score, paired

    unc: Score = rows["uncompressed"]
    lines = [
        f"{unc.n} held-out questions; uncompressed accuracy "
        f"{100 * unc.accuracy:.1f} +- {100 * unc.accuracy_se:.1f}",
        "",
        "| method | " + " | ".join(f"{r:g}x" for r in ratios) + " |",
        "| --- |" + " --- |" * len(ratios),
    ]
    for name in names:
        cells = []
        for r in ratios:
            s = rows.get(f"{name}@{r:g}")
            cells.append(
                "-"
                if s is None
                else f"{100 * s.accuracy:.1f} ± {100 * s.accuracy_se:.1f} "
                f"(KL {s.kl_mean:.3f} ± {s.kl_se:.3f})"
            )
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
                d, se = paired(b.kl, a.kl)
                g, g_se = paired(a.hits, b.hits)
                lines.append(
                    f"| {r:g}x | {other} | {d:+.4f} ± {se:.4f} | {100 * g:+.1f} ± "
                    f"{100 * g_se:.1f} | {verdict(d, se, g)} |"
                )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clips", type=int, default=300, help="held-out clips (2 questions each)")
    parser.add_argument("--ratios", nargs="+", type=float, default=[2.0, 4.0, 8.0, 16.0, 32.0])
    parser.add_argument("--methods", nargs="*", help="default: every registered method")
    parser.add_argument("--checkpoint", nargs="*", default=[], help="NAME=FOLDER (CRAFT modules)")
    parser.add_argument("--out", required=True, help="JSON summary (per-item data next to it)")
    parser.add_argument("--markdown", help="also write the markdown table here")
    args = parser.parse_args(argv)
    if args.clips < 2 or any(r < 1 for r in args.ratios):
        parser.error("--clips must be >= 2 and every ratio >= 1")
    specs = [c.split("=", 1) for c in args.checkpoint]
    if any(len(s) != 2 or not Path(s[1]).is_dir() for s in specs):
        parser.error(f"--checkpoint takes NAME=FOLDER with an existing folder: {args.checkpoint}")
    torch.set_num_threads(1)

    from craft_core import CraftCompressor
    from craft_eval.methods import list_methods
    from craft_eval.methods.build import build_compressor
    from craft_world import load_backbone, make_clips
    from craft_world.measure import Score, answer_logprobs, evaluate, load_items

    model, processor = load_backbone()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    items = load_items(make_clips(out.parent / f"clips-{args.clips}", args.clips), task=None)
    store = out.with_suffix(".items.pt")
    saved = torch.load(store, weights_only=True) if store.is_file() else {}  # no code at load
    ref = answer_logprobs(model, processor, items)
    rows: dict[str, Score] = {k: Score(**v) for k, v in saved.items()}
    rows["uncompressed"] = evaluate(model, processor, items, ref)
    names = args.methods if args.methods is not None else [m.name for m in list_methods()]
    compressors: dict[str, Any] = {}
    width = int(model.config.get_text_config().hidden_size)
    for name in names:  # untrained CRAFT family: a fresh module, as the demo's "craft"
        compressors[name] = build_compressor(name, hidden_size=width, allow_untrained=True)
    for name, folder in specs:
        compressors[name] = CraftCompressor.from_pretrained(folder).eval()
    summary: dict[str, Any] = {"items": len(items), "uncompressed": rows["uncompressed"].accuracy}
    for ratio in args.ratios:
        for name, compressor in compressors.items():
            key = f"{name}@{ratio:g}"
            if key not in rows:
                rows[key] = evaluate(model, processor, items, ref, compressor, ratio)
                saved[key] = {"hits": rows[key].hits, "kl": rows[key].kl}
                torch.save(saved, store)
            s = rows[key]
            summary[key] = {"accuracy": s.accuracy, "accuracy_se": s.accuracy_se,
                            "kl": s.kl_mean, "kl_se": s.kl_se}  # fmt: skip
            print(key, summary[key], flush=True)
            out.write_text(json.dumps(summary, indent=1))
    text = markdown(rows, args.ratios, list(compressors), [n for n, _ in specs])
    if args.markdown:
        Path(args.markdown).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
