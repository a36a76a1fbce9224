"""Make the shipped merge module: craft-train in the world, on the frozen world backbone.

    uv run python packages/craft-train/scripts/train_world_craft.py --work /tmp/world-craft \
        [--method distill|stage12] [--ship packages/craft-world/src/craft_world/checkpoints/craft]

Clips: split "craft" (disjoint from the backbone's and the held-out ones), `--clips` of each
`--family` (craft-world's squares, its crowd, or both).
`distill` (the shipped module): `craft_world.recipe.DISTILL`, the uncompressed backbone as
teacher on each clip's describe and question prompts, no labels. `stage12`: stage 1
(captions, `STAGE1`) then stage 2 (QA labels, `STAGE2`). One CPU thread; every run
checkpoints and resumes (run the same command again).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--method", choices=["distill", "stage12"], default="distill")
    parser.add_argument("--ship", help="copy the final craft/ folder here")
    parser.add_argument("--clips", type=int, default=600, help="clips of each family")
    parser.add_argument(
        "--family",
        nargs="+",
        choices=["squares", "crowd", "corners"],
        default=["squares"],
        help="craft-world's task families to train on (examples drawn from all)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backbone", help="the frozen world backbone (default: the shipped one)")
    parser.add_argument(
        "--set", nargs="*", default=[], help="config overrides: optim.lr=1e-3 (stage12: s1:/s2:)"
    )
    args = parser.parse_args(argv)
    if args.clips <= 0:
        parser.error(f"--clips must be positive, got {args.clips}")
    torch.set_num_threads(1)

    from craft_train.config import load_config
    from craft_train.trainer import train
    from craft_world import make_clips
    from craft_world.recipe import DISTILL, STAGE1, STAGE2, craft_train_config, distill_manifest

    work = Path(args.work)
    roots = [
        make_clips(work / ("clips" if f == "squares" else f"clips-{f}"), args.clips, seed=0,
                   split="craft", family=f)
        for f in args.family
    ]  # fmt: skip
    t0 = time.perf_counter()
    if args.method == "distill":
        final = work / "distill"
        manifests: list[str | Path] = [distill_manifest(r) for r in roots]
        data = craft_train_config(
            manifests, final, stage="distill", seed=args.seed, backbone=args.backbone, **DISTILL
        )
        train(load_config(data=data, stage="distill", overrides=args.set))
    else:
        s1, final = work / "stage1", work / "stage2"
        over1 = [o[3:] for o in args.set if o.startswith("s1:")]
        over2 = [o[3:] for o in args.set if o.startswith("s2:")]
        caps: list[str | Path] = [r / "captions.jsonl" for r in roots]
        data = craft_train_config(
            caps, s1, stage=1, seed=args.seed, backbone=args.backbone, **STAGE1
        )
        train(load_config(data=data, overrides=over1))
        qas: list[str | Path] = [r / "qa.jsonl" for r in roots]
        data = craft_train_config(
            qas, final, stage=2, init_from=s1, seed=args.seed, backbone=args.backbone, **STAGE2
        )
        train(load_config(data=data, overrides=over2))
    print(f"{args.method} done in {time.perf_counter() - t0:.0f} s", flush=True)
    if args.ship:
        ship = Path(args.ship)
        shutil.copytree(final / "craft", ship, dirs_exist_ok=True)
        print(f"shipped {ship}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
