"""A stage inside the language model: at layer L, keep some of the video's rows by a score.

`InModelDrop(model, rule, layer=L, name=...)` hooks a Hugging Face VLM (wrapped by `wrap`
or not) so that, in every prefill of one prompt, the rows on the video placeholders that
reach decoder layer `L` are cut to those `rule` keeps (FastV-style methods; the language-
model stage of FlashVID and HoliTom in craft-eval). The score is the attention the LAST
token of the prompt pays each row in layer `L - 1` (softmax over every key, mean over
heads), recorded from that layer's own query and keys by an attention function wrapped
around the model's (`sdpa`, `eager`, ...). Layers before `L` and their KV cache keep every
row; layers from `L` on see, and cache, the kept rows at their ORIGINAL positions (the
rotary embeddings, position ids and masks are index-selected, never recomputed), so
decoding and later turns on the same cache continue from the original positions. The
logits of the prefill are over the kept positions (`report.kept`).

A method that drops rows inside the model depends on the question (the last token), so
the compressed video cannot be stored and served again: `refuse_compress_once` raises,
naming the method, wherever craft-adapters compresses a video once for many questions.
Batches of one prompt only (ValueError otherwise); every video of the prompt is scored
together, as the official code does with its one visual span.

Every backbone craft-adapters supports (tested on each tiny model against a hand-spliced
reference, `tests/test_in_model.py`): Qwen2.5-VL, Qwen3-VL, Qwen3.5, LLaVA-OneVision,
InternVL, GLM-4.1V. Qwen3-VL's deepstack rows, added after the first decoder layers, are
index-selected with the rows when a level comes after the drop (`L` below the number of
levels). Qwen3.5's Gated-DeltaNet layers: layer `L - 1` must be a softmax-attention layer
(else a ValueError naming the model class and the layers that qualify); the linear layers
from `L` on run, and keep their recurrent state, on the kept rows. `video_rows=` runs the
same on a bare language model fed `inputs_embeds` (craft-eval's efficiency bench times its
prefill with the drop).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import eager_attention_forward

from craft_adapters.registry import get_adapter

#: The attention implementation installed on layer `L - 1` (it wraps the model's own).
SCORING = "craft_last_query"
#: `rule(hidden [n, D], score [n]) -> (kept positions [k] ascending in 0..n-1, rows [k, D]
#: or None to keep the kept rows as they are)`: what a method does at layer L.
KeepRule = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]


@dataclass(frozen=True)
class DropReport:
    """The last prefill's drop: `rows_before` / `rows_after` video rows at layer `layer`;
    `kept` `[K]` the positions of the language model's input sequence kept from `layer`."""

    name: str
    layer: int
    rows_before: int
    rows_after: int
    kept: torch.Tensor


def top_fraction(fraction: float, rounding: Callable[[float], int] = math.ceil) -> KeepRule:
    """FastV's rule: the `rounding(n * fraction)` rows with the highest score, unchanged
    (ties: the smaller position)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction}")

    def rule(hidden: torch.Tensor, score: torch.Tensor) -> tuple[torch.Tensor, None]:
        count = min(hidden.shape[0], int(rounding(hidden.shape[0] * fraction)))
        order = torch.sort(score, descending=True, stable=True).indices
        return torch.sort(order[:count]).values, None

    return rule


def _last_query_attention(
    query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scaling: float
) -> torch.Tensor:
    """`[B, S]`: softmax(q_last k^T * scaling) over the keys, mean over the heads.
    `query [B, H, Q, d]`, `key [B, Hkv, S, d]`, `mask` `[B, 1, Q, S]` (bool or additive)."""
    heads = query.shape[1]
    key = key.repeat_interleave(heads // key.shape[1], dim=1)
    logits = (query[:, :, -1:].float() @ key.float().transpose(-1, -2)) * scaling
    if mask is not None:
        row = mask[:, :, -1:, : key.shape[2]]
        if row.dtype == torch.bool:
            logits = logits.masked_fill(~row, float("-inf"))
        else:
            logits = logits + row.float()
    return torch.softmax(logits, dim=-1)[:, :, 0].mean(dim=1)


def _scoring_attention(module: Any, query: torch.Tensor, key: torch.Tensor, *args: Any, **kw: Any):  # type: ignore[no-untyped-def]
    """The wrapped attention of layer `L - 1`: the model's own, plus the last-query score
    recorded on the hook while it waits for a prefill."""
    drop: InModelDrop = module._craft_in_model_drop
    own = ALL_ATTENTION_FUNCTIONS.get_interface(drop.base_attention, eager_attention_forward)
    out = own(module, query, key, *args, **kw)
    if drop.waiting and query.shape[2] > 1:
        mask = args[1] if len(args) > 1 else kw.get("attention_mask")
        scaling = kw.get("scaling") or query.shape[-1] ** -0.5
        drop.scores = _last_query_attention(query, key, mask, scaling)
    return out


AttentionInterface.register(SCORING, _scoring_attention)


def _language_model(model: Any) -> Any:
    """The VLM's language model (`model.model.language_model`), or `model` itself when it
    is a bare language model (`model.layers`)."""
    inner = getattr(model, "model", model)
    lm = getattr(inner, "language_model", model)
    if not isinstance(getattr(lm, "layers", None), torch.nn.ModuleList):
        raise ValueError(
            f"InModelDrop: {type(model).__name__} has no model.language_model.layers; "
            "give the Hugging Face VLM (or a wrap() of it)"
        )
    return lm


def _scoring_layer_attention(hf: Any, layers: Any, layer: int) -> Any:
    """The attention module of layer `layer - 1`, where the last token's attention is read;
    refused, naming the layers that qualify, where that layer has none (linear attention)."""
    attention = _attention_of(layers[layer - 1])
    if attention is None:
        usable = [i + 1 for i in range(len(layers) - 1) if _attention_of(layers[i])]
        raise ValueError(
            f"layer {layer - 1} of {type(hf).__name__} is not an attention layer (the "
            "score is the last token's attention there): "
            + (f"layer must be one of {usable}" if usable else "no layer of it qualifies")
        )
    return attention


def _adapter_video_rows(hf: Any, lm: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """Which positions of a prefill are the video's, from the backbone's adapter; a bare
    language model has none, so the caller must say."""
    if lm is hf:
        raise ValueError(
            f"InModelDrop on a bare language model ({type(hf).__name__}): give "
            "video_rows= (which positions of a prefill are the video's)"
        )
    adapter = get_adapter(hf)
    return lambda ids: adapter.video_mask({"input_ids": ids})[0]


class InModelDrop:
    """Hooks that keep, at decoder layer `layer`, the video rows `rule` chooses.

    Args:
        model: a Hugging Face VLM of a supported backbone, or `wrap(...)` of one.
        rule: a `KeepRule` (e.g. `top_fraction(0.3)`), called once per prefill.
        layer: `L`, 1 <= L < number of layers; layer `L - 1` must be an attention layer.
        name: the method's name, for reports and refusals.
        video_rows: `video_rows(sequence) -> [S]` bool, the video positions of a prefill
            whose `input_ids [1, S]` (or `inputs_embeds [1, S, D]`) is `sequence`; default:
            the backbone adapter's placeholders in `input_ids`. Given, `model` may also be
            a bare language model (`model.layers`; craft-eval's efficiency bench).

    `report` is the last prefill's `DropReport` (None before one); `remove()` undoes
    every hook.
    """

    def __init__(
        self,
        model: Any,
        rule: KeepRule,
        *,
        layer: int,
        name: str,
        video_rows: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        hf = getattr(model, "model", model) if hasattr(model, "compressor") else model
        self._lm = _language_model(hf)
        layers = self._lm.layers
        if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer < len(layers):
            raise ValueError(f"layer must be an int in [1, {len(layers) - 1}], got {layer!r}")
        other = getattr(hf, "_craft_in_model_drop", None)
        if other is not None:
            raise ValueError(
                f"this model already carries method {other.name!r}'s stage inside the language "
                "model: remove() it first"
            )
        attention = _scoring_layer_attention(hf, layers, layer)
        self.name, self.rule, self.layer = name, rule, layer
        self.report: DropReport | None = None
        self.waiting = False
        self.scores: torch.Tensor | None = None
        self._video: torch.Tensor | None = None
        self._keep: torch.Tensor | None = None
        self._prefill = 0
        self._embeds_too = video_rows is not None
        self._video_rows = video_rows or _adapter_video_rows(hf, self._lm)
        self._attention = attention
        self._original_config = attention.config
        self.base_attention = attention.config._attn_implementation
        scoring = copy.copy(attention.config)
        scoring._attn_implementation_internal = SCORING
        attention.config = scoring
        attention._craft_in_model_drop = self
        self._handles = [hf.register_forward_pre_hook(self._on_model, with_kwargs=True)]
        self._handles += [
            layers[i].register_forward_pre_hook(self._on_layer(i), with_kwargs=True)
            for i in range(layer, len(layers))
        ]
        # rows the backbone adds inside the LM (Qwen3-VL's deepstack) follow the drop; a bare
        # language model has no backbone adapter and is called without them
        self._unroute = None
        if self._lm is not hf:
            adapter = get_adapter(hf)
            self._unroute = adapter.route_lm_visual_rows(self._lm, self._deepstack)
        hf._craft_in_model_drop = self
        self._model = hf

    def remove(self) -> None:
        """Undo every hook and the scoring attention."""
        for handle in self._handles:
            handle.remove()
        self._attention.config = self._original_config
        del self._attention._craft_in_model_drop
        if self._unroute is not None:
            self._unroute()
        if getattr(self._model, "_craft_in_model_drop", None) is self:
            del self._model._craft_in_model_drop

    def _on_model(self, _module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        """Before each VLM call: a prefill (more than one id, an empty cache) is scored."""
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None and self._embeds_too:
            ids = kwargs.get("inputs_embeds")
        past = kwargs.get("past_key_values")
        fresh = past is None or past.get_seq_length() == 0
        if ids is None or ids.shape[1] < 2 or not fresh:
            self.waiting = False  # a later call on a dropped cache keeps `_keep`
            return
        if ids.shape[0] != 1:
            raise ValueError(
                f"method {self.name!r} drops rows inside the language model: one prompt per "
                f"call (batch of 1), got a batch of {ids.shape[0]}"
            )
        self._video = self._video_rows(ids).bool()
        self.waiting, self.scores, self._keep = bool(self._video.any()), None, None

    def _on_layer(self, index: int) -> Callable[..., Any]:
        """The pre-hook of decoder layer `index >= L`: the drop at `L`, then the layer's
        inputs index-selected to the kept positions (keys: kept, then later tokens)."""

        def hook(_module: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
            hidden = args[0] if args else kwargs["hidden_states"]
            if index == self.layer and self.waiting:
                hidden = self._drop(hidden)
            if self._keep is None:
                return None
            kwargs = self._select(dict(kwargs), hidden.shape[1])
            if args:
                return (hidden, *args[1:]), kwargs
            kwargs["hidden_states"] = hidden
            return args, kwargs

        return hook

    def _drop(self, hidden: torch.Tensor) -> torch.Tensor:
        """`[1, S, D] -> [1, S', D]`: the rule's rows of the video, every other position."""
        self.waiting = False
        if self.scores is None:
            raise RuntimeError(
                f"method {self.name!r}: no attention score was recorded in layer "
                f"{self.layer - 1} during this prefill"
            )
        assert self._video is not None
        rows_at = torch.nonzero(self._video.to(hidden.device)).squeeze(1)
        kept, rows = self.rule(hidden[0, rows_at], self.scores[0, rows_at].to(hidden.device))
        kept = _checked_kept(kept, rows_at.numel(), self.name)
        if rows is not None:
            hidden = hidden.clone()
            hidden[0, rows_at[kept]] = rows.to(hidden.dtype)
        others = torch.nonzero(~self._video.to(hidden.device)).squeeze(1)
        keep = torch.sort(torch.cat([others, rows_at[kept]])).values
        self._keep, self._prefill = keep, hidden.shape[1]
        self.report = DropReport(self.name, self.layer, rows_at.numel(), kept.numel(), keep)
        return hidden[:, keep]

    def _deepstack(
        self, hidden: torch.Tensor, visual: torch.Tensor, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Qwen3-VL's deepstack inputs after a layer `>= L` of the prefill (a drop at a layer
        before the last deepstack level): the mask `[1, S]` and its rows `[V, D]`, selected
        to the kept positions; otherwise as they are."""
        keep = self._keep
        if keep is None or visual.shape[-1] != self._prefill or hidden.shape[1] != keep.numel():
            return visual, rows
        keep = keep.to(visual.device)
        order = visual[0].long().cumsum(0) - 1  # the row of each visual position
        kept_visual = visual[:, keep]
        return kept_visual, rows[order[keep][kept_visual[0]].to(rows.device)]

    def _select(self, kwargs: dict[str, Any], length: int) -> dict[str, Any]:
        """A layer's keyword inputs for the kept positions: the prefill's queries AND keys
        (`length == len(keep)` and inputs of the prefill's length), or, on later calls
        (decode, another turn), the keys of the mask only."""
        keep, full = self._keep, self._prefill
        assert keep is not None
        prefill = length == keep.numel() and _seq_len(kwargs) == full
        if prefill:
            for key in ("position_embeddings", "position_ids", "cache_position"):
                kwargs[key] = _take(kwargs.get(key), keep, full)
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[-1] >= full:
            keys = torch.cat([keep, torch.arange(full, mask.shape[-1], device=keep.device)])
            mask = mask[..., keys.to(mask.device)]
            kwargs["attention_mask"] = mask[..., keep.to(mask.device), :] if prefill else mask
        return kwargs


def _attention_of(layer: Any) -> Any:
    """A decoder layer's softmax attention module, or None (Qwen3.5's linear-attention
    layers have `linear_attn` instead)."""
    attention = getattr(layer, "self_attn", None)
    return attention if attention is not None and hasattr(attention, "config") else None


def _seq_len(kwargs: dict[str, Any]) -> int | None:
    """The sequence length of a layer's inputs (its position ids' last dimension)."""
    ids = kwargs.get("position_ids")
    if isinstance(ids, torch.Tensor):
        return int(ids.shape[-1])
    emb = kwargs.get("position_embeddings")
    return int(emb[0].shape[-2]) if emb is not None else None


def _take(value: Any, keep: torch.Tensor, full: int) -> Any:
    """`value` index-selected to `keep` along its sequence dimension (the last of ids,
    the one before the last of rotary tables); a pair of tables pairwise; else as it is."""
    if isinstance(value, tuple):
        return tuple(_take(v, keep, full) for v in value)
    if not isinstance(value, torch.Tensor):
        return value
    if value.dim() >= 1 and value.shape[-1] == full and not value.is_floating_point():
        return value[..., keep.to(value.device)]
    if value.dim() >= 2 and value.shape[-2] == full:
        return value[..., keep.to(value.device), :]
    return value


def _checked_kept(kept: Any, n: int, name: str) -> torch.Tensor:
    """The rule's kept positions, checked: 1-D integer, ascending, distinct, in [0, n)."""
    if not isinstance(kept, torch.Tensor) or kept.dim() != 1 or kept.is_floating_point():
        raise ValueError(
            f"method {name!r}: the rule must return kept positions as a 1-D long tensor"
        )
    kept = kept.long()
    if kept.numel() and (
        int(kept.min()) < 0 or int(kept.max()) >= n or bool((kept.diff() <= 0).any())
    ):
        raise ValueError(
            f"method {name!r}: kept positions must be ascending, distinct, in [0, {n})"
        )
    return kept


def refuse_compress_once(model: Any, what: str) -> None:
    """Raise if `model` drops rows inside its language model: such a method depends on the
    question, so `what` (compressing a video once for many questions) cannot serve it."""
    hf = getattr(model, "model", model) if hasattr(model, "compressor") else model
    drop = getattr(hf, "_craft_in_model_drop", None)
    if drop is not None:
        raise ValueError(
            f"{what}: method {drop.name!r} drops video rows inside the language model by the "
            "question's attention (query-dependent); a video compressed once cannot serve it"
        )
