"""craft-train configs for the world (plain dicts: craft-world does not import craft-train).

    from craft_train.config import load_config
    from craft_train.trainer import train
    train(load_config(data=craft_train_config(root / "captions.jsonl", "runs/s1", stage=1)))

The shipped merge module (`craft_world.craft_path()`) was made by
`packages/craft-train/scripts/train_world_craft.py` with `STAGE1` then `STAGE2`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "DISTILL",
    "STAGE1",
    "STAGE2",
    "craft_train_config",
    "distill_manifest",
    "save_untrained_module",
]

STAGE1: dict[str, Any] = {
    "optim": {"lr": 4e-3, "max_steps": 150, "grad_accum": 4},
    "budget": {},  # the paper's: threshold mode half the time, ratios 2-32
}
"""Stage 1 (captions): the paper's learning rate and budget sampling, 150 steps x 4 clips."""

STAGE2: dict[str, Any] = {
    "optim": {"lr": 3e-4, "max_steps": 300, "grad_accum": 16, "scheduler": "constant"},
    "budget": {"p_threshold": 0.0, "ratios": [16.0]},
}
"""Stage 2 (QA): 300 steps x 16 questions at a fixed 16x, lr 3e-4 after a 2% warm-up, no
decay (issue 44, measured in the corners world, docs/crowd.md): 75 steps x 4 at lr 1e-4
barely moved the module, lr 1e-3 to 4e-3 with 4 questions a step left the training loss
flat, and a cosine decay with 8x and 16x drawn per step reached 92.3 / 83.8% at 8x / 16x
where this reaches about 97 / 95%. A merge trained at 16x serves 8x too (fewer rounds)."""


DISTILL: dict[str, Any] = {
    "optim": {"lr": 4e-3, "max_steps": 600, "grad_accum": 4},
    "budget": {"p_threshold": 0.0, "ratios": [8.0, 16.0]},
    "distill": {"max_new_tokens": 16},
}
"""craft-train distill: the frozen backbone, uncompressed, is the teacher on the clips'
describe and question prompts (no labels); fixed ratios 8 and 16 drawn per step."""


def distill_manifest(root: str | Path) -> Path:
    """`root/distill.jsonl` from `make_clips` output: `{video, prompt}` rows, the describe
    prompt and every question's MVBench prompt of each clip (no answers: the teacher's)."""
    import json

    from craft_world.clips import CAPTION_PROMPT

    root = Path(root)
    rows = []
    for name in ("captions.jsonl", "qa.jsonl"):
        for line in (root / name).read_text().splitlines():
            row = json.loads(line)
            rows.append({"video": row["video"], "prompt": row.get("question", CAPTION_PROMPT)})
    path = root / "distill.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def craft_train_config(
    manifest: str | Path | list[str | Path],
    output_dir: str | Path,
    *,
    stage: int | str = 1,
    backbone: str | Path | None = None,
    init_from: str | Path | None = None,
    seed: int = 0,
    **sections: dict[str, Any],
) -> dict[str, Any]:
    """A `craft_train.config.load_config(data=...)` dict for the world on one CPU process.

    Args:
        manifest: captions.jsonl (stage 1) or qa.jsonl (stage 2) from `make_clips`, or a list
            of them (several families: examples drawn from all).
        output_dir: the run's folder.
        stage: 1, 2 (needs `init_from`) or "distill" (a `distill_manifest`).
        backbone: the backbone folder (default: the shipped one).
        init_from: a previous run's folder (stage 2: the stage-1 run).
        seed: `optim.seed` (data order, budgets, init).
        sections: per-section overrides, merged into the defaults (`optim={"lr": 1e-3}`).
    """
    from craft_world import WORLD_CRAFT, backbone_path

    manifests = manifest if isinstance(manifest, list) else [manifest]
    cfg: dict[str, Any] = {
        "stage": stage,
        "model": {
            "backbone": str(backbone if backbone is not None else backbone_path()),
            "dtype": "float32",
            "attn_implementation": "sdpa",
            "craft": dict(WORLD_CRAFT),
            "init_from": None if init_from is None else str(init_from),
        },
        "data": {
            "manifests": [str(m) for m in manifests],
            "num_workers": 0,
            "max_frames": 8,
            "fps": 2.0,
        },
        "optim": {
            "lr": 4e-3,
            "bf16": False,
            "gradient_checkpointing": False,
            "per_device_batch_size": 1,
            "grad_accum": 4,
            "epochs": 100,
            "seed": seed,
        },
        "train": {
            "output_dir": str(output_dir),
            "deepspeed": None,
            "save_steps": 50,
            "save_total_limit": 1,
            "progress_bar": False,
        },
    }
    for name, values in sections.items():
        cfg[name] = {**cfg.get(name, {}), **values}
    return cfg


def save_untrained_module(folder: str | Path, backbone: str | Path | None = None) -> Path:
    """An untrained merge module of the backbone's width in `folder/craft` (a craft-train
    run's layout, what stage 2's `init_from` takes), drawn as craft-eval draws its untrained
    `craft` (`torch.manual_seed(config.seed)`): the same bits. Kept if already there."""
    import json

    import torch

    from craft_core import CraftCompressor, CraftConfig
    from craft_world import WORLD_CRAFT, backbone_path

    folder = Path(folder)
    if not (folder / "craft" / "config.json").is_file():
        source = Path(backbone) if backbone is not None else backbone_path()
        hidden = json.loads((source / "config.json").read_text())["text_config"]["hidden_size"]
        config = CraftConfig(hidden_size=hidden, **WORLD_CRAFT)
        with torch.random.fork_rng():
            torch.manual_seed(config.seed)
            CraftCompressor(config).save_pretrained(folder / "craft")
    return folder
