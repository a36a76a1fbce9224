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

Only that one layer is recomputed: a forward pre-hook on its attention module reads the
module's inputs, recomputes q and k (with the module's own rotary embedding) and the
softmax; the tower itself keeps running with sdpa / flash attention. Memory: one
`[L, L]` float32 matrix per head at a time (L = tokens per frame group).
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["encode_videos_with_attention", "received_attention", "wants_attention"]


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


class _Recorder:
    """Forward pre-hook state: one received-attention tensor per call of the layer."""

    def __init__(self) -> None:
        self.calls: list[torch.Tensor] = []
        self.grid_thw: list[torch.Tensor] = []


def _qwen_hook(recorder: _Recorder) -> Any:
    def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        cu = kwargs["cu_seqlens"] if "cu_seqlens" in kwargs else args[1]
        cos, sin = kwargs["position_embeddings"]
        n = hidden.shape[0]
        with torch.no_grad():
            q, k, _ = module.qkv(hidden).reshape(n, 3, module.num_heads, -1).permute(1, 0, 2, 3)
            rope = sys.modules[type(module).__module__].apply_rotary_pos_emb_vision
            q, k = rope(q, k, cos, sin)
            q, k = q.transpose(0, 1), k.transpose(0, 1)  # [H, n, d]
            bounds = [int(b) for b in cu.tolist()]
            parts = [
                received_attention(q[:, a:b], k[:, a:b], module.scaling)
                for a, b in itertools.pairwise(bounds)
                if b > a
            ]
        recorder.calls.append(torch.cat(parts))

    return hook


def _siglip_hook(recorder: _Recorder) -> Any:
    def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        b, length, _ = hidden.shape
        heads = module.num_heads
        with torch.no_grad():
            q = module.q_proj(hidden).view(b, length, heads, -1).transpose(1, 2)
            k = module.k_proj(hidden).view(b, length, heads, -1).transpose(1, 2)
            rows = [received_attention(q[i], k[i], module.scale) for i in range(b)]
        recorder.calls.append(torch.stack(rows))

    return hook


def _siglip_layer(model: Any) -> Any:
    config = model.config
    layer = getattr(config, "vision_feature_layer", -1)
    if not isinstance(layer, int):
        raise ValueError(
            f"received attention needs one vision_feature_layer, got {layer!r} (a list)"
        )
    tower = model.model.vision_tower
    layers = getattr(tower, "vision_model", tower).encoder.layers
    if layer == 0 or abs(layer) > len(layers):
        raise ValueError(f"vision_feature_layer {layer} selects no attention layer")
    return layers[len(layers) + layer if layer < 0 else layer - 1].self_attn


@contextmanager
def _recording(adapter: Any) -> Iterator[_Recorder]:
    recorder = _Recorder()
    model = adapter.model
    if model.config.model_type == "llava_onevision":
        handles = [
            _siglip_layer(model).register_forward_pre_hook(_siglip_hook(recorder), with_kwargs=True)
        ]
    else:
        visual = model.model.visual

        def grid_hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            recorder.grid_thw.append(args[1] if len(args) > 1 else kwargs["grid_thw"])

        handles = [
            visual.blocks[-1].attn.register_forward_pre_hook(
                _qwen_hook(recorder), with_kwargs=True
            ),
            visual.register_forward_pre_hook(grid_hook, with_kwargs=True),
        ]
    try:
        yield recorder
    finally:
        for handle in handles:
            handle.remove()


def _qwen_per_video(adapter: Any, recorder: _Recorder) -> torch.Tensor:
    """`[total merged tokens]` received attention in the order of the merged features."""
    visual = adapter.model.model.visual
    unit = visual.spatial_merge_size**2
    out = []
    for received, grid in zip(recorder.calls, recorder.grid_thw):
        merged = received.view(-1, unit).mean(dim=1)
        if hasattr(visual, "window_size"):  # Qwen2.5-VL: blocks run in window order
            from transformers.vision_utils import get_vision_window_index

            window_index, _ = get_vision_window_index(
                grid,
                spatial_merge_size=visual.spatial_merge_size,
                window_size=visual.window_size,
                patch_size=visual.patch_size,
            )
            merged = merged[torch.argsort(window_index.to(merged.device))]
        out.append(merged)
    return torch.cat(out)


def _llava_per_video(adapter: Any, recorder: _Recorder) -> torch.Tensor:
    """`[total grid rows]` received attention pooled like the features (newline excluded)."""
    config = adapter.model.config
    side = config.vision_config.image_size // config.vision_config.patch_size
    out = []
    for received in recorder.calls:
        if getattr(config, "vision_feature_select_strategy", "full") == "default":
            received = received[:, 1:]
        grid = received.view(-1, 1, side, side)
        pooled = F.interpolate(grid, size=[math.ceil(side / 2)] * 2, mode="bilinear")
        out.append(pooled.flatten())
    return torch.cat(out)


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
    is_llava = adapter.model.config.model_type == "llava_onevision"
    flat = _llava_per_video(adapter, recorder) if is_llava else _qwen_per_video(adapter, recorder)
    sizes = [int(f.shape[0]) - (1 if is_llava else 0) for f in features]
    if sum(sizes) != flat.numel():
        raise RuntimeError(
            f"received attention has {flat.numel()} rows for {sum(sizes)} video tokens"
        )
    return enc, features, list(torch.split(flat.to(features[0].device), sizes))
