"""Received attention from the vision tower's last layer (attention.py) on all four tiny
backbones, against an eager computation of the same layer written here: its softmax
reproduces the layer's real output, the received attention is a slow loop over keys, and
the mapping to the compressed rows goes through the model's own merger / pooling."""

from __future__ import annotations

import itertools
import sys
from typing import Any

import torch
from adapters_testkit import make_frames

from craft_adapters import build_inputs, wrap
from craft_adapters.attention import encode_videos_with_attention, wants_attention


class NeedsAttention:
    """Keeps every token; records the importance it was handed."""

    needs_attention = True

    def __init__(self) -> None:
        self.seen: list[torch.Tensor | None] = []

    def __call__(self, features: torch.Tensor, coords: torch.Tensor, **kwargs: Any) -> Any:
        from craft_core import CompressionResult

        self.seen.append(kwargs.get("importance"))
        n = features.shape[0]
        keep = torch.arange(n)
        return CompressionResult(features, coords.long(), keep, keep, 0, {})


def _layer(model: Any) -> Any:
    if model.config.model_type == "llava_onevision":
        tower = model.model.vision_tower
        layers = getattr(tower, "vision_model", tower).encoder.layers
        j = model.config.vision_feature_layer
        return layers[len(layers) + j if j < 0 else j - 1].self_attn
    return model.model.visual.blocks[-1].attn


def _eager(module: Any, hidden: torch.Tensor, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """-> (the layer's output recomputed eagerly, per-span probabilities [H, L, L])."""
    if hasattr(module, "qkv"):  # Qwen: packed spans, rotary q / k
        n = hidden.shape[0]
        q, k, v = module.qkv(hidden).reshape(n, 3, module.num_heads, -1).permute(1, 0, 2, 3)
        rope = sys.modules[type(module).__module__].apply_rotary_pos_emb_vision
        q, k = rope(q, k, *kwargs["position_embeddings"])
        cu = kwargs["cu_seqlens"].tolist()
        outs, probs = [], []
        for a, b in itertools.pairwise(cu):
            qs, ks, vs = (t[a:b].transpose(0, 1).double() for t in (q, k, v))
            p = torch.softmax(qs @ ks.transpose(1, 2) * module.scaling, dim=-1)
            probs.append(p)
            outs.append((p @ vs).transpose(0, 1).reshape(b - a, -1))
        return module.proj(torch.cat(outs).to(hidden.dtype)), probs
    b, length, _ = hidden.shape  # SigLIP: one image per batch row
    shape = (b, length, module.num_heads, -1)
    q, k, v = (
        proj(hidden).view(shape).transpose(1, 2).double()
        for proj in (module.q_proj, module.k_proj, module.v_proj)
    )
    p = torch.softmax(q @ k.transpose(2, 3) * module.scale, dim=-1)
    out = (p @ v).transpose(1, 2).reshape(b, length, -1)
    return module.out_proj(out.to(hidden.dtype)), list(p)


def _received_slow(probs: torch.Tensor) -> torch.Tensor:
    heads, queries, keys = probs.shape
    return torch.tensor(
        [
            sum(float(probs[h, i, j]) for h in range(heads) for i in range(queries))
            / (heads * queries)
            for j in range(keys)
        ]
    )


def test_received_attention_equals_eager_layer(backbone: tuple[str, Any, Any]) -> None:
    name, model, processor = backbone
    inputs = dict(build_inputs(processor, make_frames(4, seed=2), 2.0, "what happens?"))
    adapter = wrap(model, None).adapter
    compressor = NeedsAttention()
    assert wants_attention(compressor) and not wants_attention(object())
    _, features, attention = encode_videos_with_attention(adapter, inputs, compressor)

    captured: dict[str, Any] = {}

    def hook(module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        captured["eager"], captured["probs"] = _eager(module, hidden, kwargs)
        captured["real"] = output[0] if isinstance(output, tuple) else output

    layer = _layer(model)
    handle = layer.register_forward_hook(hook, with_kwargs=True)
    if name != "llava_onevision":
        block_out: list[torch.Tensor] = []
        blk = model.model.visual.blocks[-1]
        h2 = blk.register_forward_hook(lambda m, a, o: block_out.append(o))
    with torch.no_grad():
        enc, _again = adapter.encode_videos(inputs)
    handle.remove()
    # the eager softmax IS this layer's attention: it reproduces the layer's real output
    torch.testing.assert_close(captured["eager"], captured["real"], rtol=1e-4, atol=1e-5)
    received = [_received_slow(p) for p in captured["probs"]]

    if name == "llava_onevision":
        grid = torch.stack(received).float()  # [frames, side * side]
        pooled = model.model.apply_pooling(grid[:, :, None]).flatten()
        expected = [pooled]
        assert attention[0].shape[0] == features[0].shape[0] - 1  # the newline is not scored
    else:
        h2.remove()
        visual = model.model.visual
        unit = visual.spatial_merge_size**2
        per_patch = torch.cat(received).view(-1, unit).mean(dim=1).float()
        merged_window_order = visual.merger(block_out[0])
        pooler = torch.cat(list(enc.pooler_output))
        # which merger row became which output row: match them (window order undone)
        match = torch.cdist(pooler, merged_window_order).argmin(dim=1)
        assert torch.equal(torch.sort(match).values, torch.arange(pooler.shape[0]))
        expected = list(torch.split(per_patch[match], [f.shape[0] for f in features]))
    assert len(attention) == len(expected)
    for got, want in zip(attention, expected):
        assert got is not None
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_wrapper_hands_attention_only_to_methods_that_ask(
    backbone: tuple[str, Any, Any],
) -> None:
    _, model, processor = backbone
    inputs = build_inputs(processor, make_frames(4, seed=3), 2.0, "describe")
    asks = NeedsAttention()
    wrap(model, asks, ratio=1.0)(**inputs)
    _, _, direct = encode_videos_with_attention(wrap(model, None).adapter, dict(inputs), asks)
    assert asks.seen[0] is not None
    torch.testing.assert_close(asks.seen[0], direct[0])
    silent = NeedsAttention()
    silent.needs_attention = False
    wrap(model, silent, ratio=1.0)(**inputs)
    assert silent.seen == [None]
