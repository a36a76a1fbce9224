"""Decoded frames and processor outputs of a question, kept for the next backend that asks.

Measuring many methods on the same questions (`craft_eval.measure.Measure`, `craft-eval
demo`) decodes each clip and runs the processor once per method: on the miniature world that
was about half of a question's time. Every backend of one `Measure` shares one `InputCache`,
so a question's inputs are built once, by the first method that asks, and handed to the
others. The model sees the same tensors either way (the cache never changes what is built,
only how often), which `tests/test_input_cache.py` checks record by record.

The cache is keyed by the video file's path, size and modification time (a file rewritten
between two methods is read again), the question's segment and prompt, and the sampling
(fps, frame cap) and device. It holds at most `max_bytes` of arrays, least recently used
dropped first; one cache serves one processor (the `Measure` that owns it).
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
            while self._bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped
        frames, fps, capped, inputs = prepared
        return frames, fps, capped, dict(inputs)

    def __len__(self) -> int:
        return len(self._entries)


def _nbytes(prepared: Prepared) -> int:
    frames, _, _, inputs = prepared
    tensors = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
    return int(frames.nbytes) + sum(t.element_size() * t.nelement() for t in tensors)
