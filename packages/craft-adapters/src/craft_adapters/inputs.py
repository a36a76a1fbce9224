"""Turn decoded frames + a prompt into model inputs, through the backbone's HF processor.

    frames, fps = craft_adapters.read_video("clip.mp4")            # fps=2, <= 64 frames
    inputs = craft_adapters.build_inputs(processor, frames, fps, "What happens?")
    ids = model.generate(**inputs, max_new_tokens=16)

The prompt goes through the processor's chat template as one user turn holding the video
then the text, with the assistant prompt appended. The frames are given to the processor
without re-sampling: Qwen3-VL / Qwen3.5 get `video_metadata` (timestamps `k / fps`),
Qwen2.5-VL gets `fps` (hence `second_per_grid_ts`).

Frame resolution. transformers' Qwen3-VL video processor reads its `size` as a pixel budget
for the WHOLE video (frames x height x width), so 64 frames come out at ~110 px. lmms-eval's
model classes instead resize every frame on its own with qwen-vl-utils' rule (`frame_size`
below) and call the processor with `do_resize=False`; `build_inputs` does the same for the
Qwen3 family, with lmms-eval 0.7.3's per-frame bounds (`LMMS_VIDEO_PIXELS`) unless
`min_pixels` / `max_pixels` / `total_pixels` are given. By default frames are not UP-scaled
(lmms-eval's `min_pixels` would turn a 64 px test clip into 448 px); pass
`min_pixels=LMMS_VIDEO_PIXELS[...]["min_pixels"]` for lmms-eval's exact sizes on low-res
clips. For Qwen2.5-VL the rule applies when a bound is given; LLaVA-OneVision has a fixed
input size and takes none.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from craft_adapters.registry import InputRules, adapter_classes, input_rules, processor_adapter
from craft_adapters.video import _check_rate
from craft_core.checks import check_int

__all__ = [
    "LMMS_VIDEO_PIXELS",
    "build_inputs",
    "build_session_inputs",
    "frame_size",
    "render_prompt",
]

# lmms-eval 0.7.3's per-frame defaults of each backbone (its `InputRules.lmms_pixels`)
LMMS_VIDEO_PIXELS: dict[str, dict[str, int | None]] = {
    cls.model_types[0]: dict(cls.input_rules.lmms_pixels)
    for cls in adapter_classes()
    if cls.input_rules.lmms_pixels is not None
}
# qwen-vl-utils 0.0.14 vision_process.py constants
_VIDEO_MAX_TOKENS = 768
_SEQ_LEN = 128000
_FRAME_FACTOR = 2

_SENTINEL = "\u2063CRAFT-QUESTION\u2063"


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
    if min(arr.shape[:3]) < 1:
        raise ValueError(f"frames is empty, got shape {arr.shape}")
    return arr


def _check_pixels(*values: int | None) -> None:
    for name, value in zip(("min_pixels", "max_pixels", "total_pixels"), values):
        if value is not None:
            check_int(name, value, minimum=1)


def frame_size(
    height: int,
    width: int,
    num_frames: int,
    *,
    factor: int,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    total_pixels: int | None = None,
) -> tuple[int, int]:
    """(height, width) every frame is resized to, as qwen-vl-utils 0.0.14 `fetch_video` +
    `smart_resize` compute them (what lmms-eval's Qwen model classes use).

    The frame bound is `min(max_pixels, max(min(768 * factor^2, total_pixels / F * 2),
    1.05 * min_pixels))`, `total_pixels` defaulting to `128000 * factor^2 * 0.9`; sides are
    rounded to multiples of `factor` (patch size x merge size), then scaled down (floor) to
    fit the bound or up (ceil) to reach `min_pixels`, keeping the aspect ratio.
    """
    if min(height, width) < 1 or num_frames < 1:
        raise ValueError(
            f"frame_size: need frames of positive size, got {num_frames}x{height}x{width}"
        )
    low = factor * factor if min_pixels is None else min_pixels
    total = _SEQ_LEN * factor * factor * 0.9 if total_pixels is None else total_pixels
    bound = max(
        min(_VIDEO_MAX_TOKENS * factor * factor, total / num_frames * _FRAME_FACTOR),
        int(low * 1.05),
    )
    if max_pixels is not None:
        bound = min(max_pixels, bound)
    if bound < low:
        raise ValueError(f"max_pixels {max_pixels} is below min_pixels {low}")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > bound:
        beta = math.sqrt(height * width / bound)
        h = math.floor(height / beta / factor) * factor
        w = math.floor(width / beta / factor) * factor
    elif h * w < low:
        beta = math.sqrt(low / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def _resize_frames(
    processor: Any,
    videos: list[np.ndarray],
    pixels: dict[str, int | None],
    rules: InputRules | None = None,
) -> list[np.ndarray] | None:
    """Frames resized per frame (bicubic, antialiased, as qwen-vl-utils), or None when the
    processor resizes them itself (Qwen2.5-VL without bounds). `rules`: the processor's
    `input_rules` when the caller has them already."""
    rules = rules or input_rules(processor)  # the backbone's adapter says how frames are sized
    given: dict[str, int | None] = {k: v for k, v in pixels.items() if v is not None}
    if not rules.frame_bounds:
        if given:
            raise ValueError(
                f"{', '.join(given)}: frame pixel bounds apply to the Qwen backbones; "
                f"{type(processor).__name__} resizes frames to its fixed input size"
            )
        return None
    if not given:
        if rules.lmms_pixels is None:
            return None
        given = {**rules.lmms_pixels, "min_pixels": None}  # no up-scaling by default
    vp = processor.video_processor
    factor = int(vp.patch_size) * int(vp.merge_size)
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.functional import resize

    out = []
    for video in videos:
        f, h0, w0 = (int(x) for x in video.shape[:3])
        h, w = frame_size(h0, w0, f, factor=factor, **given)
        if (h, w) == (h0, w0):
            out.append(video)
            continue
        t = torch.from_numpy(np.ascontiguousarray(video)).permute(0, 3, 1, 2)
        t = resize(t, [h, w], interpolation=InterpolationMode.BICUBIC, antialias=True)
        out.append(t.permute(0, 2, 3, 1).contiguous().numpy())
    return out


def _video_kwargs(rules: InputRules, videos: list[np.ndarray], fps: list[float]) -> dict[str, Any]:
    if rules.video_metadata:
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


def _process(
    processor: Any,
    texts: list[str],
    videos: list[np.ndarray],
    fps: list[float],
    pixels: dict[str, int | None] | None = None,
) -> Any:
    rules = input_rules(processor)
    resized = _resize_frames(processor, videos, pixels or {}, rules)
    if resized is not None:
        videos = resized
    kwargs = _video_kwargs(rules, videos, fps)
    if resized is not None:
        kwargs["do_resize"] = False
    common: dict[str, Any] = {"return_tensors": "pt"}
    if len(texts) > 1:
        common.update(padding=True, padding_side="left")
    lengths = {int(v.shape[0]) for v in videos}
    if rules.one_call_per_length and len(lengths) > 1:
        # pixel_values_videos is [B, F, C, H, W]: videos of different lengths do not stack, so
        # process them one at a time and hand the model a list (craft_adapters handles it).
        pieces = [
            processor(text=[t], videos=[v], return_tensors="pt") for t, v in zip(texts, videos)
        ]
        adapter = processor_adapter(processor)
        assert adapter is not None  # one_call_per_length comes from an adapter's rules
        expanded = [
            adapter.expand_video_prompt(processor, t, int(v.shape[0]))
            for t, v in zip(texts, videos)
        ]
        text_out = processor.tokenizer(expanded, **common)
        data = dict(text_out)
        data["pixel_values_videos"] = [p["pixel_values_videos"] for p in pieces]
        from transformers import BatchFeature

        return BatchFeature(data)
    return processor(text=texts, videos=videos, **common, **kwargs)


def build_inputs(
    processor: Any,
    frames: Any,
    fps: float | Sequence[float],
    prompt: str | Sequence[str],
    *,
    add_generation_prompt: bool = True,
    system: str | None = None,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    total_pixels: int | None = None,
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
        min_pixels, max_pixels, total_pixels: per-frame pixel bounds of the Qwen backbones
            (qwen-vl-utils semantics, see `frame_size` and the module docstring).
    """
    batched = isinstance(frames, (list, tuple))
    videos = [_as_frames(f) for f in frames] if batched else [_as_frames(frames)]
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    if len(prompts) != len(videos):
        raise ValueError(f"{len(videos)} video(s) but {len(prompts)} prompt(s)")
    fps_list = [fps] * len(videos) if not isinstance(fps, (list, tuple)) else list(fps)
    if len(fps_list) != len(videos):
        raise ValueError(f"{len(videos)} video(s) but {len(fps_list)} fps value(s)")
    rates = [_check_rate(f) for f in fps_list]
    _check_pixels(min_pixels, max_pixels, total_pixels)
    texts = [render_prompt(processor, p, add_generation_prompt, system) for p in prompts]
    pixels = {"min_pixels": min_pixels, "max_pixels": max_pixels, "total_pixels": total_pixels}
    return _process(processor, texts, videos, rates, pixels)


def build_session_inputs(
    processor: Any,
    frames: Any,
    fps: float,
    questions: Sequence[str],
    *,
    system: str | None = None,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    total_pixels: int | None = None,
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
    fps = _check_rate(fps)
    _check_pixels(min_pixels, max_pixels, total_pixels)
    if isinstance(questions, str):
        raise TypeError("questions must be a list of strings, got one str")
    template = render_prompt(processor, _SENTINEL, system=system)
    cut = template.index(_SENTINEL)
    prefix, suffix = template[:cut], template[cut + len(_SENTINEL) :]
    pixels = {"min_pixels": min_pixels, "max_pixels": max_pixels, "total_pixels": total_pixels}
    video_inputs = _process(processor, [prefix], [video], [float(fps)], pixels)
    tokenizer = processor.tokenizer
    q_ids = [
        tokenizer(q + suffix, add_special_tokens=False, return_tensors="pt")["input_ids"]
        for q in questions
    ]
    return video_inputs, q_ids
