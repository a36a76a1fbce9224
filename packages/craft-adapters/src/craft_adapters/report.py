"""What a compressed call did: `VideoCompression` per video, `CompressionReport` per call.

`CraftModel.last_compression` and `VideoSession.report` hold these: token counts, rounds
and the compressor's `info` per video; the report's properties sum them over the videos.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CompressionReport", "VideoCompression"]


@dataclass
class VideoCompression:
    """What happened to one video.

    Attributes:
        batch_index: row of the batch that holds the video.
        tokens_before: placeholder tokens of the video before compression (for LLaVA-OV
            including the newline token, which always survives).
        tokens_after: tokens left after compression.
        rounds: select-then-fuse rounds the compressor ran (0 without compression).
        info: the compressor's `CompressionResult.info`.
    """

    batch_index: int
    tokens_before: int
    tokens_after: int
    rounds: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """Realized ratio `tokens_before / tokens_after`."""
        return self.tokens_before / max(1, self.tokens_after)


@dataclass
class CompressionReport:
    """What one forward / generate / encode_video did, one entry per video."""

    videos: list[VideoCompression]
    sequence_length_before: int = 0
    sequence_length_after: int = 0

    @property
    def tokens_before(self) -> int:
        return sum(v.tokens_before for v in self.videos)

    @property
    def tokens_after(self) -> int:
        return sum(v.tokens_after for v in self.videos)

    @property
    def ratio(self) -> float:
        """Realized ratio over all videos (1.0 without videos)."""
        return self.tokens_before / max(1, self.tokens_after) if self.videos else 1.0

    @property
    def rounds(self) -> list[int]:
        return [v.rounds for v in self.videos]
