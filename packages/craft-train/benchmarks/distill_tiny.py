"""Distillation vs stage 1 (+2) vs the untrained merge module on the tiny random Qwen2.5-VL.

    uv run python packages/craft-train/benchmarks/distill_tiny.py --work /tmp/distill-tiny

The backbone is the test suite's tiny random model (LM head x20, projector x10, so that its
answers depend on the video); the clips are the suite's synthetic ones, whose caption names
their dominant colour. Same 32 training clips and the same number of examples for every
run (80 steps x 2; distill sees 3 generic prompts per clip); held out: 16 unseen clips x 6
generic prompts, with the uncompressed model's own greedy responses. Reported at ratios 8
and 16: the KL to the uncompressed model over the response tokens (mean per item, SE of the
paired difference to the untrained module) and the token agreement (the compressed model's
most likely next token equals the uncompressed model's, teacher-forced). A random model
has no accuracy to report.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

TESTS = Path(__file__).parents[1] / "tests"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--steps", type=int, default=80)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    sys.path.insert(0, str(TESTS))
    from conftest import COLOURS, build_setup, heldout_distill, write_clip  # the tiny world

    from craft_core import CraftCompressor
    from craft_eval.scoring import paired
    from craft_train.config import load_config
    from craft_train.distill import DEFAULT_PROMPTS
    from craft_train.trainer import train

    work = Path(args.work)
    setup = build_setup(work / "tiny", clips=4)
    names = list(COLOURS)
    rows: dict[str, list[dict[str, Any]]] = {"train": [], "captions": [], "qa": [], "test": []}
    for split, indices in (("train", range(32)), ("test", range(100, 116))):
        for i in indices:
            video = work / f"c{i}.mp4"
            if not video.is_file():
                write_clip(video, names[i % 4], seed=1000 + i)
            for k in range(3 if split == "train" else 6):  # explicit, path-independent
                prompt = DEFAULT_PROMPTS[(i + k) % len(DEFAULT_PROMPTS)]
                rows[split].append({"video": str(video), "prompt": prompt})
            if split == "train":
                colour = names[i % 4]
                rows["captions"].append(
                    {"video": str(video), "caption": f"mostly {colour}", "source": "s"}
                )
                question = "Which colour is most common?"
                rows["qa"].append(
                    {"video": str(video), "question": question, "answer": colour, "source": "s"}
                )
    manifests = {}
    for name, items in rows.items():
        manifests[name] = work / f"{name}.jsonl"
        manifests[name].write_text("".join(json.dumps(r) + "\n" for r in items))

    def config(stage: Any, out: Path, manifest: Path, steps: int, **extra: Any) -> Any:
        sections: dict[str, Any] = {
            "data": {"manifests": [str(manifest)]},
            "optim": {"lr": extra.pop("lr", 2e-2), "max_steps": steps, "epochs": 100},
            **extra,
        }
        if stage == "distill":
            sections["distill"] = {"max_new_tokens": 8, **sections.get("distill", {})}
        return load_config(data=setup.config(out, stage=stage, **sections), stage=stage)

    s1_steps = args.steps * 3 // 4
    runs = {
        "distill": config("distill", work / "distill", manifests["train"], args.steps),
        "stage 1": config(1, work / "stage1", manifests["captions"], s1_steps),
    }
    for cfg in runs.values():
        train(cfg)
    stage2 = config(
        2,
        work / "stage2",
        manifests["qa"],
        args.steps - s1_steps,
        lr=1e-3,
        model={"init_from": str(work / "stage1")},
    )
    train(stage2)
    modules = {
        "distill": CraftCompressor.from_pretrained(work / "distill" / "craft"),
        "stage 1+2": CraftCompressor.from_pretrained(work / "stage2" / "craft"),
    }

    bundle, judge, batches = heldout_distill(config("distill", work / "eval", manifests["test"], 1))
    states = {"untrained": {k: v.clone() for k, v in bundle.compressor.state_dict().items()}}
    states.update({name: m.state_dict() for name, m in modules.items()})

    print(f"held out: {len(batches)} items (16 unseen clips x 6 prompts)")
    print(
        "| merge module | ratio | KL to uncompressed | KL drop vs untrained (SE) | token agreement |"
    )
    print("| --- | --- | --- | --- | --- |")
    results: dict[str, Any] = {}
    for ratio in (8.0, 16.0):
        kls, agree = {}, {}
        for name, state in states.items():
            bundle.compressor.load_state_dict(state)
            bundle.model.set_budget(ratio=ratio)
            per_item, hits, total = [], 0, 0
            with torch.no_grad():
                for batch in batches:
                    per_item.append(judge.item_kl(bundle.model, batch))
                    p = judge.response_logits(bundle.model, batch)
                    hits += int((p.student.argmax(-1) == p.teacher.argmax(-1)).sum())
                    total += int(p.targets.numel())
            kls[name], agree[name] = torch.cat(per_item), hits / total
        for name in states:
            drop, se = paired(kls["untrained"], kls[name])
            results.setdefault(name, {})[f"{ratio:g}x"] = {
                "kl": float(kls[name].mean()),
                "kl_drop": drop,
                "kl_drop_se": se,
                "token_agreement": agree[name],
            }
            print(
                f"| {name} | {ratio:g}x | {float(kls[name].mean()):.4f} | {drop:.4f} ({se:.4f}) "
                f"| {agree[name]:.3f} |"
            )
    (work / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
