"""The base every CRAFT variant shares: the model's `__init__` and the processor's count.

`CraftModel` (mixed in before vLLM's model class) checks the settings before any weight is
built (a bad setting fails in a second, not after loading the backbone), runs vLLM's own
`__init__`, then loads the CRAFT checkpoint once the language model's width is known.
`CraftProcessor` (mixed in before vLLM's multimodal processor) gives the number of
placeholders a video reserves, from craft-core's budget (`CraftOptions.kept`). Every video of
one forward is compressed in one call (`CraftModel.craft_compress`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.processing import PromptReplacement

from craft_core import CompressionResult, compress_many
from craft_vllm.options import CraftConfigError, CraftOptions, load_compressor, read_options
from craft_vllm.payload import COUNT


def check_settings(vllm_config: Any, architecture: str) -> CraftOptions:
    """The checked options of `architecture`; refuse `--video-pruning-rate` and a ratio that
    leaves no token even for the largest video the server accepts."""
    model_config = vllm_config.model_config
    options = read_options(model_config.hf_config, architecture)
    mm_config = model_config.get_multimodal_config()
    if mm_config.video_pruning_rate:
        raise ValueError(
            f"--video-pruning-rate {mm_config.video_pruning_rate} cannot be combined with "
            f"{architecture}: CRAFT already sets the video token count (craft_ratio)"
        )
    info = MULTIMODAL_REGISTRY.create_processor(model_config).info
    largest = info.get_max_video_tokens(model_config.max_model_len, {"video": 1})
    try:
        options.kept(largest)
    except CraftConfigError as error:
        raise CraftConfigError(
            f"{error} (the largest video this server accepts has {largest} tokens)"
        ) from None
    return options


def attach_compressor(model: Any, vllm_config: Any) -> None:
    """Load `model.craft_options.checkpoint` into `model.craft`, checked against the LLM width.

    A plain attribute, not a submodule: vLLM's loader must not look for these weights in the
    backbone's checkpoint (the backbone's files are used as they are).
    """
    hidden = vllm_config.model_config.hf_config.get_text_config().hidden_size
    device = vllm_config.device_config.device
    compressor = load_compressor(model.craft_options, hidden, device=device)
    object.__setattr__(model, "craft", compressor)
    model.is_multimodal_pruning_enabled = True  # embed_multimodal post-processes items


class CraftModel:
    """Mixin of every CRAFT model class: `class CraftX(CraftModel, XForConditionalGeneration)`.

    Subclasses set `architecture` (the name users put in `--hf-overrides`).
    """

    architecture: ClassVar[str]
    craft_compression = True  # read by the runner patch in plugin.py

    # vLLM reads the signature: `vllm_config` and `prefix` by name (it always passes both)
    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        self.craft_options = check_settings(vllm_config, self.architecture)  # before any weight
        super().__init__(vllm_config=vllm_config, prefix=prefix)  # type: ignore[call-arg]
        attach_compressor(self, vllm_config)

    def craft_compress(
        self, features: list[torch.Tensor], coords: list[torch.Tensor]
    ) -> list[CompressionResult]:
        """The raw videos of one forward, compressed in ONE call of craft-core's batched
        entry (`craft_core.compress_many`, each video the same tokens and rows as alone).

        Args:
            features: B tensors `[N_b, D]` (one video's rows each).
            coords: B tensors `[N_b, 3]`, each row's `(t, h, w)`.

        Returns:
            B results: `floor(N_b / ratio)` kept rows each.

        Raises:
            CraftConfigError: a video too short for the ratio (refused, never clamped).
        """
        options: CraftOptions = self.craft_options  # type: ignore[attr-defined]
        for rows in features:
            options.kept(int(rows.shape[0]))
        if not features:
            return []
        craft = self.craft  # type: ignore[attr-defined]
        return compress_many(craft, features, coords, options.budget)


class CraftProcessor:
    """Mixin of every CRAFT multimodal processor (before vLLM's processor class): vLLM's own
    prompt updates, with each video's placeholder made for `floor(N / ratio)` kept tokens.

    Subclasses set `architecture` and write the placeholder (`craft_placeholder`). The ratio
    is read from the served config (the API server's copy of `--hf-overrides`), once per
    processor (`craft_options`).
    """

    architecture: ClassVar[str]
    info: Any
    _craft_options: CraftOptions | None = None

    @property
    def craft_options(self) -> CraftOptions:
        """The served config's checked options, read on first use and kept."""
        if self._craft_options is None:
            self._craft_options = read_options(self.info.get_hf_config(), self.architecture)
        return self._craft_options

    def _get_prompt_updates(
        self, mm_items: Any, hf_processor_mm_kwargs: Mapping[str, Any], out_mm_kwargs: Any
    ) -> Sequence[PromptReplacement]:
        updates = super()._get_prompt_updates(  # type: ignore[misc]
            mm_items, hf_processor_mm_kwargs, out_mm_kwargs
        )
        options = self.craft_options

        def video(item_idx: int) -> Any:
            item = out_mm_kwargs["video"][item_idx]
            if COUNT in item:  # a compressed video (precompressed.py): its own count
                return self.craft_placeholder(item, int(item[COUNT].data))
            n = self.craft_video_tokens(item, hf_processor_mm_kwargs)
            return self.craft_placeholder(item, options.kept(n))

        return [
            PromptReplacement(modality="video", target=u.target, replacement=video)
            if u.modality == "video"
            else u
            for u in updates
        ]

    def craft_video_tokens(self, item: Any, hf_processor_mm_kwargs: Mapping[str, Any]) -> int:
        """N, the compressible tokens of one video (Qwen: its merged `t x h x w` grid)."""
        merge = self.info.get_image_processor(**hf_processor_mm_kwargs).merge_size
        t, h, w = (int(x) for x in item["video_grid_thw"].data.tolist())
        return t * h * w // (merge * merge)

    def craft_placeholder(self, item: Any, kept: int) -> Any:
        """The prompt tokens of one video (`item`: its processed fields) keeping `kept`."""
        raise NotImplementedError
