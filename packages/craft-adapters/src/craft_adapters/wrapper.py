"""`wrap(model, compressor, ratio=...)`: a transformers VLM that compresses its video tokens.

The route (see `docs/backbones.md`, checked on all four backbones):

1. run the vision tower + projector once (`get_video_features`),
2. compute the position ids of the FULL sequence with the backbone's own function,
3. compress each video's rows, keep every text token, slice `input_ids`, `attention_mask`,
   the position ids (and `labels`, `mm_token_type_ids`) to the surviving positions,
4. call the HF model / `generate` with the sliced pieces and `mm_encoder_outputs`, so
   transformers scatters the kept rows (and Qwen3-VL's deepstack rows) itself.

This module holds `CraftModel`, which runs the route, and `wrap`. The compressor call and
the slicing of step 3 are in `splice.py`, the multi-turn `VideoSession` in `session.py`, the
report types in `report.py`; they are re-exported here so `craft_adapters.wrapper` still
offers every public name.

A 2-D attention mask always reaches the language model (a forward pre-hook adds an all-ones
mask if some caller dropped it): without one, gapped position ids are read as packed
sequences and attention silently becomes block-diagonal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from craft_adapters.attention import encode_videos_with_attention
from craft_adapters.compressed import CompressedVideo, checkpoint_sha256
from craft_adapters.in_model import refuse_compress_once
from craft_adapters.registry import BackboneAdapter, get_adapter
from craft_adapters.report import CompressionReport, VideoCompression
from craft_adapters.session import VideoSession
from craft_adapters.splice import PER_TOKEN_KEYS, Prepared, compress_videos, splice_sequence
from craft_core import TokenBudget, budget_of
from craft_core.checks import check_has_data, check_index_tensor

__all__ = ["CompressionReport", "CraftModel", "VideoCompression", "VideoSession", "wrap"]

# Processor outputs that describe pixels: consumed here, never passed on after compression.
_VISION_KEYS = (
    "pixel_values_videos",
    "video_grid_thw",
    "second_per_grid_ts",
    "pixel_values",
    "image_grid_thw",
    "image_sizes",
    "image_sizes_videos",
    "batch_num_images",
    "video_metadata",
)


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device) for v in value)
    return value


def _move_inputs(inputs: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Every tensor of `inputs` on `device`; a meta tensor (no data) is named, not copied."""
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor):
            check_has_data(key, value)
    return {k: _to_device(v, device) for k, v in inputs.items()}


def _compressor_hidden_size(compressor: Any) -> int | None:
    for obj in (compressor, getattr(compressor, "config", None)):
        size = getattr(obj, "hidden_size", None)
        if isinstance(size, int):
            return size
    return None


class CraftModel(torch.nn.Module):
    """A transformers VLM whose video tokens are compressed before the language model.

    Build it with `craft_adapters.wrap`. Call it like the HF model (same keyword arguments,
    `labels` included), use `generate` like HF's, or `encode_video` + `session.ask` for
    multi-turn questions on one video. `last_compression` says what the last call did.

    Attributes:
        model: the wrapped HF model (unchanged; the wrapper holds no state in it).
        compressor: the compressor callable, or None (no compression).
        adapter: the backbone adapter chosen by `model.config.model_type`.
        last_compression: `CompressionReport` of the last forward / generate / encode_video
            (None after a call that had no video or no compressor).
    """

    def __init__(
        self,
        model: Any,
        compressor: Callable[..., Any] | None = None,
        *,
        ratio: float | None = None,
        threshold: float | None = None,
        min_tokens: int | None = None,
        budget: TokenBudget | None = None,
        positions: str = "transformers",
    ) -> None:
        super().__init__()
        if compressor is not None and not callable(compressor):
            raise TypeError(
                f"compressor must be a callable (features, coords, **budget) -> "
                f"CompressionResult, or None; got {type(compressor).__name__}"
            )
        self.adapter: BackboneAdapter = get_adapter(model, positions)
        self.model = model
        self.compressor = compressor
        if compressor is not None:
            size = _compressor_hidden_size(compressor)
            llm = self.adapter.text_hidden_size
            if size is not None and size != llm:
                raise ValueError(
                    f"compressor hidden size {size} != language model hidden size {llm} of "
                    f"{model.config.model_type}: build the compressor with hidden_size={llm}"
                )
        self.token_budget: TokenBudget | None = None
        self.set_budget(ratio, threshold, min_tokens, budget=budget)
        self.last_compression: CompressionReport | None = None

    # -- budget --------------------------------------------------------------------------------

    def set_budget(
        self,
        ratio: float | None = None,
        threshold: float | None = None,
        min_tokens: int | None = None,
        *,
        budget: TokenBudget | None = None,
    ) -> None:
        """Set the token budget: a `craft_core.TokenBudget`, or its fields (`ratio`,
        `threshold`, `min_tokens`, checked by `TokenBudget`'s rules). With no compressor the
        budget may be left empty.
        """
        if budget is None and self.compressor is None and ratio is None and threshold is None:
            self.token_budget = None
            return
        # parsed once here (the user's spelling) or kept as given; passed down unopened
        self.token_budget = budget_of(
            budget, ratio=ratio, threshold=threshold, min_tokens=min_tokens
        )

    @property
    def budget(self) -> dict[str, Any]:
        """The current budget, e.g. `{"ratio": 8.0, "threshold": None, "min_tokens": None}`."""
        b = self.token_budget
        if b is None:
            return {}
        return {"ratio": b.ratio, "threshold": b.threshold, "min_tokens": b.min_tokens}

    # -- helpers -------------------------------------------------------------------------------

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def device(self) -> torch.device:
        return self.model.device  # type: ignore[no-any-return]

    def _has_video(self, inputs: dict[str, Any]) -> bool:
        return inputs.get(self.adapter.video_pixels_key) is not None

    def _passthrough(self, inputs: dict[str, Any]) -> bool:
        """True when the HF model runs unchanged (no compressor or no video, and the
        installed transformers' positions are the ones asked for)."""
        if not self._has_video(inputs):
            return True
        if self.adapter.original_rule_differs and self.adapter.position_rule == "original":
            return False
        return self.compressor is None and not isinstance(
            inputs.get(self.adapter.video_pixels_key), (list, tuple)
        )

    @contextlib.contextmanager
    def _mask_guard(self) -> Iterator[None]:
        """Make sure a 2-D attention mask reaches the language model while compressed."""

        def hook(_module: Any, args: Any, kwargs: dict[str, Any]) -> Any:
            if kwargs.get("attention_mask") is None and kwargs.get("position_ids") is not None:
                emb = kwargs.get("inputs_embeds")
                if emb is None:
                    emb = args[0] if args else None
                if isinstance(emb, torch.Tensor):
                    cache = kwargs.get("past_key_values")
                    past = int(cache.get_seq_length()) if cache is not None else 0
                    kwargs["attention_mask"] = torch.ones(
                        emb.shape[0], past + emb.shape[1], dtype=torch.long, device=emb.device
                    )
            return args, kwargs

        handle = self.adapter.language_model.register_forward_pre_hook(
            hook, with_kwargs=True, prepend=True
        )
        try:
            yield
        finally:
            handle.remove()

    def _check_placeholders(self, inputs: dict[str, Any], features: list[torch.Tensor]) -> None:
        n_text = int(self.adapter.video_mask(inputs).sum())
        n_feat = sum(int(f.shape[0]) for f in features)
        if n_text != n_feat:
            raise ValueError(
                f"mismatched video placeholders: input_ids hold {n_text} video tokens (id "
                f"{self.adapter.video_token_id}) but the vision tower produced {n_feat} rows for "
                f"{len(features)} video(s); the prompt and pixel_values_videos / video_grid_thw "
                "must come from the same processor call"
            )

    # -- the compression step ------------------------------------------------------------------

    def _prepare(self, inputs: dict[str, Any]) -> Prepared:
        """Encode, compress and slice one batch of processor outputs."""
        ids = inputs.get("input_ids")
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            raise ValueError("input_ids must be a [batch, length] tensor (processor output)")
        check_index_tensor("input_ids", ids, dim=2)
        if inputs.get("position_ids") is not None:
            raise ValueError(
                "position_ids cannot be given with a video: craft-adapters computes them on the "
                "full sequence and slices them"
            )
        if inputs.get("inputs_embeds") is not None:
            raise ValueError("inputs_embeds cannot be given with a video; pass input_ids")
        adapter = self.adapter
        device = self.model.device
        inputs = _move_inputs(inputs, device)
        ids = inputs["input_ids"]
        mask = inputs.get("attention_mask")
        if mask is None:
            mask = torch.ones_like(ids)
            inputs = {**inputs, "attention_mask": mask}
        enc_video, features, attention = encode_videos_with_attention(
            adapter, inputs, self.compressor
        )
        self._check_placeholders(inputs, features)
        positions, _ = adapter.full_positions(inputs)
        layouts = adapter.video_layout(inputs, positions, features)

        keep = mask.bool().clone()
        kept_rows_all, new_feats_all, assigns_all, reports = [], [], [], []
        # every video of the batch in ONE compressor call (craft_core.compress_many)
        compressed = compress_videos(
            self.compressor, self.token_budget, features, layouts, attention
        )
        for feats, layout, (kept_rows, new_feats, assign, rep) in zip(
            features, layouts, compressed
        ):
            dropped = torch.ones(feats.shape[0], dtype=torch.bool, device=feats.device)
            dropped[kept_rows] = False
            keep[layout.batch_index, layout.seq_index[dropped]] = False
            kept_rows_all.append(kept_rows)
            new_feats_all.append(new_feats)
            assigns_all.append(assign)
            reports.append(rep)
        enc = {
            adapter.encoder_output_key: adapter.shrink_video_output(
                enc_video, kept_rows_all, new_feats_all, assigns_all
            )
        }
        enc_image = adapter.encode_images(inputs)
        if enc_image is not None:
            enc["image"] = enc_image
        prep = splice_sequence(inputs, positions, keep, enc, reports, adapter.pad_token_id)
        prep.video_rows = list(zip(kept_rows_all, new_feats_all))
        return prep

    @staticmethod
    def _split(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(processor outputs, everything else)."""
        own = {"input_ids", "attention_mask", "labels", "position_ids", "inputs_embeds"}
        own.update(_VISION_KEYS)
        own.update(PER_TOKEN_KEYS)
        inputs = {k: v for k, v in kwargs.items() if k in own}
        rest = {k: v for k, v in kwargs.items() if k not in own}
        return inputs, rest

    @staticmethod
    def _hf_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in kwargs.items() if k != "video_metadata"}

    # -- public calls --------------------------------------------------------------------------

    def forward(self, **kwargs: Any) -> Any:
        """Same keyword arguments and output as the HF model's forward.

        With a video and a compressor, the logits (and `labels`, and the loss) are over the
        COMPRESSED sequence: `last_compression` and `compressed_index(b)` say which original
        positions survived. Gradients flow through the compressor when grad is enabled.
        """
        inputs, rest = self._split(kwargs)
        if self._passthrough(inputs):
            self.last_compression = None
            return self.model(**self._hf_kwargs(inputs), **rest)
        prep = self._prepare(inputs)
        out = self._compressed_call(prep, rest)
        self.adapter.set_rope_deltas(prep.rope_deltas)
        return out

    def _compressed_call(self, prep: Any, rest: dict[str, Any]) -> Any:
        """The HF model on the compressed sequence of `prep` (the report kept for the
        caller); `rest` are the caller's other keywords (labels, use_cache, ...)."""
        self._last_kept = prep.kept
        self.last_compression = prep.report
        with self._mask_guard():
            return self.model(
                input_ids=prep.input_ids,
                attention_mask=prep.attention_mask,
                position_ids=prep.position_ids,
                mm_encoder_outputs=prep.encoder_outputs,
                **prep.extra,
                **rest,
            )

    def compressed_index(self, batch_index: int = 0) -> torch.Tensor:
        """Original sequence positions kept by the last compressed call, for one batch row."""
        kept = getattr(self, "_last_kept", None)
        if kept is None:
            raise RuntimeError("no compressed call has run yet")
        return kept[batch_index]  # type: ignore[no-any-return]

    @torch.no_grad()
    def compress_videos(self, **inputs: Any) -> list[CompressedVideo]:
        """Each video of a processor batch as CRAFT leaves it, to save or serve later
        (`craft_adapters.save_compressed_video`; craft-vllm serves them), on a backbone
        whose adapter sets `saves_compressed_videos` (the Qwen backbones,
        LLaVA-OneVision, InternVL).

        -> one `CompressedVideo` per video: kept rows `[K, D]` (LLaVA-OneVision: the grid's
        rows only, not the newline row that the model adds after them), the rows the adapter's
        `deepstack_rows` gives (Qwen3-VL's deepstack rows `[K, levels * D]`), their original
        `(t, h, w)`
        in the merged grid (LLaVA-OneVision, InternVL: frame, row, column of a frame's grid), the grid, and metadata (model_type, hidden_size, craft_sha256:
        what a server checks with `check_made_with`; budget, seconds per grid step).
        """
        refuse_compress_once(self, "compress_videos")
        adapter = self.adapter
        if self.compressor is None or not adapter.saves_compressed_videos:
            raise ValueError(
                "compress_videos needs a compressor and a backbone whose adapter saves "
                f"compressed videos (saves_compressed_videos); got {type(adapter).__name__}, "
                f"compressor {type(self.compressor).__name__}"
            )
        inputs = self._split(inputs)[0]
        prep = self._prepare(inputs)
        self.last_compression = prep.report
        out = []
        made: dict[str, Any] = {  # what a server checks before serving it (check_made_with)
            "model_type": self.model.config.model_type,
            "hidden_size": int(self.model.config.get_text_config().hidden_size),
        }
        if isinstance(self.compressor, torch.nn.Module):  # a module's weights (not a stub's)
            made["craft_sha256"] = checkpoint_sha256(self.compressor)
        encoded = prep.encoder_outputs[adapter.encoder_output_key]  # shrink_video_output's
        fixed = adapter.fixed_rows_per_video  # rows the server adds itself (LLaVA-OV's newline)
        grids = adapter.video_grids(inputs)
        for i, ((rows, feats), (grid, extra)) in enumerate(zip(prep.video_rows, grids)):
            k = int(rows.shape[0]) - fixed  # the fixed rows are the last ones (largest index)
            coords = torch.stack(torch.unravel_index(rows[:k].cpu(), grid), dim=1)
            meta: dict[str, Any] = {**made, **extra}
            if self.token_budget is not None:
                meta["budget"] = self.token_budget.describe()
            stack = adapter.deepstack_rows(encoded, i)  # Qwen3-VL's; None elsewhere
            stack = stack.detach().cpu() if stack is not None else None
            video = CompressedVideo(feats[:k].detach().cpu(), coords, grid, meta, stack)
            out.append(video)
        return out

    @torch.no_grad()
    def generate(self, **kwargs: Any) -> Any:
        """HF `generate` on the compressed sequence.

        Returns what HF returns, with the ORIGINAL prompt in front of the new tokens (so
        `out[:, inputs["input_ids"].shape[1]:]` are the new tokens, as with the plain model).
        """
        inputs, rest = self._split(kwargs)
        if self._passthrough(inputs):
            self.last_compression = None
            return self.model.generate(**self._hf_kwargs(inputs), **rest)
        inputs.pop("labels", None)
        prep = self._prepare(inputs)
        self._last_kept = prep.kept
        self.last_compression = prep.report
        with self._mask_guard():
            out = self.model.generate(
                input_ids=prep.input_ids,
                attention_mask=prep.attention_mask,
                position_ids=prep.position_ids,
                mm_encoder_outputs=prep.encoder_outputs,
                **prep.extra,
                **rest,
            )
        self.adapter.set_rope_deltas(prep.rope_deltas)
        return self._restore_prompt(out, inputs["input_ids"], prep.input_ids.shape[1])

    @staticmethod
    def _restore_prompt(out: Any, original: torch.Tensor, compressed_len: int) -> Any:
        seqs = out if isinstance(out, torch.Tensor) else out.sequences
        full = torch.cat([original.to(seqs.device), seqs[:, compressed_len:]], dim=1)
        if isinstance(out, torch.Tensor):
            return full
        out.sequences = full
        return out

    @torch.no_grad()
    def encode_video(self, **kwargs: Any) -> VideoSession:
        """Compress the video and prefill the prompt prefix that holds it, ONCE.

        `kwargs` are processor outputs of a one-row prompt that ends after the video (for
        example the chat template's user turn up to and including the video). Ask questions
        about it with `session.ask(question_inputs)`.
        """
        refuse_compress_once(self, "encode_video")
        inputs, rest = self._split(kwargs)
        ids = inputs.get("input_ids")
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] != 1:
            raise ValueError("encode_video takes ONE prompt: input_ids of shape [1, length]")
        if inputs.get("attention_mask") is None:
            inputs["attention_mask"] = torch.ones_like(ids)
        if not self._has_video(inputs):
            raise ValueError(
                f"encode_video needs a video: {self.adapter.video_pixels_key} is missing"
            )
        inputs = _move_inputs(inputs, self.model.device)
        prep = self._prepare(inputs)
        fixed = {"use_cache": True, "logits_to_keep": 1}  # a session is one cached prefill
        if clash := sorted(set(fixed) & set(rest)):
            raise ValueError(f"encode_video sets {', '.join(clash)} itself; leave it out")
        out = self._compressed_call(prep, {**fixed, **rest})
        return VideoSession(self, inputs, prep, out.past_key_values)


def wrap(
    model: Any,
    compressor: Callable[..., Any] | None = None,
    *,
    ratio: float | None = None,
    threshold: float | None = None,
    min_tokens: int | None = None,
    budget: TokenBudget | None = None,
    positions: str = "transformers",
) -> CraftModel:
    """Put `compressor` between the vision projector and the language model of `model`.

    Args:
        model: a transformers VLM whose `config.model_type` is in `supported_model_types()`.
        compressor: a `craft_core.TokenCompressor` `(features [N, D], coords [N, 3],
            budget, *, importance=None) -> CompressionResult` (CRAFT's `CraftCompressor` or
            any method of craft-eval: it gets the `TokenBudget` itself, and the vision
            tower's attention when it sets `needs_attention`); or a plain callable, called
            as `(features, coords, ratio=... | threshold=..., min_tokens=...)`; or None for
            no compression.
        ratio, threshold, min_tokens: the budget as the user spells it, checked into one
            `craft_core.TokenBudget` (its rules: the fixed-ratio or the threshold mode).
        budget: the same as one `craft_core.TokenBudget` (instead of the three fields).
        positions: the position rule (`craft_adapters.registry.POSITION_RULES`):
            "transformers" (default: the installed transformers' `get_rope_index`, so a wrap
            without a compressor equals the unwrapped model) or "original" (the backbone's
            own code: what its checkpoints were trained with and what vLLM and craft-vllm
            serve). They differ only for Qwen2.5-VL on transformers 5.x (the text after a
            video; docs/internals.md, "Position-id policy per backbone").

    Raises:
        ValueError: unsupported model_type, compressor width != LLM width, bad budget, an
            unknown position rule.
        TypeError: a compressor that is not callable, a budget that is not a TokenBudget, a
            budget field of the wrong type (`ratio=True`).
    """
    if compressor is not None and ratio is None and threshold is None and budget is None:
        raise ValueError("give a budget with the compressor: ratio=... or threshold=...")
    return CraftModel(
        model,
        compressor,
        ratio=ratio,
        threshold=threshold,
        min_tokens=min_tokens,
        budget=budget,
        positions=positions,
    )
