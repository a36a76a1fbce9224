"""A Hub-ready folder from a finished training run: weights, config, model card, log summary.

    from craft_train.hub_export import export_hub_folder
    folder = export_hub_folder("runs/stage2")          # -> runs/stage2/hub/
    # then, with huggingface_hub's own upload (card and summary included):
    #   hf upload org/craft-qwen2.5-vl-7b runs/stage2/hub

The folder loads with `CraftCompressor.from_pretrained(folder)` (and by id once uploaded):

    hub/
      config.json, model.safetensors   the merge module (craft/ of the run, bit for bit)
      README.md                        model card: base model, hidden size, ratios, recipe
      training_summary.json            steps, losses, tokens before/after, from log.jsonl
      lora/                            the LoRA adapter of a CRAFT+ run, when there is one

It reads only what `craft_train.trainer.train` leaves in its output folder (craft/, lora/,
config.yaml, log.jsonl, train_state.json) and writes only inside the new folder.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import yaml

from craft_train.checkpoint import CONFIG_FILE, LOG_FILE, TRAIN_STATE
from craft_train.model import CRAFT_DIR, LORA_DIR

__all__ = ["HUB_DIR", "SUMMARY_FILE", "export_hub_folder", "summarize_log", "training_recipe"]

HUB_DIR = "hub"
SUMMARY_FILE = "training_summary.json"
_WRITES = {"config.json", "model.safetensors", "README.md", SUMMARY_FILE, LORA_DIR}


def summarize_log(path: Path) -> dict[str, Any]:
    """Steps, losses and token counts of a run's `log.jsonl` (one JSON object per logged
    step; a torn last line, left by a killed run, is skipped)."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    rows = [r for r in rows if isinstance(r, dict) and "step" in r]
    if not rows:
        raise ValueError(f"{path} holds no logged step: nothing to summarize")
    losses = [float(r["loss"]) for r in rows if r.get("loss") is not None]
    before = sum(int(r.get("tokens_before") or 0) for r in rows)
    after = sum(int(r.get("tokens_after") or 0) for r in rows)
    return {
        "logged_steps": len(rows),
        "last_step": int(rows[-1]["step"]),
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
        "min_loss": min(losses) if losses else None,
        "tokens_before": before,
        "tokens_after": after,
        "realized_ratio": round(before / after, 4) if after else None,
        "budgets": sorted({str(r["budget"]) for r in rows if r.get("budget") is not None}),
        "skipped_videos": int(rows[-1].get("skipped_videos") or 0),
    }


def training_recipe(cfg: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """The card's recipe: what a reader needs to reproduce the run (from config.yaml as dumped
    by `dump_config`, and train_state.json)."""
    optim, budget, data = cfg["optim"], cfg.get("budget", {}), cfg["data"]
    world = int(state.get("world_size", 1))
    return {
        "stage": cfg["stage"],
        "backbone": cfg["model"]["backbone"],
        "lora": bool(cfg["model"].get("lora", {}).get("enabled", False)),
        "steps": int(state["global_step"]),
        "lr": optim["lr"],
        "scheduler": optim.get("scheduler"),
        "batch_size": int(optim.get("per_device_batch_size", 1))
        * int(optim.get("grad_accum", 1))
        * world,
        "epochs": optim.get("epochs"),
        "p_threshold": budget.get("p_threshold"),
        "thresholds": budget.get("thresholds"),
        "fps": data.get("fps"),
        "max_frames": data.get("max_frames"),
        "manifests": [Path(m).name for m in data.get("manifests", [])],
        "examples": state.get("examples"),
        "world_size": world,
        "deepspeed": cfg["train"].get("deepspeed") is not None,
    }


def _base_model(backbone: str) -> str | None:
    """The backbone as a Hub id for the card, or None when it is a local folder."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if Path(backbone).exists():
        return None
    try:
        validate_repo_id(backbone)
    except HFValidationError:
        return None
    return backbone


def export_hub_folder(
    output_dir: str | Path,
    dest: str | Path | None = None,
    *,
    base_model: str | None = None,
    repo_id: str | None = None,
    results: str | None = None,
) -> Path:
    """Write the Hub-ready folder of the finished run in `output_dir` (see the module doc).

    Args:
        output_dir: the run's `train.output_dir`.
        dest: the folder to write (default `output_dir/hub`); it must be new, or a previous
            export (holding nothing but what this writes).
        base_model: Hub id of the backbone for the card; default: `model.backbone` of the run
            when it is a Hub id (a local backbone folder is named in the recipe only).
        repo_id: the id the card's loading example names.
        results: a markdown table of measured results (craft-eval's `results_table`).

    Returns:
        The folder.

    Raises:
        FileNotFoundError: a file of the run is missing.
        ValueError: the run is not finished; `dest` holds files this did not write.
    """
    from craft_core import CraftCompressor

    run = Path(output_dir)
    folder = Path(dest) if dest is not None else run / HUB_DIR
    state = _finished_state(run)
    _check_dest(folder)
    cfg = yaml.safe_load((run / CONFIG_FILE).read_text())
    summary = {**summarize_log(run / LOG_FILE), "train_state": state}
    recipe = training_recipe(cfg, state)
    ratios = cfg.get("budget", {}).get("ratios")
    module = CraftCompressor.from_pretrained(run / CRAFT_DIR)  # refuses NaN, wrong shapes
    folder.mkdir(parents=True, exist_ok=True)
    module.save_pretrained(
        folder,
        model_card_kwargs={
            "base_model": base_model or _base_model(recipe["backbone"]),
            "ratios": ratios,
            "recipe": recipe,
            "results": results,
            "repo_id": repo_id,
            "training_summary": {
                k: v
                for k, v in summary.items()
                if k != "train_state" and not (isinstance(v, float) and not math.isfinite(v))
            },
        },
    )
    (folder / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    if (run / LORA_DIR).is_dir():
        shutil.rmtree(folder / LORA_DIR, ignore_errors=True)  # a previous export's copy
        shutil.copytree(run / LORA_DIR, folder / LORA_DIR)
    return folder


def _finished_state(run: Path) -> dict[str, Any]:
    """train_state.json of `run`, after checking the run left every file the export reads and
    finished."""
    needed = [run / CRAFT_DIR, run / CONFIG_FILE, run / LOG_FILE, run / TRAIN_STATE]
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        raise FileNotFoundError(
            f"{run} is not a finished craft-train run: missing {', '.join(missing)}"
        )
    state = json.loads((run / TRAIN_STATE).read_text())
    if not state.get("finished"):
        raise ValueError(
            f"{run} is not finished (step {state.get('global_step')} of "
            f"{state.get('total_steps')}): resume it before exporting"
        )
    return state


def _check_dest(folder: Path) -> None:
    """Refuse a `dest` that is a file or holds anything an export does not write."""
    if folder.exists():
        if not folder.is_dir():
            raise ValueError(f"dest {folder} is a file: pick a new folder")
        foreign = sorted(p.name for p in folder.iterdir() if p.name not in _WRITES)
        if foreign:
            raise ValueError(f"dest {folder} already holds {foreign}: pick a new folder")
