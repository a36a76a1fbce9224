"""Backbone adapters and their registry, keyed by transformers' `config.model_type`.

A backbone's module under `craft_adapters.backbones` is its one home: its adapter carries
everything the workspace needs to know about that VLM family:

1. how to run its vision tower + projector (`encode_videos`, `encode_images`) and which
   processor output holds the video (`video_pixels_key`, `encoder_output_key`),
2. the position ids of the FULL (uncompressed) sequence (`full_positions`),
3. the `(t, h, w)` coordinates of each video token and which rows may be compressed
   (`video_layout`),
4. how to rebuild the precomputed encoder output from the kept rows (`shrink_video_output`),
5. the vision tower's received attention (`attention_hooks`, `received_attention`),
6. how `craft_adapters.build_inputs` calls its processor (`input_rules`),
7. its tiny random model and processor for tests (`tiny_config`, `tiny_processor`),
8. the real-size architectures `craft-eval efficiency` builds (`reference_archs`: JSON files
   in `backbones/archs/`),
9. the lmms-eval classes the craft-eval plugin extends (`lmms_classes`).

The generic plumbing (slicing ids / masks / positions, generation, sessions) lives in
`craft_adapters.wrapper`, `.splice` and `.session` and is shared. A new backbone is one new
module under `craft_adapters.backbones` that subclasses `BackboneAdapter` and is decorated
with `register_backbone` (PEFT-style: the registry is keyed by `config.model_type`).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, ClassVar

import torch

__all__ = [
    "BackboneAdapter",
    "InputRules",
    "LmmsClasses",
    "VideoLayout",
    "adapter_class",
    "get_adapter",
    "input_rules",
    "load_reference_arch",
    "processor_adapter",
    "reference_archs",
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


@dataclass(frozen=True)
class InputRules:
    """How `craft_adapters.build_inputs` hands frames to this backbone's processor.

    Attributes:
        processors: class names of the backbone's HF processors; a processor belongs to the
            first backbone that names a class of its MRO (most derived first).
        video_metadata: frames go with a `VideoMetadata` each (timestamps `k / fps`; Qwen2.5-VL
            reads `second_per_grid_ts` from it).
        frame_bounds: frames may be resized per frame with qwen-vl-utils' pixel bounds
            (`min_pixels` / `max_pixels` / `total_pixels`); False: the processor resizes to
            its fixed input size and refuses bounds.
        lmms_pixels: lmms-eval's per-frame bounds for this backbone, applied (without
            `min_pixels`: no up-scaling) when the caller gives none; None: without bounds
            the processor resizes the frames itself.
        one_call_per_length: videos of different lengths do not stack in one processor call
            (`pixel_values_videos` is `[B, F, C, H, W]`): one call per video.
    """

    processors: tuple[str, ...] = ()
    video_metadata: bool = False
    frame_bounds: bool = False
    lmms_pixels: dict[str, int | None] | None = None
    one_call_per_length: bool = False


@dataclass(frozen=True)
class LmmsClasses:
    """The lmms-eval 0.7.3 classes the craft-eval plugin extends for this backbone.

    `simple` / `chat`: `"module:Class"` under `lmms_eval.models` (None: none extended); the
    plugin registers `craft_<model_type>` with a class `Craft<Class>` (`Craft<Class>Chat`).
    """

    lmms_id: str
    simple: str | None = None
    chat: str | None = None


class BackboneAdapter:
    """How CRAFT plugs into one family of transformers VLMs. Subclass per backbone."""

    model_types: ClassVar[tuple[str, ...]] = ()
    """transformers `config.model_type` values this adapter serves."""

    video_pixels_key: ClassVar[str] = "pixel_values_videos"
    """The processor output holding the video frames (InternVL's processor merges them into
    `pixel_values`)."""

    encoder_output_key: ClassVar[str] = "video"
    """The `mm_encoder_outputs` entry transformers reads the video rows from."""

    input_rules: ClassVar[InputRules] = InputRules()
    """How `build_inputs` calls this backbone's processor."""

    reference_archs: ClassVar[tuple[tuple[str, ...], ...]] = ()
    """Real-size architectures of this backbone (`craft-eval efficiency --arch`): per
    architecture `(key, *aliases)`; its public config values are `backbones/archs/<key>.json`."""

    lmms_classes: ClassVar[LmmsClasses | None] = None
    """The lmms-eval classes the craft-eval plugin extends (None: no plugin model)."""

    attention_output_gate: ClassVar[bool] = False
    """The language model's attention gates its output (a query projection twice as wide):
    counted by craft-eval's analytical prefill FLOPs."""

    uses_mrope: ClassVar[bool] = True
    """True: positions are `[3, B, L]` M-RoPE rows; False: `[B, L]` 1D positions."""

    original_rule_differs: ClassVar[bool] = False
    """True where the installed transformers' positions differ from the backbone's original
    code (the rule its checkpoints were trained with, and vLLM's): then `full_positions`
    follows `position_rule`, and a wrap with `positions="original"` never passes through."""

    def __init__(self, model: Any, position_rule: str = "transformers") -> None:
        self.model = model
        self.position_rule = check_position_rule(position_rule)

    fixed_rows_per_video: ClassVar[int] = 0
    """Rows of each video's features that are never compressed (LLaVA-OV's newline)."""

    saves_compressed_videos: ClassVar[bool] = False
    """`CraftModel.compress_videos` works (the adapter defines `video_grids`)."""

    def video_grids(
        self, inputs: dict[str, Any]
    ) -> list[tuple[tuple[int, int, int], dict[str, Any]]]:
        """Per video of `inputs`: the `(T, H, W)` grid its compressible rows fill row-major,
        and the metadata a saved `CompressedVideo` carries besides the backbone and budget
        (Qwen2.5-VL: `second_per_grid`). Only where `saves_compressed_videos`."""
        raise NotImplementedError(f"{type(self).__name__} does not save compressed videos")

    @classmethod
    def expand_video_prompt(cls, processor: Any, text: str, num_frames: int) -> str:
        """`text` with its one video placeholder expanded to the rows a video of `num_frames`
        frames gives, as the processor would: `build_inputs` tokenizes a batch itself when
        `input_rules.one_call_per_length` (videos of different lengths)."""
        raise NotImplementedError(f"{cls.__name__} does not expand its video placeholder")

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

    @staticmethod
    def tiny_processor() -> Any:
        """The in-memory processor matching `tiny_config` (byte-level tokenizer, the
        backbone's own image / video processors, its chat template)."""
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

    def video_mask(self, inputs: dict[str, Any]) -> torch.Tensor:
        """`[B, L]` bool: the placeholders of the videos' rows (default: `video_token_id`;
        a backbone whose videos share the image token narrows it)."""
        return inputs["input_ids"] == self.video_token_id  # type: ignore[no-any-return]

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
        """Positions of the full sequence and the `[B, 1]` delta `max_position + 1 - length`.
        Default (1-D RoPE, `uses_mrope = False`): `positions_1d`."""
        if self.uses_mrope:
            raise NotImplementedError(f"{type(self).__name__} must compute its M-RoPE positions")
        return positions_1d(inputs)

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
        """The encoder output to pass as `mm_encoder_outputs[encoder_output_key]` after
        compression. Default: one `[1, total kept, D]` `pooler_output` holding every video's
        rows (transformers flattens it and checks only the element count: LLaVA-OV, InternVL).

        Args:
            output: what `encode_videos` returned first.
            kept_rows: per video, the surviving feature rows (ascending, into the original rows).
            new_features: per video, `[n_kept, D]` rows to scatter into the placeholders.
            assignments: per video, `[n]` long: for every original row, the kept row (index into
                `kept_rows`) it ended up in.
        """
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        return BaseModelOutputWithPooling(pooler_output=torch.cat(new_features, dim=0).unsqueeze(0))

    def deepstack_rows(self, output: Any, video: int) -> torch.Tensor | None:
        """The rows a saved `CompressedVideo` of video `video` carries beside its kept rows
        (its `deepstack` field, `[K, levels * D]`), from `output` (what
        `shrink_video_output` returned). Default: None (no such rows). Qwen3-VL: the kept
        tokens' deepstack rows, level after level."""
        return None

    def route_lm_visual_rows(self, lm: Any, select: Callable[..., Any]) -> Callable[[], None]:
        """Send the visual rows this backbone adds INSIDE the language model `lm` through
        `select(hidden [1, S', D], mask [1, S], rows [V, D]) -> (mask, rows)`, so a stage that
        drops positions inside the LM (`InModelDrop`) keeps them aligned; returns the undo.
        Default: the backbone adds none, nothing to route. Qwen3-VL: its deepstack rows."""
        return lambda: None

    def forward_extra_kwargs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments to pass through to the HF model besides ids / mask / positions."""
        return {}

    def set_rope_deltas(self, deltas: torch.Tensor | None) -> None:
        """Make a later `forward` without `position_ids` continue from the right place."""
        if hasattr(self.model.model, "rope_deltas"):
            self.model.model.rope_deltas = deltas


def positions_1d(inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """`full_positions` of a backbone with 1-D RoPE (LLaVA-OneVision, InternVL): `[B, L]`
    `attention_mask.cumsum(-1) - 1` (0 on padding) and a zero `[B, 1]` delta."""
    ids = inputs["input_ids"]
    mask = inputs.get("attention_mask")
    if mask is None:
        mask = torch.ones_like(ids)
    pos = mask.long().cumsum(-1) - 1
    pos = pos.masked_fill(mask == 0, 0)
    deltas = torch.zeros(ids.shape[0], 1, dtype=torch.long, device=ids.device)
    return pos, deltas


def frame_grid_coords(n: int, side: int, device: torch.device) -> torch.Tensor:
    """`[n, 3]` long `(frame, row, column)` of `n` tokens laid out frame by frame, each frame
    a row-major `side x side` grid (LLaVA-OV's pooled grid, InternVL's shuffled tile)."""
    idx = torch.arange(n, device=device)
    per_frame = side * side
    return torch.stack([idx // per_frame, (idx % per_frame) // side, idx % side], dim=-1)


_REGISTRY: dict[str, type[BackboneAdapter]] = {}
_loaded = False


POSITION_RULES = ("transformers", "original")
"""`wrap(positions=...)`: "transformers" (the installed transformers' `get_rope_index`: a wrap
with no compressor equals the unwrapped model) or "original" (the backbone's own code, as its
checkpoints were trained and as vLLM serves them). They differ only for Qwen2.5-VL on
transformers 5.x (`original_rule_differs`), where the text after a video starts at
`start + max(h, w)` instead of `max(video positions) + 1`."""


def check_position_rule(rule: Any) -> str:
    """`rule` if it is one of `POSITION_RULES`, else a ValueError naming `positions`."""
    if not isinstance(rule, str) or rule not in POSITION_RULES:
        raise ValueError(f"positions must be one of {', '.join(POSITION_RULES)}; got {rule!r}")
    return rule


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


def get_adapter(model: Any, position_rule: str = "transformers") -> BackboneAdapter:
    """The adapter for `model` (chosen by `model.config.model_type`), following
    `position_rule` (`POSITION_RULES`).

    Raises:
        ValueError: the model type is not supported, naming it and the supported ones; an
            unknown position rule.
    """
    _load_builtins()
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in _REGISTRY:
        raise ValueError(
            f"unsupported model_type {model_type!r} ({type(model).__name__}); craft-adapters "
            f"supports {sorted(_REGISTRY)}"
        )
    return _REGISTRY[model_type](model, position_rule)


def adapter_classes() -> list[type[BackboneAdapter]]:
    """Every registered adapter class once, in the order of `supported_model_types()`."""
    _load_builtins()
    return list(dict.fromkeys(_REGISTRY[mt] for mt in sorted(_REGISTRY)))


def processor_adapter(processor: Any) -> type[BackboneAdapter] | None:
    """The adapter class of the backbone `processor` belongs to (by the processor classes
    its `input_rules` name, most derived first); None for a processor no backbone names."""
    claims = {name: cls for cls in adapter_classes() for name in cls.input_rules.processors}
    for klass in type(processor).__mro__:
        if klass.__name__ in claims:
            return claims[klass.__name__]
    return None


def input_rules(processor: Any) -> InputRules:
    """The `InputRules` of the backbone `processor` belongs to; a processor no backbone
    names gets the plain rules (no metadata, no bounds)."""
    cls = processor_adapter(processor)
    return cls.input_rules if cls is not None else InputRules()


def reference_archs() -> dict[str, tuple[str, ...]]:
    """Every backbone's real-size architectures: key -> aliases (lower case)."""
    return {arch[0]: arch[1:] for cls in adapter_classes() for arch in cls.reference_archs}


def load_reference_arch(name: str) -> dict[str, Any]:
    """The public config values of architecture `name` (a key or alias of
    `reference_archs()`, any case), with `_key` set to its key.

    Raises:
        KeyError: no backbone ships `name`, naming the known keys.
    """
    archs = reference_archs()
    wanted = name.lower()
    key = next((k for k, aliases in archs.items() if wanted == k or wanted in aliases), None)
    if key is None:
        raise KeyError(f"unknown architecture {name!r}; known: {', '.join(archs)}")
    path = resources.files("craft_adapters.backbones").joinpath(f"archs/{key}.json")
    arch: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    arch["_key"] = key
    return arch
