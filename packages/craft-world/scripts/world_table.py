"""Held-out table in the world: accuracy (+- binomial SE) and KL to the uncompressed model
(+- SE) of every registered craft-eval method and of given CRAFT checkpoints, per ratio.

    uv run python packages/craft-world/scripts/world_table.py --clips 300 --ratios 4 8 16 32 \
        --checkpoint shipped=packages/craft-world/src/craft_world/checkpoints/craft --out table.json

Accuracy is the most likely option letter of the first answer token (what a greedy reply
starts with); KL is per item, so two rows can be compared item by item (`paired`). Rows are
appended to `--out` as they finish (a killed run resumes).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clips", type=int, default=300)
    parser.add_argument("--ratios", nargs="+", type=float, default=[4.0, 8.0, 16.0, 32.0])
    parser.add_argument("--methods", nargs="*", help="default: every registered method")
    parser.add_argument("--checkpoint", nargs="*", default=[], help="NAME=FOLDER")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from craft_core import CraftCompressor
    from craft_eval.methods import get_method, list_methods
    from craft_world import load_backbone, make_clips
    from craft_world.measure import accuracy, answer_logprobs, kl_to, load_items, paired

    model, processor = load_backbone()
    root = make_clips(Path(tempfile.gettempdir()) / "world-table-clips", args.clips)
    items = load_items(root, task=None)
    out = Path(args.out)
    done = json.loads(out.read_text()) if out.is_file() else {}
    store = out.with_suffix(".kl.pt")
    kls: dict[str, torch.Tensor] = torch.load(store) if store.is_file() else {}
    ref = answer_logprobs(model, processor, items)
    base = float(accuracy(ref, items, processor).mean())
    done["uncompressed"] = {"accuracy": 100 * base, "n": len(items)}
    compressors = {}
    for name in args.methods or [m.name for m in list_methods()]:
        try:
            compressors[name] = get_method(name, hidden_size=128)
        except TypeError:
            compressors[name] = get_method(name)
    for spec in args.checkpoint:
        name, folder = spec.split("=", 1)
        compressors[name] = CraftCompressor.from_pretrained(folder).eval()
    for ratio in args.ratios:
        for name, compressor in compressors.items():
            key = f"{name}@{ratio:g}"
            if key in done:
                continue
            try:
                lp = answer_logprobs(model, processor, items, compressor, ratio=ratio)
            except Exception as error:  # report, go on
                done[key] = {"error": f"{type(error).__name__}: {error}"}
                continue
            hits = accuracy(lp, items, processor)
            kl = kl_to(ref, lp)
            kls[key] = kl
            p = float(hits.mean())
            done[key] = {
                "accuracy": 100 * p,
                "se": 100 * math.sqrt(p * (1 - p) / len(items)),
                "kl": float(kl.mean()),
                "kl_se": float(kl.std() / math.sqrt(len(items))),
            }
            print(key, done[key], flush=True)
            out.write_text(json.dumps(done, indent=1))
            torch.save(kls, store)
    for ratio in args.ratios:  # paired: each checkpoint vs the best fixed rule by KL
        fixed = [k for k in kls if k.endswith(f"@{ratio:g}") and k.split("@")[0] in
                 [m.name for m in list_methods()] and k.split("@")[0] != "craft"]  # fmt: skip
        if not fixed:
            continue
        best = min(fixed, key=lambda k: float(kls[k].mean()))
        for spec in args.checkpoint:
            key = f"{spec.split('=')[0]}@{ratio:g}"
            if key in kls:
                d, se = paired(kls[best], kls[key])
                done[f"{key} vs {best}"] = {"kl_drop": d, "se": se}
                print(f"{key} vs best fixed {best}: KL drop {d:.4f} +- {se:.4f}", flush=True)
    out.write_text(json.dumps(done, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
