"""Phase P of the backbone recipe: the vision tower alone learns to report every colour x
corner of the tiles, evenly, through a linear probe (`train_backbone`, `Recipe.steps_p`).

Why (issue 44, `docs/crowd.md`): a tower trained on the corners QUESTION makes the asked
red-top-left dot a direction of its own, which every diversity selection then keeps (DivPrune
96.8% at 8x against 97.7% uncompressed: nothing for a merge to win). Trained instead through
a probe that reads all 24 colour x corner features of every token (binary cross-entropy,
`[B * 144, 24]`) on tiles where every dot is any colour (no feature rarer than another), the
tower reports the asked feature like any other; phase C (`freeze_vision_c`) then teaches the
language model the question on the frozen tower, and a selection keeps the asked token only
as often as chance lets it (DivPrune 77% / 42% of "yes" clips at 8x / 16x).

Batch `Recipe.batch`, AdamW (lr `Recipe.lr`, betas 0.9 / 0.98, weight decay 0.01), 50
warm-up steps then a cosine to 0, gradient clip 1.0. A pure function of the seed and the
step, like every phase.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from craft_world.clips import FRAMES, PALETTE, SIZE
from craft_world.crowd import CELLS, CORNERS, CrowdScene, _lay_out, _rng, render_crowd

__all__ = ["FEATURES", "balanced_tiles", "corner_labels", "new_corner_probe", "probe_step"]

FEATURES = len(PALETTE) * len(CORNERS)
"""24 colour x corner features a token can show (colour-major)."""

_STREAM = 12  # the balanced tiles' rng stream, disjoint from the families' (10, 11)
_WARMUP = 50


def balanced_tiles(seed: int, index: int) -> CrowdScene:
    """Training tiles (split "train") where each dot is any of the six colours."""
    rng = _rng(seed, "train", index, stream=_STREAM)
    names = list(PALETTE)
    tiles = _lay_out(rng, lambda: [names[int(k)] for k in rng.integers(0, len(names), 4)])
    return CrowdScene(names[0], False, tuple(tiles), int(rng.integers(2**31)), 0)


def corner_labels(scene: CrowdScene) -> torch.Tensor:
    """Which colour x corner features each token shows: float `[144, 24]` (colour-major)."""
    names = list(PALETTE)
    out = torch.zeros(FRAMES // 2 * CELLS, FEATURES)
    for pair, cell, dots in scene.tiles:
        for corner, colour in enumerate(dots):
            if colour is not None:
                out[pair * CELLS + cell, names.index(colour) * len(CORNERS) + corner] = 1.0
    return out


def asked_feature(scene: CrowdScene) -> int:
    """The column of `corner_labels` that a corners or quiz scene asks about (colour-major:
    `colour * 4 + corner`)."""
    if scene.corner is None:
        raise ValueError("asked_feature: the scene asks about no corner (a crowd scene)")
    return list(PALETTE).index(scene.asked) * len(CORNERS) + scene.corner


def new_corner_probe(hidden: int, seed: int) -> torch.nn.Linear:
    """The probe `[hidden -> 24]`, drawn from `seed` without touching the global generator."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return torch.nn.Linear(hidden, FEATURES)


def probe_lr(step: int, steps: int, lr: float) -> float:
    """50 warm-up steps, then a cosine from `lr` to 0 over the phase."""
    return lr * min(1.0, (step + 1) / _WARMUP) * 0.5 * (1 + math.cos(math.pi * step / steps))


def probe_step(
    visual: Any,
    probe: torch.nn.Module,
    opt: torch.optim.Optimizer,
    pixels_of: Any,
    seed: int,
    batch: int,
    step: int,
) -> tuple[float, float]:
    """One optimiser step of phase P on batch `step`: `pixels_of(frames)` gives a clip's
    `[144, 1176]` processor pixels. Returns (loss, share of tokens whose 24 labels are all
    right)."""
    scenes = [balanced_tiles(seed, step * batch + j) for j in range(batch)]
    pixels = torch.cat([pixels_of(render_crowd(s)) for s in scenes]).float()
    grid = torch.tensor([[FRAMES // 2, SIZE // 14, SIZE // 14]]).repeat(batch, 1)
    logits = probe(visual(pixels, grid_thw=grid).pooler_output)
    labels = torch.cat([corner_labels(s) for s in scenes])
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    loss.backward()
    params = [p for group in opt.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    exact = ((logits.detach() > 0).float() == labels).all(-1).float().mean().item()
    return loss.item(), exact
