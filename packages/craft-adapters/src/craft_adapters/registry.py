"""Backbone adapters and their registry, keyed by transformers' `config.model_type`.

A backbone adapter knows four things about one VLM family and nothing else:

1. how to run its vision tower + projector (`encode_videos`, `encode_images`),
2. the position ids of the FULL (uncompressed) sequence (`full_positions`),
3. the `(t, h, w)` coordinates of each video token and which rows may be compressed
   (`video_layout`),
4. how to rebuild the precomputed encoder output from the kept rows (`shrink_video_output`).

The generic plumbing (slicing ids / masks / positions, generation, sessions) lives in
`craft_adapters.wrapper`, `.splice` and `.session` and is shared. A fifth backbone is one new module under
`craft_adapters.backbones` that subclasses `BackboneAdapter` and calls `register_backbone`.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

__all__ = [
    "BackboneAdapter",
    "VideoLayout",
    "get_adapter",
    "register_backbone",
    "supported_model_types",
]


@dataclass
class VideoLayout:
    """Where one video's feature rows sit and what the compressor may touch.

    Attributes:
        batch_index: row of the batch that holds the video.
        seq_index: `[n]` long, the sequence positions of the video's placeholder tokens, in the
            order of its feature rows.
        compress_rows: `[m]` long, the feature rows the compressor sees (all rows for Qwen;
            the F x P x P grid rows, not the newline, for LLaVA-OneVision).
        coords: `[m, 3]` long, `(t, h, w)` of each row in `compress_rows`.
    """

    batch_index: int
    seq_index: torch.Tensor
    compress_rows: torch.Tensor
    coords: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.seq_index.shape[0])


class BackboneAdapter:
    """How CRAFT plugs into one family of transformers VLMs. Subclass per backbone."""

    model_types: ClassVar[tuple[str, ...]] = ()
    """transformers `config.model_type` values this adapter serves."""

    uses_mrope: ClassVar[bool] = True
    """True: positions are `[3, B, L]` M-RoPE rows; False: `[B, L]` 1D positions."""

    def __init__(self, model: Any) -> None:
        self.model = model

    fixed_rows_per_video: ClassVar[int] = 0
    """Rows of each video's features that are never compressed (LLaVA-OV's newline)."""

    def attention_hooks(self, recorder: Any) -> list[Any]:
        """Hooks recording the vision tower's received attention (craft_adapters.attention);
        each backbone module defines its own."""
        raise NotImplementedError(f"{type(self).__name__} records no vision-tower attention")

    def received_attention(self, recorder: Any) -> torch.Tensor:
        """`[total compressible rows]` received attention from what the hooks recorded."""
        raise NotImplementedError(f"{type(self).__name__} records no vision-tower attention")

    @staticmethod
    def tiny_config() -> Any:
        """A tiny random transformers config of this backbone (tests, demos); each backbone
        module defines its own."""
        raise NotImplementedError

    # -- configuration -------------------------------------------------------------------------

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def text_hidden_size(self) -> int:
        return int(self.config.get_text_config().hidden_size)

    @property
    def video_token_id(self) -> int:
        return int(self.config.video_token_id)

    @property
    def pad_token_id(self) -> int:
        pad = getattr(self.config.get_text_config(), "pad_token_id", None)
        return int(pad) if pad is not None else 0

    @property
    def language_model(self) -> torch.nn.Module:
        """The decoder that receives `inputs_embeds` and the position ids."""
        return self.model.model.language_model  # type: ignore[no-any-return]

    # -- per-backbone hooks --------------------------------------------------------------------

    def encode_videos(self, inputs: dict[str, Any]) -> tuple[Any, list[torch.Tensor]]:
        """Run the vision tower + projector: `(encoder_output, [per-video [n_v, D] rows])`."""
        raise NotImplementedError

    def encode_images(self, inputs: dict[str, Any]) -> Any | None:
        """Encoder output of the images in `inputs` (kept uncompressed), or None."""
        return None

    def full_positions(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions of the full sequence and the `[B, 1]` delta `max_position + 1 - length`."""
        raise NotImplementedError

    def video_layout(
        self, inputs: dict[str, Any], positions: torch.Tensor, features: list[torch.Tensor]
    ) -> list[VideoLayout]:
        """One `VideoLayout` per video, in the order of `features`."""
        raise NotImplementedError

    def shrink_video_output(
        self,
        output: Any,
        kept_rows: list[torch.Tensor],
        new_features: list[torch.Tensor],
        assignments: list[torch.Tensor],
    ) -> Any:
        """The encoder output to pass as `mm_encoder_outputs["video"]` after compression.

        Args:
            output: what `encode_videos` returned first.
            kept_rows: per video, the surviving feature rows (ascending, into the original rows).
            new_features: per video, `[n_kept, D]` rows to scatter into the placeholders.
            assignments: per video, `[n]` long: for every original row, the kept row (index into
                `kept_rows`) it ended up in.
        """
        raise NotImplementedError

    def forward_extra_kwargs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments to pass through to the HF model besides ids / mask / positions."""
        return {}

    def set_rope_deltas(self, deltas: torch.Tensor | None) -> None:
        """Make a later `forward` without `position_ids` continue from the right place."""
        if hasattr(self.model.model, "rope_deltas"):
            self.model.model.rope_deltas = deltas


_REGISTRY: dict[str, type[BackboneAdapter]] = {}
_loaded = False


def register_backbone(cls: type[BackboneAdapter]) -> type[BackboneAdapter]:
    """Class decorator: register `cls` for each of its `model_types`."""
    if not (isinstance(cls, type) and issubclass(cls, BackboneAdapter)):
        raise TypeError(f"register_backbone takes a BackboneAdapter subclass, got {cls!r}")
    types = getattr(cls, "model_types", None)
    if not isinstance(types, (tuple, list)) or not all(isinstance(t, str) for t in types):
        raise TypeError(f"{cls.__name__}.model_types must be a tuple of str, got {types!r}")
    if not cls.model_types:
        raise ValueError(f"{cls.__name__}.model_types is empty")
    for mt in cls.model_types:
        _REGISTRY[mt] = cls
    return cls


def _load_builtins() -> None:
    global _loaded
    if not _loaded:
        # every public module of backbones/ registers itself: a new backbone is one file
        # (imported by name: backbones import this module, not the reverse)
        package = importlib.import_module("craft_adapters.backbones")
        for info in pkgutil.iter_modules(package.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"craft_adapters.backbones.{info.name}")
        _loaded = True


def supported_model_types() -> list[str]:
    """The transformers `config.model_type` values that `wrap` accepts, sorted."""
    _load_builtins()
    return sorted(_REGISTRY)


def adapter_class(model_type: str) -> type[BackboneAdapter]:
    """The adapter class registered for `model_type`; KeyError when there is none."""
    _load_builtins()
    return _REGISTRY[model_type]


def get_adapter(model: Any) -> BackboneAdapter:
    """The adapter for `model` (chosen by `model.config.model_type`).

    Raises:
        ValueError: the model type is not supported, naming it and the supported ones.
    """
    _load_builtins()
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in _REGISTRY:
        raise ValueError(
            f"unsupported model_type {model_type!r} ({type(model).__name__}); craft-adapters "
            f"supports {sorted(_REGISTRY)}"
        )
    return _REGISTRY[model_type](model)
