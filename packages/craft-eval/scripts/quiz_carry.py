"""What a compressed token still carries in craft-world's quiz family: the asked feature,
read by a linear probe from the rows each method hands the language model.

    uv run python packages/craft-eval/scripts/quiz_carry.py [--clips 300] \
        [--checkpoint stage2=/tmp/p2/s0/stage2/craft] [--out /tmp/quiz-carry.json]

The quiz backbone's frozen tower (`craft_world.quiz_backbone_path()`) turns a clip into 144
rows `[144, D]` (4 temporal pairs x 6 x 6 patches); a tile's row carries its 4 colour x
corner features linearly. A probe (24 logistic outputs, `craft_world.tower_probe.
corner_labels`) is fitted on the rows of `--fit` clips of the `train` split and frozen. On
`--clips` held-out `test` clips, for each method and ratio, the probe reads the ASKED
feature's logit on every row the method keeps (DivPrune: the kept rows as they were; CRAFT:
the fused rows): a "yes" clip's feature is **carried** when some kept row's logit is > 0,
and a "no" clip's is **invented** when some row's is; the AUC of the largest logit, "yes"
clips over "no" clips, is what a reader with a threshold of its own can tell apart. Uncompressed, the asked tile's row is
there by construction. This separates what the budget drops (a selection keeps the asked
tile's row or not) from what a fusion blurs (a fused row holds the asked feature at a
fraction of its length). Clips are rendered in memory (the tower and its probe are the same
either way; the evaluation decodes mp4). One thread; a few minutes on a CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

METHODS = ["divprune", "craft-selection", "craft-prune", "craft"]


def tower_rows(model: Any, cache: Any, scene: Any) -> torch.Tensor:
    """The tower's output rows `[144, D]` of one scene (rendered in memory)."""
    from craft_world.clips import FRAMES, SIZE
    from craft_world.crowd import render_crowd

    pixels = cache.pixels(render_crowd(scene)).float()
    grid = torch.tensor([[FRAMES // 2, SIZE // 14, SIZE // 14]])
    with torch.no_grad():
        return model.model.visual(pixels, grid_thw=grid).pooler_output


def fit_probe(rows: torch.Tensor, labels: torch.Tensor) -> Any:
    """A logistic probe `[D] -> [24]` on standardised rows (Adam, 1,500 full-batch steps)."""
    torch.manual_seed(0)
    mean, scale = rows.mean(0), rows.std(0) + 1e-6
    linear = torch.nn.Linear(rows.shape[1], labels.shape[1])
    optim = torch.optim.Adam(linear.parameters(), 1e-2)
    for _ in range(1500):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            linear((rows - mean) / scale), labels
        )
        optim.zero_grad()
        loss.backward()
        optim.step()
    return lambda x: linear((x - mean) / scale).detach()


def summarize(yes: list[float], no: list[float]) -> dict[str, float]:
    """Per method and ratio, from each clip's largest asked-feature logit: the share of
    "yes" clips above 0 (carried), of "no" clips above 0 (invented), and the AUC of "yes"
    over "no" (what a reader with the best threshold of its own can tell apart; ties 1/2)."""
    pairs = [(a > b) + 0.5 * (a == b) for a in yes for b in no]
    return {
        "carried": sum(v > 0 for v in yes) / max(len(yes), 1),
        "invented": sum(v > 0 for v in no) / max(len(no), 1),
        "auc": sum(pairs) / max(len(pairs), 1),
        "yes": len(yes),
        "no": len(no),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clips", type=int, default=300, help="held-out quiz clips")
    parser.add_argument("--fit", type=int, default=80, help="train-split clips for the probe")
    parser.add_argument("--ratios", nargs="+", type=float, default=[8.0, 16.0])
    parser.add_argument("--checkpoint", nargs="*", default=[], help="NAME=FOLDER (CRAFT)")
    parser.add_argument("--out", help="write the table as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    import craft_world
    from craft_core import TokenBudget
    from craft_eval.methods.build import build_compressor
    from craft_world.backbone import world_processor
    from craft_world.clips import FRAMES, SIZE
    from craft_world.crowd import sample_quiz
    from craft_world.tower_probe import asked_feature, corner_labels
    from craft_world.train_backbone import PromptCache

    model, _ = craft_world.load_backbone(craft_world.quiz_backbone_path())
    cache = PromptCache(world_processor())
    fit = [sample_quiz(0, "train", i) for i in range(args.fit)]
    probe = fit_probe(
        torch.cat([tower_rows(model, cache, s) for s in fit]),
        torch.cat([corner_labels(s) for s in fit]),
    )
    scenes = [sample_quiz(0, "test", i) for i in range(args.clips)]
    rows = [tower_rows(model, cache, s) for s in scenes]
    grid = (FRAMES // 2, SIZE // 14, SIZE // 14)
    coords = torch.stack(torch.unravel_index(torch.arange(len(rows[0])), grid), dim=1)
    width = int(rows[0].shape[1])
    methods: dict[str, Any] = {"none": None}
    for name in METHODS:
        methods[name] = build_compressor(name, hidden_size=width, allow_untrained=True)
    for spec in args.checkpoint:
        name, folder = spec.split("=", 1)
        methods[name] = build_compressor("craft", {"checkpoint": folder}, hidden_size=width)
    table: dict[str, Any] = {}
    for name, compressor in methods.items():
        for ratio in [1.0] if compressor is None else args.ratios:
            kept = rows
            if compressor is not None:  # every clip in one call (CRAFT's batched entry)
                with torch.no_grad():
                    done = compressor.compress_many(rows, [coords] * len(rows),
                                                    TokenBudget(ratio=ratio))  # fmt: skip
                kept = [result.features for result in done]
            yes, no = [], []  # per clip: the largest asked-feature logit over kept rows
            for scene, x in zip(scenes, kept):
                top = float(probe(x)[:, asked_feature(scene)].max())
                (yes if scene.present else no).append(top)
            row = summarize(yes, no)
            table[f"{name}@{ratio:g}"] = row
            print(f"{name:18s} {ratio:4g}x  carried {row['carried']:.1%} of {len(yes)} yes "
                  f"clips, invented {row['invented']:.1%} of {len(no)} no, AUC "
                  f"{row['auc']:.3f}", flush=True)  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
