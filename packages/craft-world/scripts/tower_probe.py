"""Retrain a world backbone's vision tower to report every colour x corner of the tiles, evenly.

    uv run python packages/craft-world/scripts/tower_probe.py --backbone BB --out BB-PROBED \
        [--steps 600]

Issue 44's corners experiment (packages/craft-world/docs/crowd.md): a tower trained on the
corners QUESTION makes the asked red-top-left dot a direction of its own, which every
diversity selection then keeps. Here the tower (language model untouched) is trained only
through a linear probe that reads all 24 colour x corner features of every token (binary
cross-entropy, `[B * 144, 24]`), on tiles where every dot is any colour (no feature rarer
than another), batch 8, AdamW lr 1e-3 with 50 warm-up steps and a cosine decay, one thread.
Then `python -m craft_world.train_backbone --start-from BB-PROBED --freeze-vision-c
--family-c corners ...` teaches the language model the question on the frozen tower. The
output folder is a backbone folder (model, processor, the start's `world_recipe.json` with
this step added under `tower_probe`); every step is a pure function of the arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from craft_world.clips import FRAMES, PALETTE, SIZE
from craft_world.crowd import CELLS, CORNERS, CrowdScene, _lay_out, _rng, render_crowd

_STREAM = 12  # the balanced tiles' rng stream, disjoint from the families'


def balanced_tiles(seed: int, index: int) -> CrowdScene:
    """Training tiles (split "train") where each dot is any of the six colours."""
    rng = _rng(seed, "train", index, stream=_STREAM)
    names = list(PALETTE)
    tiles = _lay_out(rng, lambda: [names[int(k)] for k in rng.integers(0, len(names), 4)])
    return CrowdScene(names[0], False, tuple(tiles), int(rng.integers(2**31)), 0)


def corner_labels(scene: CrowdScene) -> torch.Tensor:
    """Which colour x corner features each token shows: float `[144, 24]` (colour-major)."""
    names = list(PALETTE)
    out = torch.zeros(FRAMES // 2 * CELLS, len(names) * len(CORNERS))
    for pair, cell, dots in scene.tiles:
        for corner, colour in enumerate(dots):
            if colour is not None:
                out[pair * CELLS + cell, names.index(colour) * len(CORNERS) + corner] = 1.0
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backbone", required=True, help="a saved world backbone folder")
    parser.add_argument("--out", required=True, help="folder the probed backbone is saved to")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start, out = Path(args.backbone), Path(args.out)
    if args.steps <= 0:
        parser.error(f"--steps must be positive, got {args.steps}")
    if not (start / "world_recipe.json").is_file():
        parser.error(f"--backbone: {start} holds no world_recipe.json (not a saved backbone)")
    if out.exists():
        parser.error(f"--out: {out} exists; give a new folder")
    torch.set_num_threads(1)
    from transformers import AutoModelForImageTextToText

    from craft_world.backbone import new_backbone, world_processor
    from craft_world.train_backbone import PromptCache

    model = new_backbone(args.seed)
    model.load_state_dict(AutoModelForImageTextToText.from_pretrained(start).state_dict())
    cache = PromptCache(world_processor())
    torch.manual_seed(args.seed)
    hidden = int(model.config.get_text_config().hidden_size)
    probe = torch.nn.Linear(hidden, len(PALETTE) * len(CORNERS))
    visual = model.model.visual
    params = [*visual.parameters(), *probe.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.98), weight_decay=0.01)
    grid = torch.tensor([[FRAMES // 2, SIZE // 14, SIZE // 14]]).repeat(8, 1)
    visual.train()
    t0 = time.perf_counter()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = (
                1e-3 * min(1.0, (step + 1) / 50) * 0.5 * (1 + np.cos(np.pi * step / args.steps))
            )
        scenes = [balanced_tiles(args.seed, step * 8 + j) for j in range(8)]
        pixels = torch.cat([cache.pixels(render_crowd(s)) for s in scenes]).float()
        logits = probe(visual(pixels, grid_thw=grid).pooler_output)
        labels = torch.cat([corner_labels(s) for s in scenes])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == args.steps - 1:
            exact = ((logits > 0).float() == labels).all(-1).float().mean().item()
            row = {"step": step + 1, "loss": round(loss.item(), 5), "tokens_exact": round(exact, 3)}
            print(json.dumps({**row, "s": round(time.perf_counter() - t0, 1)}), flush=True)
    model.eval()
    model.save_pretrained(out)
    world_processor().save_pretrained(out)
    record = json.loads((start / "world_recipe.json").read_text())
    record["tower_probe"] = {"steps": args.steps, "seed": args.seed, "lr": 1e-3, "batch": 8}
    (out / "world_recipe.json").write_text(json.dumps(record, indent=1))
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
