"""Per-video compressor outputs -> the compressed sequence the language model sees.

`CraftModel._prepare` (wrapper.py) runs the vision tower and the backbone's full-sequence
position ids, then uses the two backbone-independent steps here:

1. `compress_videos`: hand the compressible rows of every video of the batch to the
   compressor in ONE `craft_core.compress_many` call, check each video's `CompressionResult`,
   and map its `kept_index` / `assignment` back to rows of the whole video (LLaVA-OV's
   newline rows are never compressed and always survive).
2. `splice_sequence`: given which positions of the FULL sequence survive, slice
   `input_ids`, `attention_mask`, the position ids, `labels` and the per-token type ids to
   them, re-padded on the side the batch was padded on.

Position ids are sliced, never recomputed: a kept token keeps the position it had in the
full sequence, so the language model sees each surviving video token at its original
(t, h, w) place and the text after the video where the uncompressed prompt put it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from craft_adapters.registry import VideoLayout
from craft_adapters.report import CompressionReport, VideoCompression
from craft_core import TokenBudget, TokenCompressor, compress_many
from craft_core.checks import check_index_tensor

__all__ = ["PER_TOKEN_KEYS", "Prepared", "compress_videos", "group_mean", "splice_sequence"]

# Per-token [B, L] tensors that are sliced with the sequence.
PER_TOKEN_KEYS = ("mm_token_type_ids", "token_type_ids")


@dataclass
class Prepared:
    """The compressed pieces of one batch."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    encoder_outputs: dict[str, Any]
    extra: dict[str, torch.Tensor]
    kept: list[torch.Tensor]  # per row: original sequence indices kept, ascending
    rope_deltas: torch.Tensor  # [B, 1]: original max position + 1 - compressed length
    report: CompressionReport
    # per video: (kept rows among its N feature rows, their [K, D] new features)
    video_rows: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


def _call_compressor(
    compressor: Callable[..., Any],
    features: list[torch.Tensor],
    coords: list[torch.Tensor],
    budget: TokenBudget | None,
    importance: list[torch.Tensor | None],
) -> list[Any]:
    # A craft_core.TokenCompressor gets every video in ONE `compress_many` call (its own
    # batched entry where it has one, CRAFT's; else one call a video), the budget object as
    # it is, and the importance (received attention: recorded only when it sets
    # `needs_attention`, attention.py; None otherwise). Any other callable gets one call a
    # video with the budget as the user spells it (`ratio=...`), the call `wrap`'s
    # documentation promises for a plain function.
    if budget is None:
        raise ValueError("a compressor needs a budget: set_budget(ratio=...) or threshold=...")
    if isinstance(compressor, TokenCompressor):
        given = None if all(i is None for i in importance) else importance
        results = list(compress_many(compressor, features, coords, budget, importance=given))
        if len(results) != len(features):
            raise ValueError(
                f"the compressor returned {len(results)} results for {len(features)} videos "
                "(compress_many must return one CompressionResult per video, in order)"
            )
        return results
    return [compressor(f, c, **budget.kwargs()) for f, c in zip(features, coords)]


def group_mean(rows: torch.Tensor, assignment: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Mean of `rows` [n, D] over the groups given by `assignment` [n] -> [num_groups, D]: how
    rows that travel with the video's (Qwen3-VL's deepstack rows, here and in craft-vllm)
    follow a `CompressionResult.assignment`. A group of one row returns that row exactly."""
    out = rows.new_zeros(num_groups, rows.shape[-1])
    out = out.index_add(0, assignment, rows)
    counts = torch.bincount(assignment, minlength=num_groups).clamp_min(1)
    return out / counts.to(rows.dtype).unsqueeze(-1)


class NonFiniteOutput(ValueError):
    """The compressor returned NaN or inf features (a diverged merge module)."""


def _check_result(result: Any, n: int, d: int) -> None:
    # The result indexes into the sequence below: a bad one would silently drop or
    # duplicate tokens instead of failing, so any compressor's output is checked here.
    for name in ("features", "kept_index", "assignment"):
        if not isinstance(getattr(result, name, None), torch.Tensor):
            raise TypeError(
                f"the compressor must return a CompressionResult-like object with a tensor "
                f"`{name}`, got {type(result).__name__}"
            )
    check_index_tensor("kept_index", result.kept_index)  # [k], one original index per row
    check_index_tensor("assignment", result.assignment)
    k = int(result.kept_index.shape[0])
    if result.features.dim() != 2 or tuple(result.features.shape) != (k, d):
        raise ValueError(
            f"compressor returned features of shape {tuple(result.features.shape)}; expected "
            f"[{k}, {d}] (one row per kept_index)"
        )
    if not result.features.is_floating_point():
        raise TypeError(
            f"compressor returned features of dtype {result.features.dtype}; expected a "
            "floating dtype"
        )
    if k < 1 or k > n:
        raise ValueError(f"compressor kept {k} of {n} tokens; must keep between 1 and {n}")
    if k > 1 and bool((result.kept_index[1:] <= result.kept_index[:-1]).any()):
        raise ValueError(
            "compressor returned a kept_index that is not strictly ascending (sorted, no "
            "duplicates)"
        )
    if int(result.kept_index.min()) < 0 or int(result.kept_index.max()) >= n:
        raise ValueError(f"compressor returned a kept_index outside [0, {n})")
    if tuple(result.assignment.shape) != (n,):
        raise ValueError(
            f"compressor returned assignment of shape {tuple(result.assignment.shape)}; "
            f"expected [{n}]"
        )
    low, high = int(result.assignment.min()), int(result.assignment.max())
    if low < 0 or high >= k:
        raise ValueError(
            f"compressor returned an assignment with values in [{low}, {high}]; each must be "
            f"an output row in [0, {k})"
        )
    own = result.assignment[result.kept_index.to(result.assignment.device)]
    if not bool((own == torch.arange(k, device=own.device)).all()):
        raise ValueError(
            "compressor returned an assignment that sends a kept token to another output row "
            "(assignment[kept_index[j]] must be j)"
        )
    # NaN / inf rows would reach the language model and silently poison every reply
    if not bool(torch.isfinite(result.features).all()):  # features are floating (above)
        bad = int((~torch.isfinite(result.features)).any(dim=-1).sum())
        raise NonFiniteOutput(
            f"compressor returned non-finite features ({bad} of {k} rows hold NaN or inf); "
            "refusing to pass them to the language model"
        )


def compress_videos(
    compressor: Callable[..., Any] | None,
    budget: TokenBudget | None,
    features: Sequence[torch.Tensor],
    layouts: Sequence[VideoLayout],
    importance: Sequence[torch.Tensor | None],
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, VideoCompression]]:
    """Compress the videos of one batch (`features`: one `[n, D]` block per video; its
    `importance`: `[n_compressed]` received attention, or None) in ONE compressor call.

    -> per video, in order: (kept rows, new feature rows, assignment of every row, report).
    A video without compressible rows (or without a compressor) keeps every row.
    """
    todo = [
        v
        for v, layout in enumerate(layouts)
        if compressor is not None and layout.compress_rows.numel() > 0
    ]
    results: dict[int, Any] = {}
    if todo:
        assert compressor is not None
        subs, coords = [], []
        for v in todo:
            feats, comp = features[v], layouts[v].compress_rows
            subs.append(feats if comp.numel() == feats.shape[0] else feats[comp])
            coords.append(layouts[v].coords.to(device=feats.device, dtype=torch.long))
        found = _call_compressor(compressor, subs, coords, budget, [importance[v] for v in todo])
        results = dict(zip(todo, found))
    return [
        _video_rows(feats, layout, results.get(v))
        for v, (feats, layout) in enumerate(zip(features, layouts))
    ]


def _video_rows(
    feats: torch.Tensor, layout: VideoLayout, result: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, VideoCompression]:
    """One video's `result` (None: not compressed), checked, as rows of the whole video."""
    n, d = int(feats.shape[0]), int(feats.shape[1])
    comp = layout.compress_rows
    if result is None:
        rows = torch.arange(n, device=feats.device)
        return rows, feats, rows, VideoCompression(layout.batch_index, n, n)
    _check_result(result, int(comp.numel()), d)
    kept_idx = result.kept_index.to(feats.device)
    assign_sub = result.assignment.to(feats.device)
    new_sub = result.features.to(feats.dtype)
    if comp.numel() == n:  # every row compressible (Qwen)
        kept_rows, new_feats, assign = comp[kept_idx], new_sub, assign_sub
    else:  # some rows always survive (LLaVA-OV newline)
        keep_mask = torch.ones(n, dtype=torch.bool, device=feats.device)
        keep_mask[comp] = False
        keep_mask[comp[kept_idx]] = True
        kept_rows = keep_mask.nonzero().squeeze(1)
        slot = keep_mask.long().cumsum(0) - 1  # row -> index among kept rows
        new_feats = feats[kept_rows].index_copy(0, slot[comp[kept_idx]], new_sub)
        assign = slot.clone()
        assign[comp] = slot[comp[kept_idx[assign_sub]]]
    rep = VideoCompression(
        layout.batch_index,
        n,
        int(kept_rows.shape[0]),
        rounds=int(getattr(result, "rounds", 0)),
        info=dict(getattr(result, "info", {}) or {}),
    )
    return kept_rows, new_feats, assign, rep


def splice_sequence(
    inputs: dict[str, Any],
    positions: torch.Tensor,
    keep: torch.Tensor,
    encoder_outputs: dict[str, Any],
    videos: list[VideoCompression],
    pad_token_id: int,
) -> Prepared:
    """Slice one batch to the positions where `keep` (`[B, L]` bool) is True.

    `inputs` holds `input_ids` and `attention_mask` (and maybe `labels` and the per-token
    type ids), all `[B, L]`; `positions` are the FULL sequence's, `[B, L]` or `[3, B, L]`.
    """
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    # Slice every per-token tensor; re-pad on the side the input was padded on.
    bsz, length = ids.shape
    kept = [keep[b].nonzero().squeeze(1) for b in range(bsz)]
    new_len = max(int(k.shape[0]) for k in kept)
    right = bool((mask[:, -1] == 0).any()) and not bool((mask[:, 0] == 0).any())
    c_ids = ids.new_full((bsz, new_len), pad_token_id)
    c_mask = mask.new_zeros((bsz, new_len))
    pos_shape = (positions.shape[0], bsz, new_len) if positions.dim() == 3 else (bsz, new_len)
    c_pos = positions.new_zeros(pos_shape)
    extra_src = {k: inputs[k] for k in (*PER_TOKEN_KEYS, "labels") if inputs.get(k) is not None}
    extra = {
        k: v.new_full((bsz, new_len), -100 if k == "labels" else 0) for k, v in extra_src.items()
    }
    # The rope delta makes decoding continue after the FULL sequence's last position rather
    # than after the compressed length, as the sliced prompt positions already do.
    max_pos = positions.amax(dim=0) if positions.dim() == 3 else positions
    deltas = torch.zeros(bsz, 1, dtype=torch.long, device=ids.device)
    for b, k in enumerate(kept):
        n = int(k.shape[0])
        dst = slice(0, n) if right else slice(new_len - n, new_len)
        c_ids[b, dst] = ids[b, k]
        c_mask[b, dst] = 1
        if positions.dim() == 3:
            c_pos[:, b, dst] = positions[:, b, k]
        else:
            c_pos[b, dst] = positions[b, k]
        for key, src in extra_src.items():
            extra[key][b, dst] = src[b, k]
        real = mask[b].bool()
        deltas[b, 0] = int(max_pos[b][real].max()) + 1 - n
    report = CompressionReport(videos, sequence_length_before=length, sequence_length_after=new_len)
    return Prepared(c_ids, c_mask, c_pos, encoder_outputs, extra, kept, deltas, report)
