"""craft-train: two-stage training of the CRAFT merge module on a frozen VLM.

    from craft_train import load_config, train
    cfg = load_config("qwen3_5_4b_stage1.yaml", ["optim.max_steps=100"], stage=1)
    result = train(cfg)               # merge module in result.output_dir / "craft"

Stage 1 trains on captions (lr 4e-3, merge module from scratch), stage 2 on video QA
(lr 6e-6, from stage 1). Only the merge module trains (CRAFT); `model.lora.enabled` adds
LoRA on the language model's attention (CRAFT+). `stage: distill` trains on unlabeled
videos to match the uncompressed model (`craft_train.distill`). The command line is
`craft-train`.
"""

from craft_train.budget import sample_budget
from craft_train.config import ConfigError, TrainingConfig, check_paths, load_config

__version__ = "0.5.0"

__all__ = [
    "ConfigError",
    "TrainingConfig",
    "check_paths",
    "load_config",
    "sample_budget",
    "train",
]


def train(cfg: TrainingConfig, **kwargs):  # type: ignore[no-untyped-def]
    """Run one training stage (see `craft_train.trainer.train`); imports torch lazily."""
    from craft_train.trainer import train as _train

    return _train(cfg, **kwargs)
