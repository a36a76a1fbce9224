"""craft-world: a miniature world where accuracy means something.

    import craft_world
    model, processor = craft_world.load_backbone()        # the shipped, trained tiny Qwen2.5-VL
    root = craft_world.make_clips("clips", n=200, seed=0)  # held-out clips in MVBench's format
    craft_world.craft_path()                               # a merge module trained by craft-train
    craft_world.ladder_path()                              # the paper's ablation ladder, measured

The clips and questions are in `craft_world.clips`, the backbone recipe in
`craft_world.backbone` and `craft_world.train_backbone`. Measurements in the world (accuracy,
the first answer token's KL to the uncompressed model, paired comparisons) are craft-eval's:
its runner with `craft_eval.scoring.FirstTokenScorer`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from craft_world.files import make_clips

__version__ = "0.5.0"

__all__ = [
    "WORLD_CRAFT",
    "backbone_path",
    "craft_path",
    "ladder_path",
    "load_backbone",
    "make_clips",
    "quiz_backbone_path",
]

WORLD_CRAFT: dict[str, Any] = {}
"""CraftConfig fields (other than hidden_size) of the world's merge module: the defaults."""

_CHECKPOINTS = Path(__file__).parent / "checkpoints"


def _shipped(name: str, remake: str) -> Path:
    path = _CHECKPOINTS / name
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"the shipped checkpoint {path} is missing; remake it with `{remake}` "
            "(see packages/craft-world/docs/world.md and docs/module.md)"
        )
    return path


def backbone_path() -> Path:
    """Folder of the trained world backbone: `from_pretrained` loads model and processor."""
    return _shipped("backbone", "python -m craft_world.train_backbone")


def quiz_backbone_path() -> Path:
    """Folder of the quiz family's backbone (issue 54, part 1: 99.2% of 600 held-out quiz
    questions uncompressed, DivPrune 79.0% at 8x): the shipped backbone's frozen tower with
    three more phase-C runs on the quiz (`world_recipe.json` holds the chain; the commands
    and figures: docs/varying-question.md). `load_backbone(quiz_backbone_path())` loads it."""
    return _shipped(
        "quiz-backbone", "python -m craft_world.train_backbone (docs/varying-question.md)"
    )


def craft_path() -> Path:
    """Folder of the shipped merge module (`CraftCompressor.from_pretrained`), trained in
    the world by `craft-train stage2` on the frozen backbone, from an untrained module, on
    the corners family's questions (`recipe.STAGE2`; docs/crowd.md)."""
    return _shipped("craft", "python packages/craft-train/scripts/train_world_craft.py")


def ladder_path() -> Path:
    """The JSON of the paper's ablation ladder measured in the world (600 held-out corners
    questions at 8x and 16x; written by craft-eval's `scripts/world_ladder.py`)."""
    path = _CHECKPOINTS / "ladder.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"the shipped ladder {path} is missing; remake it with "
            "`python packages/craft-eval/scripts/world_ladder.py` (see docs/crowd.md)"
        )
    return path


def load_backbone(path: str | Path | None = None) -> tuple[Any, Any]:
    """`(model, processor)`: the world backbone (default: the shipped one; `path`: a folder
    `train_backbone` saved) in float32, eval mode, on the CPU."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    path = backbone_path() if path is None else Path(path)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model, AutoProcessor.from_pretrained(path)
