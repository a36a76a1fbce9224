"""Distillation vs stage 1+2 vs the untrained merge module, in the miniature world.

    uv run python packages/craft-train/benchmarks/distill_world.py --work /tmp/distill-world

The world (`craft_world`) is a tiny Qwen2.5-VL trained on synthetic clips, with held-out
MVBench-format questions. Three merge modules on the same frozen backbone:

- untrained: the seeded initial module (what `build_model` starts from);
- stage 1+2: craft-train stage 1 on the clips' captions, then stage 2 on their QA (the
  labels), with `craft_world.recipe.STAGE1` / `STAGE2` (150 + 75 steps x 4 examples): the
  trained here (craft-world 0.2 ships a distilled module, so it is no longer the shipped one);
- distill: `craft-train distill` on the same "craft"-split clips WITHOUT their captions or
  answers: each clip with the describe prompt and its two questions' prompts, the frozen
  model's own answers as teacher; 225 steps x 4 examples by default (the same number of
  examples as stage 1+2).

For each, at ratios 8 and 16, on held-out clips (split "test", both tasks), through
craft-eval's runner and its first-token scorer (`craft_eval.measure`): accuracy (the most
likely option letter) and the KL of the first answer token's distribution to the
uncompressed model's, with the binomial standard error of the accuracy, the standard error
of the mean KL, and the standard errors of the paired differences to the untrained module
and (distill) to stage 1+2. Results go to `<work>/results.json` and a markdown table on stdout. Every run writes
as it goes and resumes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch


def distill_manifest(root: Path) -> Path:
    """{video, prompt} rows: the describe prompt and every question prompt, no labels."""
    rows = []
    for line in (root / "captions.jsonl").read_text().splitlines():
        rows.append(
            {"video": json.loads(line)["video"], "prompt": "Describe this video in detail."}
        )
    for line in (root / "qa.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.append({"video": row["video"], "prompt": row["question"]})
    path = root / "distill.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def untrained(hidden_size: int, seed: int, folder: Path) -> Path:
    """The merge module `craft_train.model.build_model` starts from (seeded), saved in
    `folder`."""
    from craft_core import CraftCompressor, CraftConfig
    from craft_world import WORLD_CRAFT

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        CraftCompressor(CraftConfig(hidden_size=hidden_size, **WORLD_CRAFT)).save_pretrained(folder)
    return folder


def train_stage12(work: Path, root: Path) -> Path:
    """craft-train stage 1 (captions) then stage 2 (QA) with the world's recipe; -> craft/."""
    from craft_train.config import load_config
    from craft_train.trainer import train
    from craft_world.recipe import STAGE1, STAGE2, craft_train_config

    s1, s2 = work / "stage1", work / "stage2"
    started = time.perf_counter()
    train(load_config(data=craft_train_config(root / "captions.jsonl", s1, stage=1, **STAGE1)))
    data = craft_train_config(root / "qa.jsonl", s2, stage=2, init_from=s1, **STAGE2)
    train(load_config(data=data))
    print(f"stage 1+2: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return s2 / "craft"


def evaluate(
    modules: dict[str, Path], test_root: Path, ratios: list[float], runs: Path
) -> dict[str, Any]:
    """Accuracy and KL to the uncompressed model per module folder and ratio (paired SEs),
    all from craft-eval's runner with its first-token scorer (`craft_eval.measure`); the runs
    go to `runs` and resume there (a run is matched by its settings and checkpoint PATH, not
    the weights: `main` names the folder by the arguments that make the modules)."""
    import craft_world
    from craft_core import TokenBudget
    from craft_eval.measure import Measure

    model, processor = craft_world.load_backbone()
    bench = Measure(model, processor, test_root, runs)
    plain = bench.run("none").scores
    out: dict[str, Any] = {
        "items": plain["first_token_n"],
        "uncompressed": {
            "accuracy": plain["first_token_accuracy"],
            "accuracy_se": plain["first_token_accuracy_se"],
        },
    }
    for ratio in ratios:
        budget = TokenBudget(ratio=ratio)
        runs = {
            name: bench.run(name, budget, method="craft", checkpoint=str(folder))
            for name, folder in modules.items()
        }
        for name, run in runs.items():
            out.setdefault(name, {})[f"{ratio:g}x"] = _row(name, run, runs)
    return out


def _row(name: str, run: Any, runs: dict[str, Any]) -> dict[str, float]:
    """One module's scores at one ratio, paired against the untrained module (and the
    distilled one against stage 1+2)."""
    from craft_eval.scoring import paired_records

    s, base = run.scores, runs["untrained"].records
    diff, se = paired_records(base, run.records, "first_token_kl")
    acc_diff, acc_se = paired_records(run.records, base, "first_token_correct")
    row = {
        "accuracy": s["first_token_accuracy"],
        "accuracy_se": s["first_token_accuracy_se"],
        "kl": s["first_token_kl_mean"],
        "kl_se": s["first_token_kl_se"],
        "kl_drop_vs_untrained": diff,
        "kl_drop_se": se,
        "accuracy_gain_vs_untrained": acc_diff,
        "accuracy_gain_se": acc_se,
    }
    if name == "distill" and "stage 1+2" in runs:
        other = runs["stage 1+2"].records
        d, d_se = paired_records(other, run.records, "first_token_kl")
        a, a_se = paired_records(run.records, other, "first_token_correct")
        row |= {
            "kl_drop_vs_stage12": d,
            "kl_drop_vs_stage12_se": d_se,
            "accuracy_gain_vs_stage12": a,
            "accuracy_gain_vs_stage12_se": a_se,
        }
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", required=True, help="folder of clips, runs and results")
    parser.add_argument("--clips", type=int, default=600, help="training clips (split craft)")
    parser.add_argument("--test", type=int, default=300, help="held-out clips (split test)")
    parser.add_argument("--steps", type=int, default=225, help="distillation steps (x 4)")
    parser.add_argument("--lr", type=float, default=4e-3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    import craft_world
    from craft_core import CraftCompressor
    from craft_train.config import load_config
    from craft_train.trainer import train
    from craft_world.recipe import craft_train_config

    work = Path(args.work)
    root = craft_world.make_clips(work / "clips", args.clips, seed=0, split="craft")
    test_root = craft_world.make_clips(work / "test", args.test, seed=0, split="test")
    out = work / "distill"
    data = craft_train_config(
        distill_manifest(root),
        out,
        stage="distill",  # type: ignore[arg-type]
        optim={"lr": args.lr, "max_steps": args.steps, "grad_accum": 4},
        distill={"max_new_tokens": 16},
    )
    started = time.perf_counter()
    train(load_config(data=data, stage="distill"))
    seconds = time.perf_counter() - started
    print(f"distillation: {args.steps} steps in {seconds:.0f} s", file=sys.stderr)

    stage12 = train_stage12(work, root)
    width = CraftCompressor.from_pretrained(out / "craft").config.hidden_size
    modules = {
        "untrained": untrained(width, seed=0, folder=work / "untrained"),
        "stage 1+2": stage12,
        "distill": out / "craft",
    }
    # the modules above are retrained on every call: runs of other arguments must not resume
    runs = work / f"runs-clips{args.clips}-test{args.test}-steps{args.steps}-lr{args.lr:g}"
    results = evaluate(modules, test_root, [8.0, 16.0], runs)
    results["distill_seconds"] = seconds
    results["args"] = vars(args)
    (work / "results.json").write_text(json.dumps(results, indent=1))
    unc = results["uncompressed"]
    print(
        f"held-out: {results['items']} questions; uncompressed accuracy "
        f"{unc['accuracy']:.3f} +- {unc['accuracy_se']:.3f}"
    )
    print(
        "| merge module | ratio | accuracy (SE) | KL to uncompressed (SE) "
        "| KL drop vs untrained (paired SE) | accuracy gain vs untrained (paired SE) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for ratio in ("8x", "16x"):
        for name in modules:
            row = results[name][ratio]
            print(
                f"| {name} | {ratio} | {row['accuracy']:.3f} ({row['accuracy_se']:.3f}) | "
                f"{row['kl']:.4f} ({row['kl_se']:.4f}) | "
                f"{row['kl_drop_vs_untrained']:.4f} ({row['kl_drop_se']:.4f}) | "
                f"{row['accuracy_gain_vs_untrained']:+.3f} ({row['accuracy_gain_se']:.3f}) |"
            )
    for ratio in ("8x", "16x"):
        row = results["distill"][ratio]
        if "kl_drop_vs_stage12" in row:
            print(
                f"distill vs stage 1+2 at {ratio}: KL drop "
                f"{row['kl_drop_vs_stage12']:.4f} ({row['kl_drop_vs_stage12_se']:.4f}), "
                f"accuracy gain {row['accuracy_gain_vs_stage12']:+.3f} "
                f"({row['accuracy_gain_vs_stage12_se']:.3f})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
