"""Per-request video checks in the API server: each bad video gets its own 400, naming why.

vLLM 0.32 answers some bad videos with a 500 and a bare Python message; a CRAFT server sees
them as often as good ones (clients send what they have). Patched here, in the process that
reads the videos (the API server; `plugin.register()` installs them in every process):

- a video shorter than one temporal patch (1 frame, or a container with no frame): vLLM's
  Qwen2-VL sampler computes 0 frames and divides by it (500 "division by zero");
- a `file://` URL under `--allowed-local-media-path` naming no file (500 "[Errno 2] ...");
- a video over `max_frames` of `--media-io-kwargs '{"video": {"max_frames": N}}'`: vLLM's
  sampler silently keeps N frames spread over the video (a different video than was sent),
  so the request is refused instead, naming the limit. Without `max_frames` the server's
  limit is vLLM's own (768 sampled frames, then `--max-model-len`), as before.

vLLM turns a `ValueError` raised while the request's media are loaded into a 400
(BadRequestError), the same path as its own "Could not open video stream".
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any


class VideoRequestError(ValueError):
    """A request's video that the server refuses (a 400 for the client)."""


def sampled_frames(total: int, source_fps: float, fps: float, max_fps: float) -> int:
    """The frames the Qwen2-VL sampler takes before its `max_frames` clamp (>= 4, <= total)."""
    if source_fps <= 0:
        return total
    return min(max(math.floor(total / source_fps * min(fps, max_fps)), 4), total)


def check_frames(total: int, sampled: int, patch: int, limit: int | None) -> None:
    """Refuse a video of `total` frames (`sampled` of them kept) below one temporal patch or
    over the configured `max_frames` (`limit`; None: none configured)."""
    if total < patch:
        raise VideoRequestError(
            f"the video has {total} frame(s): at least {patch} are needed "
            f"(one temporal patch of the vision encoder)"
        )
    if limit is not None and sampled > limit:
        raise VideoRequestError(
            f"the video gives {sampled} frames, over this server's limit of {limit} "
            f'(--media-io-kwargs \'{{"video": {{"max_frames": {limit}}}}}\'): send a shorter clip'
        )


def _patch_sampler(cls: type) -> None:
    original = cls.__dict__["compute_frames_index_to_sample"].__func__
    if getattr(original, "craft_checked", False):
        return

    def compute_frames_index_to_sample(
        inner: type, source: Any, target: Any, **kwargs: Any
    ) -> list[int]:
        total = int(source.total_frames_num)
        sampled = sampled_frames(total, source.original_fps, target.fps, inner._MAX_FPS)
        patch = int(kwargs.get("temporal_patch_size", 2))
        check_frames(total, sampled, patch, kwargs.get("max_frames"))
        return original(inner, source, target, **kwargs)  # type: ignore[no-any-return]

    compute_frames_index_to_sample.craft_checked = True  # type: ignore[attr-defined]
    cls.compute_frames_index_to_sample = classmethod(compute_frames_index_to_sample)


def _patch_load_file(cls: type) -> None:
    original = cls.load_file
    if getattr(original, "craft_checked", False):
        return

    def load_file(self: Any, filepath: Path) -> Any:
        if not Path(filepath).is_file():  # the name only: the server's folders stay private
            raise VideoRequestError(f"no video file named {Path(filepath).name!r} on the server")
        return original(self, filepath)

    load_file.craft_checked = True  # type: ignore[attr-defined]
    cls.load_file = load_file


def install() -> None:
    """Patch vLLM's Qwen2-VL video sampler and file loader (idempotent)."""
    from vllm.multimodal.media.video import VideoMediaIO
    from vllm.multimodal.video import Qwen2VLVideoBackend

    _patch_sampler(Qwen2VLVideoBackend)
    _patch_load_file(VideoMediaIO)
    logging.getLogger("craft_vllm").info("craft-vllm: per-request video checks installed")
