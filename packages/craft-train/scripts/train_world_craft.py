"""Make the shipped merge module: craft-train in the world, on the frozen world backbone.

    uv run python packages/craft-train/scripts/train_world_craft.py --work /tmp/world-craft \
        --family corners --clips 3000 [--method stage2|stage12|ladder|distill] \
        [--ship packages/craft-world/src/craft_world/checkpoints/craft]

Clips: split "craft" (disjoint from the backbone's and the held-out ones), `--clips` of each
`--family` (craft-world's squares, its crowd, its corners, or several).
`stage2` (the shipped module): stage 2 (QA labels, `craft_world.recipe.STAGE2`) from an
untrained module (`fresh/`, the same bits as craft-eval's untrained `craft`), folder
`stage2-fresh/`. `stage12`: stage 1 (captions, `STAGE1`, folder `stage1/`) then stage 2
(folder `stage2/`). `ladder`: the paper's ablation ladder, each step a craft-train run:
`stage1-uniform/` (stage 1 with uniform merge weights), `stage1/`, `stage2/` (from
`stage1/`), `stage2-lora/` (CRAFT+: stage 2 with LoRA r 32 on q/k/v/o, from `stage1/`) and
`stage2-fresh/`; then craft-eval's `scripts/world_ladder.py` measures them. `distill`:
`DISTILL`, the uncompressed backbone as teacher on each clip's describe and question
prompts, no labels (folder `distill/`; craft-world 0.4's module). `--ship` copies the
method's final module (`stage2-fresh/` for stage2 and ladder). One CPU thread; every run
checkpoints and resumes (run the same command again). `--set` overrides every run
(`optim.lr=1e-3`); `s1:` / `s2:` prefixed ones the stage-1 / stage-2 runs. `--only`: some
of the method's runs (their starting runs must be there).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import torch

RUNS: dict[str, tuple[int, str | None, list[str]]] = {
    "stage1-uniform": (1, None, ["model.craft.weighting=uniform"]),
    "stage1": (1, None, []),
    "stage2": (2, "stage1", []),
    "stage2-lora": (2, "stage1", ["model.lora.enabled=true"]),
    "stage2-fresh": (2, "fresh", []),
}
"""The ladder's craft-train runs: folder -> (stage, the run it starts from, overrides).
"fresh": an untrained module (`fresh/`, the same bits as craft-eval's untrained `craft`)."""
METHODS = {
    "stage12": (["stage1", "stage2"], "stage2"),
    "stage2": (["stage2-fresh"], "stage2-fresh"),
    "ladder": (list(RUNS), "stage2-fresh"),
}
"""The runs of each `--method` but distill, and the one whose module `--ship` copies."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--method", choices=["distill", *METHODS], default="stage2")
    parser.add_argument("--ship", help="copy the final craft/ folder here")
    parser.add_argument("--clips", type=int, default=600, help="clips of each family")
    parser.add_argument(
        "--family",
        nargs="+",
        choices=["squares", "crowd", "corners", "quiz"],
        default=["squares"],
        help="craft-world's task families to train on (examples drawn from all)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(RUNS),
        help="train only these runs of --method (e.g. the ladder's rungs but the shipped one)",
    )
    parser.add_argument("--backbone", help="the frozen world backbone (default: the shipped one)")
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        help="config overrides: optim.lr=1e-3 (s1:/s2: one stage's runs)",
    )
    args = parser.parse_args(argv)
    if args.clips <= 0:
        parser.error(f"--clips must be positive, got {args.clips}")
    torch.set_num_threads(1)

    from craft_train.config import load_config
    from craft_train.trainer import train
    from craft_world import make_clips
    from craft_world.recipe import (
        DISTILL,
        STAGE1,
        STAGE2,
        craft_train_config,
        distill_manifest,
        save_untrained_module,
    )

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
        runs, shipped = METHODS[args.method]
        final = work / shipped
        caps: list[str | Path] = [r / "captions.jsonl" for r in roots]
        qas: list[str | Path] = [r / "qa.jsonl" for r in roots]
        common = [o for o in args.set if not o.startswith(("s1:", "s2:"))]
        unknown = sorted(set(args.only or []) - set(runs))
        if unknown:
            parser.error(f"--only {' '.join(unknown)}: not a run of --method {args.method}")
        for name in [r for r in runs if not args.only or r in args.only]:
            stage, init, extra = RUNS[name]
            if init == "fresh":
                save_untrained_module(work / init, args.backbone)
            mine = [o[3:] for o in args.set if o.startswith(f"s{stage}:")]
            data = craft_train_config(
                caps if stage == 1 else qas,
                work / name,
                stage=stage,
                init_from=None if init is None else work / init,
                seed=args.seed,
                backbone=args.backbone,
                **(STAGE1 if stage == 1 else STAGE2),
            )
            step_t0 = time.perf_counter()
            train(load_config(data=data, overrides=[*extra, *common, *mine]))
            print(f"{name} done in {time.perf_counter() - step_t0:.0f} s", flush=True)
    print(f"{args.method} done in {time.perf_counter() - t0:.0f} s", flush=True)
    if args.ship:
        ship = Path(args.ship)
        shutil.copytree(final / "craft", ship, dirs_exist_ok=True)
        print(f"shipped {ship}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
