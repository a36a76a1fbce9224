"""One training example -> model inputs, with labels only on the caption / answer tokens.

The video is decoded by `craft_adapters.read_video` (fps, frame cap); the prompt (video +
user text + assistant prompt) goes through `craft_adapters.build_inputs`, i.e. the
backbone's processor and chat template. The target tokens are what the chat template puts
after the assistant prompt for an assistant turn holding the target (the text and the
end-of-turn token), tokenized alone and appended. Labels are -100 on every prompt token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from craft_train.config import TrainingConfig
from craft_train.data import SEQUENCE_KEYS, DecodeError, Example

__all__ = ["ExampleEncoder", "make_encoder", "target_text"]

log = logging.getLogger(__name__)


def target_text(processor: Any, prompt: str, target: str) -> str:
    """The text the chat template puts after the assistant prompt for reply `target`.

    Falls back to `target + eos` when the template renders the assistant turn so that the
    generation prompt is not a prefix of it.
    """
    from craft_adapters import render_prompt

    user = {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": prompt}]}
    reply = {"role": "assistant", "content": [{"type": "text", "text": target}]}
    head = render_prompt(processor, prompt, add_generation_prompt=True)
    full = processor.apply_chat_template([user, reply], tokenize=False)
    full = full if isinstance(full, str) else full[0]
    if full.startswith(head) and target in full[len(head) :]:
        return full[len(head) :]
    tokenizer = getattr(processor, "tokenizer", processor)
    return target + (tokenizer.eos_token or "")


class ExampleEncoder:
    """`encoder(example)` -> `{input_ids, attention_mask, labels, ..., pixel_values_videos, ...}`.

    A video that cannot be read (missing, corrupt, no frame) raises `DecodeError`; the
    dataset skips it. A sequence longer than `data.max_seq_len` is rebuilt from fewer frames
    (uniformly thinned, keeping the clip's span) rather than cutting the target.
    """

    def __init__(self, cfg: TrainingConfig, processor: Any) -> None:
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.fps = cfg.data.fps
        self.max_frames = cfg.data.max_frames
        self.max_pixels = cfg.data.max_pixels  # per frame (craft_adapters.build_inputs)
        self.max_seq_len = cfg.data.max_seq_len

    def read(self, path: str) -> tuple[np.ndarray, float]:
        from craft_adapters import read_video

        try:
            video = read_video(path, fps=self.fps, max_frames=self.max_frames)
        except Exception as err:  # any failure of the decoder is a bad file, not a bug here
            raise DecodeError(f"{type(err).__name__}: {err}") from err
        frames, fps = video.frames, video.fps
        if frames.ndim != 4 or frames.shape[0] < 1:
            raise DecodeError(f"no frames decoded (shape {frames.shape})")
        return frames, fps

    def __call__(self, example: Example) -> dict[str, Any]:
        answer = self.tokenizer(
            target_text(self.processor, example.prompt, example.target),
            add_special_tokens=False,
            return_tensors="pt",
        )["input_ids"]
        return _append_target(self.prompt_inputs(example, int(answer.shape[-1])), answer)

    def prompt_inputs(self, example: Example, target_tokens: int) -> dict[str, Any]:
        """Processor outputs of the video + prompt + assistant prompt (`[1, L]` tensors), with
        frames thinned until `L + target_tokens` fits `data.max_seq_len`."""
        from craft_adapters import build_inputs

        frames, fps = self.read(example.video)
        for _ in range(4):
            inputs = dict(
                build_inputs(
                    self.processor, frames, fps, example.prompt, max_pixels=self.max_pixels
                )
            )
            length = int(inputs["input_ids"].shape[-1]) + target_tokens
            if length <= self.max_seq_len or frames.shape[0] <= 2:
                break
            frames, fps = _thin(frames, fps, length, self.max_seq_len)
        if length > self.max_seq_len:
            raise DecodeError(
                f"{length} tokens (prompt + {target_tokens} target) with {frames.shape[0]} "
                f"frames, over data.max_seq_len {self.max_seq_len}"
            )
        return inputs


def _thin(frames: np.ndarray, fps: float, length: int, limit: int) -> tuple[np.ndarray, float]:
    """Fewer frames (an even count, at least 2) so that about `limit` tokens remain."""
    count = frames.shape[0]
    keep = max(2, int(count * limit / length * 0.95) // 2 * 2)
    keep = min(keep, count - 1 if count > 2 else count)
    index = np.rint(np.linspace(0, count - 1, keep)).astype(np.int64)
    log.info("thinning a video from %d to %d frames to fit max_seq_len", count, keep)
    return frames[index], fps * keep / count


def _append_target(inputs: dict[str, Any], answer: torch.Tensor) -> dict[str, Any]:
    """Append the target ids; labels: -100 on the prompt, the ids on the target."""
    n = int(answer.shape[-1])
    ids = inputs["input_ids"]
    out = dict(inputs)
    out["input_ids"] = torch.cat([ids, answer.to(ids.dtype)], dim=-1)
    out["labels"] = torch.cat([torch.full_like(ids, -100), answer.to(ids.dtype)], dim=-1)
    for key in SEQUENCE_KEYS:
        if key in ("input_ids", "labels") or key not in inputs:
            continue
        value = inputs[key]
        fill = 1 if key == "attention_mask" else 0  # target tokens are text (type 0)
        out[key] = torch.cat([value, value.new_full((value.shape[0], n), fill)], dim=-1)
    return out


def make_encoder(cfg: TrainingConfig, processor: Any) -> Callable[[Example], dict[str, Any]]:
    """The default `encoder_factory` of `craft_train.trainer.train`."""
    return ExampleEncoder(cfg, processor)
