"""The attention each video token RECEIVES in the vision tower's last layer (issue 11).

Methods such as VisionZip and FastVID rank tokens by the vision tower's attention. A
compressor that sets `needs_attention = True` gets, per video, `importance=[n]` aligned with
the rows it compresses:

- Qwen2.5-VL, Qwen3-VL, Qwen3.5: the last ViT block's softmax(q k^T / sqrt(d)) within each
  of its attention spans (`cu_seqlens`: one frame group), averaged over heads and queries,
  then over each 2 x 2 spatial-merge group (the 4 consecutive rows the merger fuses), in
  the merged tokens' order (Qwen2.5-VL's window permutation undone).
- LLaVA-OneVision: the same in the SigLIP layer whose output is the selected feature
  (`vision_feature_layer`), per frame, then pooled to the P x P grid by the model's own
  bilinear pooling (the FastVID code pools its attention the same way).

Each backbone module hooks its own layer (`BackboneAdapter.attention_hooks`) and maps the
recorded attention to its feature rows (`BackboneAdapter.received_attention`). Only that one
layer is recomputed: a forward pre-hook on its attention module reads the
module's inputs, recomputes q and k (with the module's own rotary embedding) and the
softmax; the tower itself keeps running with sdpa / flash attention. Memory: one
`[L, L]` float32 matrix per head at a time (L = tokens per frame group).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = [
    "Recorder",
    "encode_videos_with_attention",
    "per_image_hook",
    "received_attention",
    "wants_attention",
]


def wants_attention(compressor: Any) -> bool:
    """Whether `compressor` asks for the vision tower's attention (`needs_attention`)."""
    return bool(getattr(compressor, "needs_attention", False))


def received_attention(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention received per key: softmax(q k^T * scale) averaged over heads and queries.

    Args:
        q, k: `[H, L, d]` one attention span's queries and keys.
    Returns:
        `[L]` float32: column means of the row-stochastic attention, averaged over heads.
    """
    total = torch.zeros(k.shape[1], dtype=torch.float32, device=k.device)
    for h in range(q.shape[0]):  # one head at a time bounds memory at L x L
        logits = (q[h].float() @ k[h].float().T) * scale
        total += torch.softmax(logits, dim=-1).mean(dim=0)
    return total / q.shape[0]


class Recorder:
    """Forward pre-hook state: one received-attention tensor per call of the layer."""

    def __init__(self) -> None:
        self.calls: list[torch.Tensor] = []
        self.grid_thw: list[torch.Tensor] = []


def per_image_hook(recorder: Recorder) -> Any:
    """A forward pre-hook for a vision attention module that attends within each image of a
    `[B, L, D]` batch (SigLIP, InternViT: `q_proj`, `k_proj`, optional `q_norm` / `k_norm`,
    `num_heads`, `scale`); records `[B, L]` received attention per call."""

    def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        b, length, _ = hidden.shape
        heads = module.num_heads
        q_norm = getattr(module, "q_norm", torch.nn.Identity())
        k_norm = getattr(module, "k_norm", torch.nn.Identity())
        with torch.no_grad():
            q = q_norm(module.q_proj(hidden)).view(b, length, heads, -1).transpose(1, 2)
            k = k_norm(module.k_proj(hidden)).view(b, length, heads, -1).transpose(1, 2)
            rows = [received_attention(q[i], k[i], module.scale) for i in range(b)]
        recorder.calls.append(torch.stack(rows))

    return hook


@contextmanager
def _recording(adapter: Any) -> Iterator[Recorder]:
    recorder = Recorder()
    handles = adapter.attention_hooks(recorder)  # each backbone hooks its own layer
    try:
        yield recorder
    finally:
        for handle in handles:
            handle.remove()


def encode_videos_with_attention(
    adapter: Any, inputs: dict[str, Any], compressor: Any
) -> tuple[Any, list[torch.Tensor], list[torch.Tensor | None]]:
    """`adapter.encode_videos(inputs)` plus, when `compressor` wants it, each video's
    received attention `[n_compressed_rows]` (else None per video)."""
    if not wants_attention(compressor):
        enc, features = adapter.encode_videos(inputs)
        return enc, features, [None] * len(features)
    with _recording(adapter) as recorder:
        enc, features = adapter.encode_videos(inputs)
    flat = adapter.received_attention(recorder)
    sizes = [int(f.shape[0]) - adapter.fixed_rows_per_video for f in features]
    if sum(sizes) != flat.numel():
        raise RuntimeError(
            f"received attention has {flat.numel()} rows for {sum(sizes)} video tokens"
        )
    return enc, features, list(torch.split(flat.to(features[0].device), sizes))
