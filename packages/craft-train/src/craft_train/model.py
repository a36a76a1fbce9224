"""The model of a training run: frozen backbone (+ LoRA for CRAFT+), trained merge module.

    bundle = build_model(cfg)
    bundle.model(**batch)           # craft_adapters.CraftModel: compresses, then the HF forward
    bundle.set_budget(budget)       # once per optimizer step

The vision encoder, projector and language model are frozen (`requires_grad=False`); only
the `CraftCompressor` trains, plus the LoRA adapters of the language model's attention
projections when `model.lora.enabled` (CRAFT+).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from craft_core import CraftCompressor, CraftConfig, TokenBudget
from craft_train.config import ConfigError, TrainingConfig

__all__ = [
    "CRAFT_DIR",
    "LORA_DIR",
    "ModelBundle",
    "build_model",
    "enable_checkpointing",
    "lora_target_regex",
    "resolve_init_dir",
]

log = logging.getLogger(__name__)

CRAFT_DIR = "craft"
"""Sub-folder of a checkpoint holding the merge module (`CraftCompressor.save_pretrained`)."""
LORA_DIR = "lora"
"""Sub-folder of a checkpoint holding the LoRA adapter (`PeftModel.save_pretrained`)."""


@dataclass
class ModelBundle:
    """What the trainer needs of the model.

    Attributes:
        model: the `CraftModel` (an `nn.Module` holding the backbone and the compressor).
        backbone: the HF VLM inside it (with LoRA layers injected for CRAFT+).
        compressor: the trained `CraftCompressor`.
        processor: the backbone's processor.
        peft_model: the `PeftModel` around `backbone` (CRAFT+), for saving the adapter.
    """

    model: nn.Module
    backbone: nn.Module
    compressor: CraftCompressor
    processor: Any
    peft_model: Any | None = None

    def set_budget(self, budget: TokenBudget) -> None:
        """The compression budget of the coming optimizer step."""
        self.model.set_budget(budget=budget)  # type: ignore[operator]

    def craft_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.compressor.parameters() if p.requires_grad]

    def lora_parameters(self) -> list[nn.Parameter]:
        if self.peft_model is None:
            return []
        return [p for n, p in self.backbone.named_parameters() if "lora_" in n and p.requires_grad]

    def lora_state_dict(self) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.peft_model)  # type: ignore[no-any-return]

    def load_lora_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.peft_model, state)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise ValueError(f"LoRA weights do not fit the model: unexpected {unexpected[:5]}")

    @property
    def pad_token_id(self) -> int:
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        pad = getattr(tokenizer, "pad_token_id", None)
        if pad is None:
            text_config = self.backbone.config.get_text_config()  # type: ignore[union-attr,operator]
            pad = getattr(text_config, "pad_token_id", None)
        return int(pad) if pad is not None else 0


def lora_target_regex(names: list[str]) -> str:
    """A peft `target_modules` regex: these projections inside the language model only.

    The vision towers of some backbones use the same names (SigLIP's `q_proj`), and LoRA
    there would change the tokens CRAFT compresses.
    """
    alternatives = "|".join(re.escape(n) for n in names)
    return rf".*language_model\..*\.({alternatives})"


def resolve_init_dir(path: str | Path, sub: str) -> Path | None:
    """`sub/` of a run's output folder or checkpoint folder, or `path` itself if it holds one.

    A run's output folder holds the final `craft/` (and `lora/`); a checkpoint folder holds
    its own. For `sub == "craft"` a folder with a `config.json` + `model.safetensors` counts.
    Returns None when there is none (LoRA of a CRAFT-only run, say).
    """
    path = Path(path)
    if (path / sub).is_dir():
        return path / sub
    marker = "model.safetensors" if sub == CRAFT_DIR else "adapter_config.json"
    if (path / marker).is_file():
        return path
    return None


def _new_compressor(cfg: TrainingConfig, hidden_size: int) -> CraftCompressor:
    with torch.random.fork_rng():
        torch.manual_seed(cfg.optim.seed)
        return CraftCompressor(CraftConfig(hidden_size=hidden_size, **cfg.model.craft))


def build_model(cfg: TrainingConfig, device: torch.device | str = "cpu") -> ModelBundle:
    """Load the backbone and processor, freeze them, add LoRA (CRAFT+), build the compressor.

    The merge module starts from `model.init_from` (stage 2) or from scratch (seeded by
    `optim.seed`, identical on every rank).
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from craft_adapters import wrap

    kwargs: dict[str, Any] = {"dtype": getattr(torch, cfg.model.dtype)}
    if cfg.model.attn_implementation is not None:
        kwargs["attn_implementation"] = cfg.model.attn_implementation
    backbone = AutoModelForImageTextToText.from_pretrained(cfg.model.backbone, **kwargs)
    processor = AutoProcessor.from_pretrained(cfg.model.processor or cfg.model.backbone)
    backbone.requires_grad_(False)
    backbone.config.use_cache = False
    hidden_size = int(backbone.config.get_text_config().hidden_size)

    peft_model = None
    if cfg.model.lora.enabled:
        peft_model = _add_lora(cfg, backbone)

    if cfg.model.init_from is not None:
        craft_dir = resolve_init_dir(cfg.model.init_from, CRAFT_DIR)
        if craft_dir is None:
            raise ConfigError(
                f"model.init_from: {cfg.model.init_from} holds no merge module (no craft/ "
                "folder, no model.safetensors)"
            )
        compressor = CraftCompressor.from_pretrained(craft_dir, hidden_size=hidden_size)
        log.info("merge module initialised from %s", craft_dir)
    else:
        compressor = _new_compressor(cfg, hidden_size)
    compressor = compressor.float()
    compressor.requires_grad_(True)

    if cfg.optim.gradient_checkpointing:
        enable_checkpointing(backbone)
    # The first budget is a placeholder: the trainer sets one before every optimizer step.
    model = wrap(backbone, compressor, ratio=2.0)
    model.to(device)
    model.train()
    return ModelBundle(
        model=model,
        backbone=backbone,
        compressor=compressor,
        processor=processor,
        peft_model=peft_model,
    )


def enable_checkpointing(backbone: Any) -> None:
    """Activation checkpointing of the backbone (non-reentrant: its inputs need no grad)."""
    enable = getattr(backbone, "activation_checkpointing_enable", None)
    if enable is not None:  # the newer name; `gradient_checkpointing_enable` is deprecated
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        backbone.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )


def _add_lora(cfg: TrainingConfig, backbone: nn.Module) -> Any:
    """Inject LoRA into the language model's attention in place; return the PeftModel."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file

    lora = cfg.model.lora
    peft_config = LoraConfig(
        r=lora.rank,
        lora_alpha=int(lora.alpha),
        lora_dropout=lora.dropout,
        target_modules=lora_target_regex(lora.target_modules),
        bias="none",
    )
    peft_model = get_peft_model(backbone, peft_config)  # injects in place, freezes the rest
    injected = [n for n, _ in backbone.named_parameters() if "lora_" in n]
    if not injected:
        raise ConfigError(
            f"model.lora.target_modules: none of {lora.target_modules} is a module of the "
            "language model"
        )
    init = lora.init_from
    if init is None and cfg.model.init_from is not None:
        found = resolve_init_dir(cfg.model.init_from, LORA_DIR)
        init = str(found) if found is not None else None
    if init is not None:
        folder = Path(init)
        saved = json.loads((folder / "adapter_config.json").read_text())
        if int(saved.get("r", lora.rank)) != lora.rank:
            raise ConfigError(
                f"model.lora.rank: {lora.rank}, but the adapter in {folder} has rank {saved['r']}"
            )
        set_peft_model_state_dict(peft_model, load_file(str(folder / "adapter_model.safetensors")))
        log.info("LoRA initialised from %s", folder)
    return peft_model
