"""Scores of a run: accuracy (headline as each benchmark defines it), per-category
breakdowns, realized compression ratio per video averaged, retention against a base run,
and the first answer token's measurements (`FirstTokenScorer`, a scorer of the runner).

    scorer = FirstTokenScorer(HFBackend(model, processor))         # the uncompressed model
    run_benchmark(config, backend, run_dir, scorers=[scorer])      # + first_token_* fields
    summary["scores"]["first_token_kl_mean"], ...["first_token_kl_se"]      # nats
    drop, se = paired_records(other_records, my_records, "first_token_kl")  # mean, SE

The first answer token's distribution is the model's next-token distribution right after
the prompt: for MVBench prompts, the option letter. Its KL(uncompressed || compressed) says
how much of the answer a compressor changed; the most likely option letter among the
item's options is what a greedy reply starts with. Both are per item, so two methods on
the same items are compared by the paired difference, whose standard error is far smaller
than either method's own.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from statistics import mean, stdev
from typing import TYPE_CHECKING, Any

from craft_eval.tasks import Benchmark, Item, Prompt
from craft_eval.tasks.parsing import strip_reasoning

if TYPE_CHECKING:
    import torch

    from craft_eval.runner import Generation


def summarize(records: list[dict[str, Any]], benchmark: Benchmark) -> dict[str, Any]:
    """Summary of the item records of ONE benchmark run (see `runner` for the record fields).

    - `accuracy` (percent): plain accuracy over scored items, or the mean of per-group
      accuracies for benchmarks with `macro_over` (MVBench tasks, MLVU M-Avg).
    - `micro_accuracy`: correct / scored over all items.
    - `breakdowns`: {field: {value: {"accuracy", "n"}}}.
    - `comp_ratio`: the paper's "Comp.": N_f / N_c per VIDEO, averaged over the videos.
    - errors (undecodable videos ...) count as wrong and are listed in `errors`.
    - lmms-eval's aggregation rules: MVBench leaves empty replies out of the denominators
      (`skip_empty_replies`); MLVU's headline divides by its 7 task types (`macro_groups`).
    - `first_token_*` where the records carry `FirstTokenScorer`'s fields.
    """
    ok = [r for r in records if r.get("status") == "ok"]
    errors = [r for r in records if r.get("status") != "ok"]

    def counted(r: dict[str, Any]) -> bool:
        if not r.get("gold"):
            return False
        if benchmark.skip_empty_replies and r.get("status") == "ok":
            return strip_reasoning(r.get("reply")) != ""
        return True

    def acc(rows: list[dict[str, Any]]) -> float | None:
        rows = [r for r in rows if counted(r)]
        if not rows:
            return None
        return 100.0 * sum(bool(r.get("correct")) for r in rows) / len(rows)

    breakdowns: dict[str, dict[str, dict[str, Any]]] = {}
    for key in benchmark.breakdowns:
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in records:
            groups[str(r.get("categories", {}).get(key, ""))].append(r)
        breakdowns[key] = {
            g: {"accuracy": acc(rows), "n": len(rows)} for g, rows in sorted(groups.items())
        }
    micro = acc(records)
    return {
        "benchmark": benchmark.name,
        "accuracy": _headline(benchmark, breakdowns, micro),
        "micro_accuracy": micro,
        "headline": f"mean over {benchmark.macro_over}" if benchmark.macro_over else "accuracy",
        "n_items": len(records),
        "n_scored": sum(1 for r in records if counted(r)),
        "n_errors": len(errors),
        "errors": [{"id": r.get("id"), "error": r.get("error")} for r in errors],
        "breakdowns": breakdowns,
        **_efficiency(ok),
        "frames_capped": sum(1 for r in ok if r.get("frames_capped")),
        **_first_token(ok),
    }


def _headline(
    benchmark: Benchmark, breakdowns: dict[str, dict[str, dict[str, Any]]], micro: float | None
) -> float | None:
    """The benchmark's headline accuracy: micro, or the mean over its `macro_over` groups
    (a fixed list of groups, missing ones counting 0, where `macro_groups` names them)."""
    if benchmark.macro_over and benchmark.macro_groups:
        per_group = breakdowns.get(benchmark.macro_over, {})
        return mean(
            [(per_group.get(g) or {}).get("accuracy") or 0.0 for g in benchmark.macro_groups]
        )
    if benchmark.macro_over and breakdowns.get(benchmark.macro_over):
        values = [v["accuracy"] for v in breakdowns[benchmark.macro_over].values()]
        values = [v for v in values if v is not None]
        return mean(values) if values else None
    return micro


def _efficiency(ok: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-run efficiency fields of the answered items: `comp_ratio` (N_f / N_c per
    video, averaged over videos), token, time, KV and prefill-length means."""
    per_video: dict[str, list[float]] = defaultdict(list)
    tokens_in, tokens_out = [], []
    for r in ok:
        if r.get("tokens_before") and r.get("tokens_after"):
            key = f"{r.get('video')}|{r.get('segment')}"
            per_video[key].append(r["tokens_before"] / r["tokens_after"])
            tokens_in.append(r["tokens_before"])
            tokens_out.append(r["tokens_after"])
    compress_ms = [r["compress_ms"] for r in ok if r.get("compress_ms") is not None]
    prefill_ms = [r["prefill_ms"] for r in ok if r.get("prefill_ms") is not None]
    kv_mb = [r["extra"]["kv_mb"] for r in ok if r.get("extra", {}).get("kv_mb") is not None]
    seq = [r["extra"]["prefill_len"] for r in ok if r.get("extra", {}).get("prefill_len")]
    return {
        "comp_ratio": mean(mean(v) for v in per_video.values()) if per_video else None,
        "tokens_before_mean": mean(tokens_in) if tokens_in else None,
        "tokens_after_mean": mean(tokens_out) if tokens_out else None,
        "compress_ms_mean": mean(compress_ms) if compress_ms else None,
        "prefill_ms_mean": mean(prefill_ms) if prefill_ms else None,
        "kv_mb_mean": mean(kv_mb) if kv_mb else None,
        "prefill_len_mean": mean(seq) if seq else None,
    }


def retention(accuracy: float | None, base_accuracy: float | None) -> float | None:
    """`acc / acc_base` in percent, against the uncompressed run of the same backbone."""
    if accuracy is None or not base_accuracy:
        return None
    return 100.0 * accuracy / base_accuracy


def _first_token(ok: list[dict[str, Any]]) -> dict[str, Any]:
    """Means of `FirstTokenScorer`'s fields over the answered items that carry them: the
    first-token accuracy (fraction) with its binomial standard error, the mean KL (nats)
    with the standard error of the mean. Nothing when no record carries them."""
    kl = [float(r["first_token_kl"]) for r in ok if r.get("first_token_kl") is not None]
    hits = [float(r["first_token_correct"]) for r in ok if "first_token_correct" in r]
    if not kl:
        return {}
    p = mean(hits) if hits else None
    return {
        "first_token_n": len(kl),
        "first_token_accuracy": p,
        "first_token_accuracy_se": None if p is None else math.sqrt(p * (1 - p) / len(hits)),
        "first_token_kl_mean": mean(kl),
        "first_token_kl_se": _stdev(kl) / math.sqrt(len(kl)),
    }


def _stdev(values: Sequence[float]) -> float:
    """Sample standard deviation (n - 1); 0 for fewer than 2 values."""
    return stdev(values) if len(values) > 1 else 0.0


def paired(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Mean of `a - b` over paired values and the standard error of that mean
    (`std / sqrt(n)`)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"need two series of >= 2 paired values, got {len(a)} and {len(b)}")
    d = [float(x) - float(y) for x, y in zip(a, b)]
    return math.fsum(d) / len(d), _stdev(d) / math.sqrt(len(d))


def paired_records(
    a: list[dict[str, Any]], b: list[dict[str, Any]], field: str
) -> tuple[float, float]:
    """`paired` of `field` (e.g. "first_token_kl", "first_token_correct") over the items
    both runs' records carry it for, matched by item id: mean of a - b and its SE."""
    values = {r["id"]: r[field] for r in b if r.get(field) is not None}
    both = [(float(r[field]), float(values[r["id"]])) for r in a if r.get(field) is not None
            and r["id"] in values]  # fmt: skip
    return paired([x for x, _ in both], [y for _, y in both])


def kl_to(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """`KL(reference || other)` over the last dim of two log-probability tensors `[..., V]`:
    `[...]`."""
    if reference.shape != other.shape:
        raise ValueError(f"shapes differ: {tuple(reference.shape)} vs {tuple(other.shape)}")
    return (reference.exp() * (reference - other)).sum(-1)


def _answer_key(item: Item, prompt: Prompt) -> tuple[str, str]:
    return (item.id, prompt.text + prompt.assistant_prefix)


class FirstTokenScorer:
    """A scorer of the runner (`run_benchmark(..., scorers=[...])`): per answered item,
    `first_token_kl` (KL(uncompressed || this backend) of the first answer token, nats) and
    `first_token_correct` (its most likely option letter among the item's options is the
    gold one).

    Args:
        reference: the uncompressed model as a backend with `first_token_logprobs(item,
            prompt) -> [V]` (an `HFBackend` with method "none"); its answers are computed
            once per item and prompt, and a run with `reference` itself as its backend has
            KL 0 exactly.
        tokenizer: maps the option letters to token ids (`processor.tokenizer`).
    """

    def __init__(self, reference: Any, tokenizer: Any) -> None:
        self.reference = reference
        self.tokenizer = tokenizer
        self._answers: dict[tuple[str, str], torch.Tensor] = {}

    def reference_logprobs(self, item: Item, prompt: Prompt) -> torch.Tensor:
        """The uncompressed model's first-token log-probabilities `[V]` (cached; from its own
        generation when the reference run came first)."""
        key = _answer_key(item, prompt)
        if key not in self._answers:
            self._answers[key] = self.reference.first_token_logprobs(item, prompt)
        return self._answers[key]

    def __call__(
        self, item: Item, prompt: Prompt, backend: Any, generation: Generation
    ) -> dict[str, Any]:
        if backend is self.reference and generation.first_logprobs is not None:
            self._answers.setdefault(_answer_key(item, prompt), generation.first_logprobs)
        ref = self.reference_logprobs(item, prompt)
        mine = ref if backend is self.reference else generation.first_logprobs
        if mine is None:  # a backend that keeps no logits from its generation: one more prefill
            mine = backend.first_token_logprobs(item, prompt)
        letters = [self.tokenizer.convert_tokens_to_ids(c) for c in item.letters]
        best = item.letters[int(mine[letters].argmax())]
        out: dict[str, Any] = {"first_token_kl": float(kl_to(ref, mine))}
        if item.answer:
            out["first_token_correct"] = best == item.answer
        return out
