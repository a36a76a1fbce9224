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
  limit is vLLM's own (768 sampled frames, then `--max-model-len`), as before;
- a field of a `video_embeds` part (a compressed payload, `payload.chat_part`) whose base64
  bytes do not load as a tensor: vLLM's `torch.load(weights_only=True)` refuses a pickled
  object (`torch.save` of a class instance: `UnpicklingError`, a 500 with nothing run) and
  other bytes fail in other ways; each is now refused naming the field (`load_embeds_dict`).
  In the OpenAI server's (async) parser, the one `vllm serve` runs.

vLLM turns a `ValueError` raised while the request's media are loaded into a 400
(BadRequestError), the same path as its own "Could not open video stream".
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any


class VideoRequestError(ValueError):
    """A request's video that the server refuses (a 400 for the client)."""


def _reason(error: Exception) -> str:
    """One line of why a field did not load (torch's weights-only refusal names the global)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if "Unsupported global" in line or "Unpickler error" in line]
    line = (named or lines or [""])[0]
    return f"{type(error).__name__}: {line[:200]}"


async def load_embeds_dict(
    data: Mapping[str, Any], fetch: Callable[[str], Awaitable[Any]]
) -> dict[str, Any]:
    """vLLM's `_load_embeds_dict` (each base64 value of an embeddings part loaded by
    `fetch`) with each failure refused naming its field (a `VideoRequestError`, a 400).

    Any exception while loading a client's bytes is the client's: torch.load raises
    UnpicklingError, RuntimeError, EOFError, ... by what the bytes hold."""

    async def one(key: str, value: str) -> Any:
        try:
            return await fetch(value)
        except Exception as error:
            raise VideoRequestError(
                f"compressed video payload: {key} is not a tensor this server can read "
                f"({_reason(error)}); each field must be the base64 of torch.save(tensor) "
                "(craft_vllm.payload.tensor_base64)"
            ) from None

    encoded = {k: v for k, v in data.items() if isinstance(v, str)}
    tensors = await asyncio.gather(*(one(k, v) for k, v in encoded.items()))
    return {**data, **dict(zip(encoded, tensors))}


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


def _patch_sampler(cls: Any) -> None:
    original = cls.__dict__["compute_frames_index_to_sample"].__func__
    if getattr(original, "craft_checked", False):
        return

    def compute_frames_index_to_sample(
        inner: Any, source: Any, target: Any, **kwargs: Any
    ) -> list[int]:
        total = int(source.total_frames_num)
        sampled = sampled_frames(total, source.original_fps, target.fps, inner._MAX_FPS)
        patch = int(kwargs.get("temporal_patch_size", 2))
        check_frames(total, sampled, patch, kwargs.get("max_frames"))
        return original(inner, source, target, **kwargs)  # type: ignore[no-any-return]

    compute_frames_index_to_sample.craft_checked = True  # type: ignore[attr-defined]
    cls.compute_frames_index_to_sample = classmethod(compute_frames_index_to_sample)


def _patch_load_file(cls: Any) -> None:
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
    """Patch vLLM's Qwen2-VL video sampler, file loader and embeddings-part loader
    (idempotent)."""
    from vllm.multimodal.media.video import VideoMediaIO
    from vllm.multimodal.video import Qwen2VLVideoBackend
    from vllm.renderers import chat_utils

    _patch_sampler(Qwen2VLVideoBackend)
    _patch_load_file(VideoMediaIO)
    chat_utils._load_embeds_dict = load_embeds_dict  # looked up by name at each request
    logging.getLogger("craft_vllm").info("craft-vllm: per-request video checks installed")
