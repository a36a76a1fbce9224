"""One training example -> model inputs, with labels only on the assistant turns.

The video is decoded by `craft_adapters.read_video` (fps, frame cap), or read from a folder
of frames; the first user turn (video + text + assistant prompt) goes through
`craft_adapters.build_inputs`, i.e. the backbone's processor and chat template. The rest is
what the chat template renders after that assistant prompt: each assistant turn (its text
and end-of-turn token) and, in a multi-turn conversation, the user turns between them,
tokenized piece by piece and appended. Labels are the ids on every assistant turn, -100 on
everything else.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from craft_train.config import TrainingConfig
from craft_train.data import SEQUENCE_KEYS, DecodeError, Example

__all__ = [
    "ExampleEncoder",
    "conversation_pieces",
    "make_encoder",
    "read_frame_folder",
    "target_text",
]

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


def conversation_pieces(processor: Any, example: Example) -> list[tuple[str, bool]]:
    """The chat-template text that follows the first assistant prompt, cut into pieces:
    `(text, True)` for an assistant turn (its text and end-of-turn tokens, trained on),
    `(text, False)` for what the template puts between turns (the next user turn and
    assistant prompt). Each piece is the difference between two renderings of the growing
    conversation, so the pieces joined are the template's own text of the whole conversation.

    Raises:
        ValueError: a multi-turn conversation that the template does not render so that each
            shorter conversation is a prefix of the longer one.
    """
    if not example.follow_up and example.system is None:
        return [(target_text(processor, example.prompt, example.target), True)]
    messages: list[dict[str, Any]] = []
    if example.system is not None:
        messages.append({"role": "system", "content": example.system})
    pieces: list[tuple[str, bool]] = []
    previous = None
    for i, (user, reply) in enumerate(((example.prompt, example.target), *example.follow_up)):
        text = [{"type": "text", "text": user}]
        messages.append({"role": "user", "content": [{"type": "video"}, *text] if i == 0 else text})
        head = _render(processor, messages, add_generation_prompt=True)
        messages.append({"role": "assistant", "content": [{"type": "text", "text": reply}]})
        full = _render(processor, messages, add_generation_prompt=False)
        if previous is not None:
            if not head.startswith(previous):
                raise ValueError(f"{example.origin}: the chat template rewrites earlier turns; "
                                 f"turn {i + 1} cannot be trained as a continuation")  # fmt: skip
            pieces.append((head[len(previous) :], False))
        if not (full.startswith(head) and reply in full[len(head) :]):
            raise ValueError(f"{example.origin}: the chat template does not render assistant "
                             f"turn {i + 1} after its assistant prompt")  # fmt: skip
        pieces.append((full[len(head) :], True))
        previous = full
    return pieces


def _render(processor: Any, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    text = processor.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    return text if isinstance(text, str) else text[0]


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

    def read(self, path: str, video_fps: float | None = None) -> tuple[np.ndarray, float]:
        """Frames `[F, H, W, 3]` uint8 at `data.fps` (at most `data.max_frames`) and their
        rate, from a video file or a folder of frames extracted at `video_fps`."""
        from craft_adapters import read_video

        try:
            if Path(path).is_dir():
                frames, fps = read_frame_folder(path, video_fps, self.fps, self.max_frames)
            else:
                frames, fps = read_video(path, fps=self.fps, max_frames=self.max_frames)
        except Exception as err:  # any failure of the decoder is a bad file, not a bug here
            raise DecodeError(f"{type(err).__name__}: {err}") from err
        if frames.ndim != 4 or frames.shape[0] < 1:
            raise DecodeError(f"no frames decoded (shape {frames.shape})")
        return frames, fps

    def __call__(self, example: Example) -> dict[str, Any]:
        ids, labels = [], []
        for text, trained in conversation_pieces(self.processor, example):
            piece = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")
            ids.append(piece["input_ids"])
            labels.append(ids[-1] if trained else torch.full_like(ids[-1], -100))
        answer = torch.cat(ids, dim=-1)
        inputs = self.prompt_inputs(example, int(answer.shape[-1]))
        return _append_target(inputs, answer, torch.cat(labels, dim=-1))

    def prompt_inputs(self, example: Example, target_tokens: int) -> dict[str, Any]:
        """Processor outputs of the video + prompt + assistant prompt (`[1, L]` tensors), with
        frames thinned until `L + target_tokens` fits `data.max_seq_len`."""
        from craft_adapters import build_inputs

        frames, fps = self.read(example.video, example.video_fps)
        for _ in range(4):
            inputs = dict(
                build_inputs(self.processor, frames, fps, example.prompt,
                             system=example.system, max_pixels=self.max_pixels)
            )  # fmt: skip
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


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


def read_frame_folder(
    folder: str, video_fps: float | None, fps: float, max_frames: int
) -> tuple[np.ndarray, float]:
    """A video given as a folder of frame images (sorted by name, numbers compared as
    numbers), extracted at `video_fps`, sampled like a file (`craft_adapters.sample_indices`).
    -> (frames `[F, H, W, 3]` uint8, their rate)."""
    from PIL import Image

    from craft_adapters import sample_indices

    if video_fps is None:
        raise ValueError(f"{folder} is a frame folder: give `video_fps` in its data entry")
    names = sorted(
        (p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES),
        key=lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)],
    )
    if not names:
        raise ValueError(f"frame folder {folder} holds no {'/'.join(IMAGE_SUFFIXES)} image")
    index, rate = sample_indices(len(names), video_fps, fps, max_frames)
    frames = [np.asarray(Image.open(names[i]).convert("RGB")) for i in index]
    sizes = {f.shape for f in frames}
    if len(sizes) > 1:
        raise ValueError(f"frame folder {folder}: frames of different sizes {sorted(sizes)}")
    return np.stack(frames), rate


def _thin(frames: np.ndarray, fps: float, length: int, limit: int) -> tuple[np.ndarray, float]:
    """Fewer frames (an even count, at least 2) so that about `limit` tokens remain."""
    count = frames.shape[0]
    keep = max(2, int(count * limit / length * 0.95) // 2 * 2)
    keep = min(keep, count - 1 if count > 2 else count)
    index = np.rint(np.linspace(0, count - 1, keep)).astype(np.int64)
    log.info("thinning a video from %d to %d frames to fit max_seq_len", count, keep)
    return frames[index], fps * keep / count


def _append_target(
    inputs: dict[str, Any], answer: torch.Tensor, labels: torch.Tensor | None = None
) -> dict[str, Any]:
    """Append the target ids `[1, T]`; labels: -100 on the prompt, then `labels` `[1, T]`
    (default: the ids themselves; -100 where a later user turn sits between replies)."""
    n = int(answer.shape[-1])
    ids = inputs["input_ids"]
    labels = answer if labels is None else labels
    out = dict(inputs)
    out["input_ids"] = torch.cat([ids, answer.to(ids.dtype)], dim=-1)
    out["labels"] = torch.cat([torch.full_like(ids, -100), labels.to(ids.dtype)], dim=-1)
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
