"""The paper's ablation ladder in craft-world, measured and stored as the JSON the world ships.

    uv run python packages/craft-eval/scripts/world_ladder.py --ladder /tmp/ladder \
        --backbone BB --family corners --clips 600 --work /tmp/ladder-tables \
        --out packages/craft-world/src/craft_world/checkpoints/ladder.json

`--ladder`: the work folder of craft-train's `scripts/train_world_craft.py --method ladder`
(`stage1-uniform/`, `stage1/`, `stage2/`, `stage2-lora/`, `stage2-fresh/`). Two
`world_table.py` runs on the same held-out clips, their clips, runs and tables under `--work`
(resumable: each method and ratio is a run folder):

1. the backbone: the fixed CRAFT rules (mean rule `craft-selection`, target rule
   `craft-prune`, untrained gate `craft`), the selection-only baselines (DivPrune,
   VisionZip, FastVID, uniform) and the module-only steps of the ladder;
2. the CRAFT+ backbone (`stage2-lora/lora` merged): its module, and DivPrune on it.

The JSON (`craft_world.ladder_path()`, read by `craft-eval demo`): `{"family", "questions",
"uncompressed", "ratios", "steps": [[label, key], ...], "results": {"<key>@<ratio>":
{"accuracy", "accuracy_se", "kl", "kl_se"}}}`, accuracy in [0, 1]; CRAFT+'s rows are keyed
`stage2-lora` and `divprune-lora`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

BASELINES = ["divprune", "visionzip", "fastvid", "uniform"]
RULES = [
    ("mean rule", "craft-selection"),
    ("target rule", "craft-prune"),
    ("untrained gate", "craft"),
]
TRAINED = [
    ("stage 1, uniform weights", "stage1-uniform"),
    ("stage 1, position weights", "stage1"),
    ("+ stage 2", "stage2"),
    ("stage 2 alone, from the untrained gate (shipped)", "stage2-fresh"),
]


def _world_table() -> Any:
    spec = importlib.util.spec_from_file_location(
        "world_table", Path(__file__).with_name("world_table.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--ladder", required=True, help="train_world_craft.py --method ladder's --work"
    )
    parser.add_argument(
        "--backbone", required=True, help="the world backbone the ladder trained on"
    )
    parser.add_argument("--family", default="corners")
    parser.add_argument("--clips", type=int, default=600, help="held-out clips")
    parser.add_argument("--ratios", nargs="+", type=float, default=[8.0, 16.0])
    parser.add_argument("--work", required=True, help="folder of the clips, runs and tables")
    parser.add_argument("--out", required=True, help="the ladder JSON")
    args = parser.parse_args(argv)
    ladder, out = Path(args.ladder), Path(args.out)
    runs = [name for _, name in TRAINED] + ["stage2-lora"]
    missing = [n for n in runs if not (ladder / n / "craft" / "config.json").is_file()]
    if missing or not (ladder / "stage2-lora" / "lora" / "adapter_config.json").is_file():
        parser.error(
            f"--ladder {ladder}: runs missing or unfinished: {missing or ['stage2-lora/lora']}"
        )
    tables = Path(args.work)
    table = _world_table()
    common = ["--clips", str(args.clips), "--family", args.family, "--backbone", args.backbone,
              "--ratios", *map(str, args.ratios)]  # fmt: skip
    table.main([*common, "--methods", *BASELINES, *(k for _, k in RULES),
                "--checkpoint", *(f"{k}={ladder / k / 'craft'}" for _, k in TRAINED),
                "--out", str(tables / "backbone.json"), "--markdown", str(tables / "backbone.md")])  # fmt: skip
    table.main([*common, "--methods", "divprune", "--lora", str(ladder / "stage2-lora" / "lora"),
                "--checkpoint", f"stage2-lora={ladder / 'stage2-lora' / 'craft'}",
                "--out", str(tables / "lora.json"), "--markdown", str(tables / "lora.md")])  # fmt: skip
    base = json.loads((tables / "backbone.json").read_text())
    lora = json.loads((tables / "lora.json").read_text())
    results: dict[str, Any] = {k: v for k, v in base.items() if "@" in k}
    for key, value in lora.items():
        if "@" in key:
            name, ratio = key.split("@")
            results[f"{'divprune-lora' if name == 'divprune' else name}@{ratio}"] = value
    steps = [*RULES, *TRAINED, ("CRAFT+ (LoRA r32 q/k/v/o)", "stage2-lora"),
             ("DivPrune", "divprune"), ("DivPrune on CRAFT+'s backbone", "divprune-lora"),
             ("VisionZip", "visionzip"), ("FastVID", "fastvid"), ("uniform", "uniform")]  # fmt: skip
    record = {"family": args.family, "questions": base["items"], "uncompressed": base["uncompressed"],
              "uncompressed_lora": lora["uncompressed"], "ratios": args.ratios,
              "steps": [list(s) for s in steps], "results": results}  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
