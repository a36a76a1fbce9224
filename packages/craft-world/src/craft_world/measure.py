"""Item-by-item measurements in the world: answer distributions, KL to the uncompressed model.

    items = load_items(make_clips(tmp, 200, split="test"), task=None)
    ref = answer_logprobs(model, processor, items)                         # uncompressed
    a = evaluate(model, processor, items, ref, trained, ratio=8.0)         # a Score
    b = evaluate(model, processor, items, ref, divprune, ratio=8.0)
    a.accuracy, a.accuracy_se, a.kl_mean, a.kl_se                          # fractions, nats
    drop, se = paired(b.kl, a.kl)                                          # mean, std. error

The answer distribution of an item is the model's next-token distribution at the first
answer position (right after the assistant prompt): for MVBench prompts, the option letter.
Accuracy is its most likely option letter (what a greedy reply starts with); the first-token
KL(uncompressed || compressed) says how much of the answer a compressor changed. Both are per
item, so two methods on the same items are compared by the paired difference, whose standard
error is far smaller than either method's own. The demo, craft-eval's
`scripts/world_table.py` and craft-train's `distill_world` benchmark all measure through this
module.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from craft_world.clips import VIDEO_FOLDER, mvbench_prompt

__all__ = [
    "Item",
    "Score",
    "accuracy",
    "answer_logprobs",
    "evaluate",
    "kl_to",
    "load_items",
    "paired",
    "score",
]


@dataclass(frozen=True)
class Item:
    """One held-out question: the clip, the full prompt text, the right option letter."""

    video: str
    prompt: str
    answer: str
    task: str


def load_items(root: str | Path, task: str | None = "object_existence") -> list[Item]:
    """The questions `make_clips` wrote under `root` (one task, or every task with None)."""
    root = Path(root)
    files = sorted((root / "json").glob("*.json"))
    if task is not None:
        files = [f for f in files if f.stem == task]
    if not files:
        raise FileNotFoundError(f"no json/{task or '*'}.json under {root}")
    items = []
    for path in files:
        for i, rec in enumerate(_records(path)):
            try:
                letter = "ABCDE"[rec["candidates"].index(rec["answer"])]
                item = Item(
                    video=str(root / "video" / VIDEO_FOLDER / rec["video"]),
                    prompt=mvbench_prompt(rec["question"], rec["candidates"]),
                    answer=letter,
                    task=path.stem,
                )
            except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
                what = f"missing field {error}" if isinstance(error, KeyError) else str(error)
                raise ValueError(
                    f"{path}: record {i}: {what} (needs video, question, candidates (at most "
                    "5) and an answer among them)"
                ) from None
            items.append(item)
    return items


def _records(path: Path) -> list[Any]:
    """The JSON list of records in `path`; ValueError naming the file otherwise."""
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a JSON list of records ({error})") from None
    if not isinstance(records, list):
        raise ValueError(f"{path}: not a JSON list of records ({type(records).__name__})")
    return records


_INPUTS: dict[tuple[int, str, str], Any] = {}


def _inputs(processor: Any, item: Item) -> Any:
    from craft_adapters import build_inputs, read_video

    key = (id(processor), item.video, item.prompt)
    if key not in _INPUTS:
        video = read_video(item.video, fps=2.0)
        _INPUTS[key] = build_inputs(processor, video.frames, video.fps, item.prompt)
    return _INPUTS[key]


@torch.no_grad()
def answer_logprobs(
    model: Any,
    processor: Any,
    items: Sequence[Item],
    compressor: Callable[..., Any] | None = None,
    ratio: float | None = None,
) -> torch.Tensor:
    """Log-probabilities of the first answer token of every item: `[n, V]` float32.

    Args:
        model: the world backbone (an HF VLM, not wrapped).
        processor: its processor.
        items: from `load_items`.
        compressor: a CRAFT `CraftCompressor` or any craft-eval baseline callable; None for
            the uncompressed model.
        ratio: compression ratio (required with a compressor).
    """
    from craft_adapters import wrap

    if compressor is not None and ratio is None:
        raise ValueError("ratio: give the compression ratio with a compressor")
    runner = wrap(model, compressor, ratio=ratio) if compressor is not None else model
    was_training = model.training
    model.eval()
    if isinstance(compressor, torch.nn.Module):
        compressor.eval()
    rows = []
    for item in items:
        logits = runner(**_inputs(processor, item)).logits[0, -1]
        rows.append(torch.log_softmax(logits.float(), dim=-1))
    model.train(was_training)
    return torch.stack(rows)


def kl_to(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """`KL(reference || other)` per row of two `[n, V]` log-probability tensors: `[n]`."""
    if reference.shape != other.shape:
        raise ValueError(f"shapes differ: {tuple(reference.shape)} vs {tuple(other.shape)}")
    return (reference.exp() * (reference - other)).sum(-1)


def paired(
    a: torch.Tensor | Sequence[float], b: torch.Tensor | Sequence[float]
) -> tuple[float, float]:
    """Mean of `a - b` over items and the standard error of that mean (`std / sqrt(n)`)."""
    d = torch.as_tensor(a, dtype=torch.float64) - torch.as_tensor(b, dtype=torch.float64)
    if d.ndim != 1 or d.numel() < 2:
        raise ValueError(f"need two 1-D series of >= 2 paired values, got shape {tuple(d.shape)}")
    return float(d.mean()), float(d.std(unbiased=True) / math.sqrt(d.numel()))


def accuracy(logprobs: torch.Tensor, items: Sequence[Item], processor: Any) -> torch.Tensor:
    """Per item 1.0 where the most likely option letter is the right one: `[n]`."""
    tok = processor.tokenizer
    hits = []
    for row, item in zip(logprobs, items):
        n_options = item.prompt.count("\n(")
        letters = [tok.convert_tokens_to_ids(c) for c in "ABCDE"[:n_options]]
        hits.append(float("ABCDE"[int(row[letters].argmax())] == item.answer))
    return torch.tensor(hits)


@dataclass(frozen=True)
class Score:
    """One method at one ratio on `n` items: `hits` `[n]` (0/1) and `kl` `[n]` (nats)."""

    hits: torch.Tensor
    kl: torch.Tensor

    @property
    def n(self) -> int:
        return int(self.hits.numel())

    @property
    def accuracy(self) -> float:
        """Fraction of items whose most likely option letter is right."""
        return float(self.hits.double().mean())

    @property
    def accuracy_se(self) -> float:
        """Binomial standard error of `accuracy`."""
        p = self.accuracy
        return math.sqrt(p * (1 - p) / max(1, self.n))

    @property
    def kl_mean(self) -> float:
        """Mean first-token KL(uncompressed || this method) over the items."""
        return float(self.kl.double().mean())

    @property
    def kl_se(self) -> float:
        """Standard error of `kl_mean`."""
        return float(self.kl.double().std(unbiased=True) / math.sqrt(max(1, self.n)))


def score(
    reference: torch.Tensor, logprobs: torch.Tensor, items: Sequence[Item], processor: Any
) -> Score:
    """A method's `Score` from its first-token log-probabilities `[n, V]` and the
    uncompressed model's `reference` `[n, V]`."""
    return Score(accuracy(logprobs, items, processor), kl_to(reference, logprobs))


def evaluate(
    model: Any,
    processor: Any,
    items: Sequence[Item],
    reference: torch.Tensor,
    compressor: Callable[..., Any] | None = None,
    ratio: float | None = None,
) -> Score:
    """`score` of `compressor` at `ratio` (None: uncompressed) against `reference` `[n, V]`
    (`answer_logprobs(model, processor, items)`)."""
    lp = answer_logprobs(model, processor, items, compressor, ratio)
    return score(reference, lp, items, processor)
