"""Helpers of the craft-adapters tests: a test compressor, synthetic frames, an LM recorder.

(A uniquely named module, so that the test suites of all packages can run in one pytest.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from craft_adapters.tiny import TINY_FRAME_SIZE
from craft_core.result import CompressionResult


class KeepEvery:
    """Test compressor of the method interface: keeps every `step`-th token (ratio 1: all)."""

    hidden_size = 64

    def __init__(self, step: int = 2) -> None:
        self.step = step
        self.calls: list[dict[str, Any]] = []

    def __call__(
        self, features: torch.Tensor, coords: torch.Tensor, *, ratio: float | None = None, **_: Any
    ) -> CompressionResult:
        """Only `ratio` matters here; the rest of the method interface (threshold=,
        min_tokens=, importance=) is accepted and unused."""
        self.calls.append({"features": features, "coords": coords.clone(), "ratio": ratio})
        n = features.shape[0]
        step = 1 if ratio == 1 else self.step
        kept = torch.arange(0, n, step, device=features.device)
        assign = torch.arange(n, device=features.device) // step
        # a merge-like output: the mean of each group (keeps autograd)
        out = torch.zeros_like(features[kept]).index_add(0, assign, features)
        counts = torch.bincount(assign, minlength=kept.numel()).to(features.dtype)
        out = out / counts.unsqueeze(-1) if step > 1 else features[kept]
        return CompressionResult(out, coords[kept], kept, assign, rounds=1, info={"m": "keep"})


def make_frames(num_frames: int, seed: int = 0, size: int = TINY_FRAME_SIZE) -> np.ndarray:
    """uint8 [F, size, size, 3]: a smooth moving pattern plus noise (some redundancy)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    frames = []
    base = rng.integers(0, 255, size=3)
    for f in range(num_frames):
        img = np.stack(
            [(xx * 2 + f * 9 + base[c] + yy * (c + 1)) % 256 for c in range(3)], axis=-1
        ).astype(np.float64)
        img += rng.normal(0, 20, size=img.shape)
        frames.append(np.clip(img, 0, 255).astype(np.uint8))
    return np.stack(frames)


class LMRecorder:
    """Records what reaches the language model: positions, mask, cache length, input length."""

    def __init__(self, lm: torch.nn.Module) -> None:
        self.lm = lm
        self.calls: list[dict[str, Any]] = []

    def _hook(self, _m: Any, args: Any, kwargs: dict[str, Any]) -> None:
        cache = kwargs.get("past_key_values")
        emb = kwargs.get("inputs_embeds")
        pos = kwargs.get("position_ids")
        mask = kwargs.get("attention_mask")
        self.calls.append(
            {
                "position_ids": None if pos is None else pos.detach().clone(),
                "attention_mask": mask if not isinstance(mask, torch.Tensor) else mask.clone(),
                "past": 0 if cache is None else int(cache.get_seq_length()),
                "length": None if emb is None else int(emb.shape[1]),
            }
        )

    @contextmanager
    def record(self) -> Iterator[LMRecorder]:
        handle = self.lm.register_forward_pre_hook(self._hook, with_kwargs=True)
        try:
            yield self
        finally:
            handle.remove()
