"""Make the shipped merge module: craft-train stage 1 (captions) then stage 2 (QA) in the world.

    uv run python packages/craft-world/scripts/train_craft.py --work /tmp/world-craft \
        [--ship packages/craft-world/src/craft_world/checkpoints/craft]

Clips: split "craft" (disjoint from the backbone's and the held-out ones), 600 clips. Configs:
`craft_world.recipe.STAGE1` / `STAGE2` on one CPU thread. Both runs checkpoint and resume.
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
    parser.add_argument("--ship", help="copy the final craft/ folder here")
    parser.add_argument("--clips", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--set", nargs="*", default=[], help="stage1/stage2 overrides: s1:optim.lr=1e-3"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from craft_train.config import load_config
    from craft_train.trainer import train
    from craft_world import make_clips
    from craft_world.recipe import STAGE1, STAGE2, craft_train_config

    work = Path(args.work)
    root = make_clips(work / "clips", args.clips, seed=0, split="craft")
    s1, s2 = work / "stage1", work / "stage2"
    over1 = [o[3:] for o in args.set if o.startswith("s1:")]
    over2 = [o[3:] for o in args.set if o.startswith("s2:")]
    t0 = time.perf_counter()
    cfg1 = load_config(
        data=craft_train_config(root / "captions.jsonl", s1, stage=1, seed=args.seed, **STAGE1),
        overrides=over1,
    )
    train(cfg1)
    print(f"stage 1 done in {time.perf_counter() - t0:.0f} s", flush=True)
    cfg2 = load_config(
        data=craft_train_config(
            root / "qa.jsonl", s2, stage=2, init_from=s1, seed=args.seed, **STAGE2
        ),
        overrides=over2,
    )
    train(cfg2)
    print(f"stage 1 + 2 done in {time.perf_counter() - t0:.0f} s", flush=True)
    if args.ship:
        ship = Path(args.ship)
        shutil.copytree(s2 / "craft", ship, dirs_exist_ok=True)
        print(f"shipped {ship}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
