"""Turn decoded frames + a prompt into model inputs, through the backbone's HF processor.

    frames, fps = craft_adapters.read_video("clip.mp4")            # fps=2, <= 64 frames
    inputs = craft_adapters.build_inputs(processor, frames, fps, "What happens?")
    ids = model.generate(**inputs, max_new_tokens=16)

The prompt goes through the processor's chat template as one user turn holding the video
then the text, with the assistant prompt appended. The frames are given to the processor
as they are (no re-sampling): Qwen3-VL / Qwen3.5 get `video_metadata` (timestamps
`k / fps`), Qwen2.5-VL gets `fps` (hence `second_per_grid_ts`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["build_inputs", "build_session_inputs", "render_prompt"]

_SENTINEL = "\u2063CRAFT-QUESTION\u2063"


def _kind(processor: Any) -> str:
    name = type(processor).__name__
    if "Qwen3VL" in name or "Qwen3_5" in name:
        return "qwen3"
    if "Qwen2_5_VL" in name or "Qwen2VL" in name:
        return "qwen2"
    if "LlavaOnevision" in name:
        return "llava_onevision"
    return "other"


def render_prompt(
    processor: Any, prompt: str, add_generation_prompt: bool = True, system: str | None = None
) -> str:
    """The chat-template text of one user turn holding a video then `prompt`.

    `system`: an optional system turn before it (None: the template's default, if any).
    """
    messages: list[dict[str, Any]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append(
        {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": prompt}]}
    )
    text = processor.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    return text if isinstance(text, str) else text[0]


def _as_frames(frames: Any) -> np.ndarray:
    if isinstance(frames, torch.Tensor):
        frames = frames.cpu().numpy()
    arr = np.asarray(frames)
    if arr.ndim != 4 or arr.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 [F, H, W, 3], got shape {arr.shape}")
    if arr.dtype != np.uint8:
        raise ValueError(f"frames must be uint8, got {arr.dtype}")
    if arr.shape[0] < 1:
        raise ValueError("frames is empty")
    return arr


def _video_kwargs(processor: Any, videos: list[np.ndarray], fps: list[float]) -> dict[str, Any]:
    kind = _kind(processor)
    if kind in ("qwen3", "qwen2"):
        # Qwen2.5-VL reads second_per_grid_ts from the metadata's sampled fps (5.x)
        from transformers.video_utils import VideoMetadata

        meta = [
            VideoMetadata(
                total_num_frames=int(v.shape[0]),
                fps=float(f),
                frames_indices=list(range(int(v.shape[0]))),
                height=int(v.shape[1]),
                width=int(v.shape[2]),
            )
            for v, f in zip(videos, fps)
        ]
        return {"video_metadata": meta, "do_sample_frames": False}
    return {"do_sample_frames": False}


def _process(processor: Any, texts: list[str], videos: list[np.ndarray], fps: list[float]) -> Any:
    kwargs = _video_kwargs(processor, videos, fps)
    common: dict[str, Any] = {"return_tensors": "pt"}
    if len(texts) > 1:
        common.update(padding=True, padding_side="left")
    lengths = {int(v.shape[0]) for v in videos}
    if _kind(processor) == "llava_onevision" and len(lengths) > 1:
        # pixel_values_videos is [B, F, C, H, W]: videos of different lengths do not stack, so
        # process them one at a time and hand the model a list (craft_adapters handles it).
        pieces = [
            processor(text=[t], videos=[v], return_tensors="pt") for t, v in zip(texts, videos)
        ]
        text_out = processor.tokenizer(
            [_expand_llava(processor, t, v) for t, v in zip(texts, videos)], **common
        )
        data = dict(text_out)
        data["pixel_values_videos"] = [p["pixel_values_videos"] for p in pieces]
        from transformers import BatchFeature

        return BatchFeature(data)
    return processor(text=texts, videos=videos, **common, **kwargs)


def _expand_llava(processor: Any, text: str, video: np.ndarray) -> str:
    # as LlavaOnevisionProcessor.replace_video_token counts them
    side = int(math.sqrt(processor.num_image_tokens))
    pooled = math.ceil(side / 2)
    n = int(video.shape[0]) * pooled * pooled + 1
    return text.replace(processor.video_token, processor.video_token * n, 1)


def build_inputs(
    processor: Any,
    frames: Any,
    fps: float | Sequence[float],
    prompt: str | Sequence[str],
    *,
    add_generation_prompt: bool = True,
    system: str | None = None,
) -> Any:
    """Processor outputs (a `BatchFeature` of torch tensors) for video(s) + prompt(s).

    Args:
        processor: the backbone's HF processor (from `AutoProcessor.from_pretrained`, or
            `craft_adapters.tiny.build_tiny_processor`).
        frames: uint8 `[F, H, W, 3]`, or a list of them for a batch (left-padded).
        fps: the rate the frames were sampled at (one per video, or one for all).
        prompt: the user's text (one per video in a batch).
        add_generation_prompt: append the assistant prompt of the chat template.
        system: an optional system turn (None: the chat template's default).
    """
    batched = isinstance(frames, (list, tuple))
    videos = [_as_frames(f) for f in frames] if batched else [_as_frames(frames)]
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    if len(prompts) != len(videos):
        raise ValueError(f"{len(videos)} video(s) but {len(prompts)} prompt(s)")
    fps_list = [float(fps)] * len(videos) if isinstance(fps, (int, float)) else list(fps)
    if len(fps_list) != len(videos):
        raise ValueError(f"{len(videos)} video(s) but {len(fps_list)} fps value(s)")
    texts = [render_prompt(processor, p, add_generation_prompt, system) for p in prompts]
    return _process(processor, texts, videos, fps_list)


def build_session_inputs(
    processor: Any,
    frames: Any,
    fps: float,
    questions: Sequence[str],
    *,
    system: str | None = None,
) -> tuple[Any, list[torch.Tensor]]:
    """Inputs for `model.encode_video(**video_inputs)` and one `session.ask(q)` per question.

    The chat-template text of `video + question` is cut where the question starts: the part
    before (with the video) goes through the processor once, each question's part (the
    question, the end of the user turn and the assistant prompt) is tokenized alone, so
    `prefix + question` are the same tokens as `build_inputs(processor, frames, fps, q)`.

    Returns:
        `(video_inputs, [question input_ids [1, q] per question])`.
    """
    video = _as_frames(frames)
    template = render_prompt(processor, _SENTINEL, system=system)
    cut = template.index(_SENTINEL)
    prefix, suffix = template[:cut], template[cut + len(_SENTINEL) :]
    video_inputs = _process(processor, [prefix], [video], [float(fps)])
    tokenizer = processor.tokenizer
    q_ids = [
        tokenizer(q + suffix, add_special_tokens=False, return_tensors="pt")["input_ids"]
        for q in questions
    ]
    return video_inputs, q_ids
