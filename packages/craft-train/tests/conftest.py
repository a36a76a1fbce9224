"""Shared fixtures: a tiny random VLM on disk and synthetic clips whose caption is their colour.

Every test runs torch on one thread: the suite is meant for a small, busy CPU, where torch's
default thread pool oversubscribes the cores and runs ten times slower.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pytest
import torch

from craft_adapters.video import write_video

torch.set_num_threads(1)

MODEL_TYPE = "qwen2_5_vl"
COLOURS = {
    "red": (230, 20, 20),
    "green": (20, 230, 20),
    "blue": (20, 20, 230),
    "white": (235, 235, 235),
}
TINY_CRAFT = {
    "rank": 16,
    "rope_sections": [2, 3, 3],
    "gate_hidden": 32,
    "round_embed_dim": 16,
    "sim_dim": 16,
}


def write_clip(path: Path, colour: str, seed: int, frames: int = 8, size: int = 96) -> None:
    """A 4 fps mpeg4 clip (read back at 2 fps: 4 frames) of a 6 x 6 block pattern, about half
    of whose blocks are `colour` and the rest random, scrolling sideways.

    The tokens of one clip differ from each other, so how the merge module fuses them changes
    what the language model sees (with one flat colour every fusion gives the same token).
    """
    rng = np.random.default_rng(seed)
    grid = rng.integers(0, 255, (6, 6, 3))
    grid[rng.random((6, 6)) < 0.5] = COLOURS[colour]
    image = np.kron(grid, np.ones((size // 6, size // 6, 1))).astype(np.uint8)
    write_video(path, (np.roll(image, 4 * f, axis=1) for f in range(frames)), fps=4)


@dataclass
class TinySetup:
    root: Path
    backbone: Path
    captions: Path  # stage-1 manifest
    qa: Path  # stage-2 manifest

    def config(self, out: Path, stage: int = 1, **sections: dict[str, Any]) -> dict[str, Any]:
        """A config dict for the tiny model; `sections` update the defaults per section."""
        cfg: dict[str, Any] = {
            "stage": stage,
            "model": {
                "backbone": str(self.backbone),
                "dtype": "float32",
                "craft": dict(TINY_CRAFT),
            },
            "data": {
                "manifests": [str(self.captions if stage == 1 else self.qa)],
                "num_workers": 0,
                "max_frames": 8,
            },
            "optim": {"lr": 2e-2, "bf16": False, "grad_accum": 2, "epochs": 4, "seed": 0},
            "train": {
                "output_dir": str(out),
                "deepspeed": None,
                "save_steps": 1000,
                "progress_bar": False,
            },
        }
        for name, values in sections.items():
            cfg[name] = {**cfg.get(name, {}), **values}
        return cfg


def save_scaled_tiny_vlm(folder: Path, seed: int = 0) -> None:
    """The tiny random VLM (`craft_adapters.tiny`, MODEL_TYPE) saved to `folder` with its
    LM head scaled x20 and its vision projector's output x10, so that the frozen language
    model is sensitive to its video tokens (at the default init it predicts a near-uniform
    distribution whatever it sees, and no merge module could move the loss)."""
    from craft_adapters.tiny import build_tiny_vlm

    model, processor = build_tiny_vlm(MODEL_TYPE, folder, seed=seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
        for name, param in model.named_parameters():
            if "visual.merger.mlp.2" in name:
                param.mul_(10.0)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)


def build_setup(root: Path, clips: int = 16) -> TinySetup:
    """The scaled tiny VLM (`save_scaled_tiny_vlm`) on disk, its clips and both manifests."""
    root.mkdir(parents=True, exist_ok=True)
    save_scaled_tiny_vlm(root / "vlm")
    caption_rows, qa_rows = [], []
    names = list(COLOURS)
    for i in range(clips):
        name = names[i % len(names)]
        write_clip(root / f"clip{i}.mp4", name, seed=i)
        source = "even" if i % 2 == 0 else "odd"
        caption_rows.append(
            {"video": f"clip{i}.mp4", "caption": f"mostly {name}", "source": source}
        )
        qa_rows.append(
            {
                "video": f"clip{i}.mp4",
                "question": "Which colour is most common?",
                "answer": name,
                "source": source,
            }
        )
    captions, qa = root / "captions.jsonl", root / "qa.jsonl"
    captions.write_text("".join(json.dumps(r) + "\n" for r in caption_rows))
    qa.write_text("".join(json.dumps(r) + "\n" for r in qa_rows))
    return TinySetup(root, root / "vlm", captions, qa)


def heldout_distill(cfg: Any) -> tuple[Any, Any, list[dict[str, Any]]]:
    """What a distillation is judged with on the examples of `cfg` (a `stage: distill`
    config): the model in eval mode, its `Distiller` with the uncompressed model's responses
    cached, and one batch per example, teacher-forced on its response."""
    from craft_train.data import collate
    from craft_train.distill import Distiller, load_distill_examples
    from craft_train.model import build_model

    bundle = build_model(cfg)
    bundle.model.eval()
    judge = Distiller(cfg, bundle)
    examples = load_distill_examples(cfg)
    judge.fill_cache(examples)
    encode = judge.make_encoder(cfg, bundle.processor)
    batches = []
    for example in examples:
        batch = collate([{**encode(example), "skipped_videos": []}], bundle.pad_token_id)
        batch.pop("skipped_videos")
        batches.append(batch)
    return bundle, judge, batches


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinySetup:
    return build_setup(tmp_path_factory.mktemp("tiny"))
