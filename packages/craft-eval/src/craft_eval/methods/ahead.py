"""Videos compressed ahead of their questions: several in ONE call of a method's batched entry
(CRAFT's `compress_many`), each result taken later by the call that asks for the same video.

The runner answers one question at a time, and CRAFT's cost on a small video is mostly per-op
overhead (hundreds of small ops a round): 16 videos in one call cost about what one does
(the world's trained module at N = 144, D = 128, one thread: 150 ms a video alone, 15 ms a
video in a call of 16). So `HFBackend.prefetch` runs the wrapped model on the next questions
inside `capturing()`: each call encodes its video and hands the compressor the features,
which are recorded, and the call stops there (`Captured`: nothing is compressed, the language
model never runs). `TimedCompressor.compute_ahead` compresses them all in one call; when a
question's own `generate` reaches the compressor with the same features, coordinates and
budget (compared with `torch.equal`), it takes that result instead of computing it: the same
tokens and rows (craft-core's `compress_many` gives each video what it gives it alone), and
the video's share of that call's time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NoReturn

import torch

from craft_core import CompressionResult, TokenBudget

__all__ = ["AheadResults", "Captured", "Pending"]


@dataclass
class Pending:
    """One video as the compressor received it."""

    features: torch.Tensor  # [N, D]
    coords: torch.Tensor  # [N, 3]
    budget: TokenBudget


class Captured(Exception):
    """Stops a capturing call once the compressor has its videos (nothing is compressed)."""


class AheadResults:
    """The videos a capturing call recorded, and the results computed ahead for them."""

    def __init__(self) -> None:
        self.capture: list[Pending] | None = None  # recording while not None
        # (video, its result, its share of the call's ms, videos in that call)
        self.ready: list[tuple[Pending, CompressionResult, float, int]] = []

    @contextlib.contextmanager
    def capturing(self) -> Iterator[list[Pending]]:
        """Inside the block a compressor call records its videos and raises `Captured`."""
        seen: list[Pending] = []
        self.capture = seen
        try:
            yield seen
        finally:
            self.capture = None

    def record(
        self, features: Sequence[torch.Tensor], coords: Sequence[torch.Tensor], budget: TokenBudget
    ) -> NoReturn:
        """Record a capturing call's videos and stop the call."""
        assert self.capture is not None, "record() outside capturing()"
        self.capture.extend(Pending(f, c, budget) for f, c in zip(features, coords))
        raise Captured

    def take(
        self, features: torch.Tensor, coords: torch.Tensor, budget: TokenBudget
    ) -> tuple[CompressionResult, float, int] | None:
        """(result, its share of the call's ms, videos in the call) computed ahead for this
        video (`[N, D]` features, `[N, 3]` coords, at `budget`), removed from the ready
        ones; None if none was."""
        for i, (video, result, ms, batch) in enumerate(self.ready):
            if (
                video.budget == budget
                and video.features.shape == features.shape
                and torch.equal(video.features, features)
                and torch.equal(video.coords, coords)
            ):
                del self.ready[i]
                return result, ms, batch
        return None
