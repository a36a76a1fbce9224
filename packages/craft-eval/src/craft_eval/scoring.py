"""Scores of a run: accuracy (headline as each benchmark defines it), per-category
breakdowns, realized compression ratio per video averaged, retention against a base run."""

from __future__ import annotations

from collections import defaultdict
from statistics import mean
from typing import Any

from craft_eval.tasks import Benchmark
from craft_eval.tasks.parsing import strip_reasoning


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
    headline: float | None
    if benchmark.macro_over and benchmark.macro_groups:
        per_group = breakdowns.get(benchmark.macro_over, {})
        fixed = [(per_group.get(g) or {}).get("accuracy") or 0.0 for g in benchmark.macro_groups]
        headline = mean(fixed)
    elif benchmark.macro_over and breakdowns.get(benchmark.macro_over):
        values = [v["accuracy"] for v in breakdowns[benchmark.macro_over].values()]
        values = [v for v in values if v is not None]
        headline = mean(values) if values else None
    else:
        headline = micro

    efficiency = _efficiency(ok)
    return {
        "benchmark": benchmark.name,
        "accuracy": headline,
        "micro_accuracy": micro,
        "headline": f"mean over {benchmark.macro_over}" if benchmark.macro_over else "accuracy",
        "n_items": len(records),
        "n_scored": sum(1 for r in records if counted(r)),
        "n_errors": len(errors),
        "errors": [{"id": r.get("id"), "error": r.get("error")} for r in errors],
        "breakdowns": breakdowns,
        **efficiency,
        "frames_capped": sum(1 for r in ok if r.get("frames_capped")),
    }


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
