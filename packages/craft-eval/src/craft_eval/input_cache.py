"""Decoded frames and processor outputs of a question, kept for the next backend that asks.

Measuring many methods on the same questions (`craft_eval.measure.Measure`, `craft-eval
demo`) decodes each clip and runs the processor once per method: on the miniature world that
was about half of a question's time. Every backend of one `Measure` shares one `InputCache`,
so a question's inputs are built once, by the first method that asks, and handed to the
others. The model sees the same tensors either way (the cache never changes what is built,
only how often), which `tests/test_input_cache.py` checks record by record.

It also keeps each question's vision tower output (`InputCache.vision`): every backend that
compresses (and reads no attention) encodes a clip through it, so the tower runs once for all
of them; the uncompressed model runs its own (`HFBackend._share_vision`).

The cache is keyed by the video file's path, size and modification time (a file rewritten
between two methods is read again), the question's segment and prompt, and the sampling
(fps, frame cap) and device. It holds at most `max_bytes` of arrays (vision outputs
included), least recently used dropped first; one cache serves one processor and one model
(the `Measure` that owns it).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import torch

__all__ = ["InputCache", "Prepared"]

Prepared = tuple[np.ndarray, float, bool, dict[str, Any]]
"""`(frames uint8 [F, H, W, 3], the rate they represent, whether the frame cap bound,
processor outputs on the model's device)`."""


class InputCache:
    """A byte-bounded LRU of `Prepared` inputs.

    Args:
        max_bytes: the most array bytes held (frames plus every tensor of the processor
            outputs); an entry larger than this is built and returned, never kept.
    """

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[Hashable, tuple[Prepared, int]] = OrderedDict()
        self._bytes = 0
        # an entry's vision tower output and its bytes (`vision`), dropped with the entry
        self._vision: dict[Hashable, tuple[Any, int]] = {}
        self.vision_hits = 0
        self.vision_misses = 0

    @staticmethod
    def key(path: str, *parts: Hashable) -> Hashable:
        """The cache key of the video at `path` with the other `parts` of the question; a
        missing file gets a key of its own (its error is raised by the build, never kept)."""
        try:
            stat = os.stat(path)
        except OSError:
            return (path, None, *parts)
        return (path, stat.st_size, stat.st_mtime_ns, *parts)

    def get(self, key: Hashable, build: Callable[[], Prepared]) -> Prepared:
        """The entry under `key`, built by `build()` the first time; the processor outputs
        come back as a new dict each time (a caller that adds a key changes nobody else's),
        the tensors shared (the models read them, nothing writes them)."""
        if key in self._entries:
            self.hits += 1
            self._entries.move_to_end(key)
            frames, fps, capped, inputs = self._entries[key][0]
            return frames, fps, capped, dict(inputs)
        self.misses += 1
        prepared = build()
        size = _nbytes(prepared)
        if size <= self.max_bytes:
            self._entries[key] = (prepared, size)
            self._bytes += size
            self._drop_over_budget()
        frames, fps, capped, inputs = prepared
        return frames, fps, capped, dict(inputs)

    def __len__(self) -> int:
        return len(self._entries)

    def vision(self, pixels: Any, encode: Callable[[], Any]) -> Any:
        """The vision tower's output for `pixels` (a processor output this cache built and
        still holds), computed by `encode()` the first time: every method of a `Measure`
        but the uncompressed one (its model runs its own tower) encodes a clip once. Keyed
        by the tensor itself: an entry dropped from the cache drops its output too."""
        for (prepared, _), key in zip(self._entries.values(), self._entries):
            if pixels is not None and any(v is pixels for v in prepared[3].values()):
                if key in self._vision:
                    self.vision_hits += 1
                    return self._vision[key][0]
                self.vision_misses += 1
                out = encode()
                size = _tensor_bytes(out)
                self._vision[key] = (out, size)
                self._bytes += size
                self._entries.move_to_end(key)
                self._drop_over_budget()
                return out
        return encode()  # not held here (too large, or built elsewhere): nothing kept

    def _drop_over_budget(self) -> None:
        """Least recently used entries (and their vision outputs) dropped to `max_bytes`."""
        while self._bytes > self.max_bytes and self._entries:
            old, (_, dropped) = self._entries.popitem(last=False)
            self._bytes -= dropped + self._vision.pop(old, (None, 0))[1]


def _tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in `value` (a tensor, or tuples, lists and dicts of them; a
    transformers `ModelOutput` is a dict)."""
    if isinstance(value, torch.Tensor):
        return value.element_size() * value.nelement()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _nbytes(prepared: Prepared) -> int:
    frames, _, _, inputs = prepared
    tensors = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
    return int(frames.nbytes) + sum(t.element_size() * t.nelement() for t in tensors)
