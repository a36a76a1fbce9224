"""What the plugin adds to an lmms-eval model: a compressor in front of the language model,
and per-sample compression records in lmms-eval's sample logs.

`CompressedGenerate` replaces the lmms-eval model's `_model`: `generate(**processor_outputs)`
goes through `craft_adapters.wrap(model, compressor, ratio=...)`, everything else reaches the
HF model unchanged. `CraftLMMixin` sits in front of lmms-eval's class in the MRO: it takes the
plugin's own `model_args` (method, checkpoint, ratio, threshold, min_tokens) before lmms-eval's
`__init__` sees them, and after `generate_until` it attaches to each request's
`TokenCounts` the visual tokens before/after, the realized ratio and the compression time.

Requests are matched to batch rows by the documents lmms-eval's own `generate_until` reads
(`self.task_dict[task][split][doc_id]`, once per row, right before the batch's `generate`):
a logging view of `task_dict` records that order, so batches of any size map back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from craft_core import TokenBudget
from craft_eval.methods.build import (
    MODEL_ARGS,
    RowLog,
    TimedCompressor,
    build_compressor,
    check_method,
    row_logs,
)

_BUDGET_NAMES = ("model_args ratio", "model_args threshold", "model_args min_tokens")


def parse_budget(method: str, ratio: Any, threshold: Any, min_tokens: Any) -> TokenBudget | None:
    """The budget from model_args values (None for method=none); errors name the argument."""
    if method == "none":
        if any(v not in (None, "") for v in (ratio, threshold, min_tokens)):
            raise ValueError(
                "model_args ratio/threshold/min_tokens need a method (method=craft, ...)"
            )
        return None
    return TokenBudget.parse(ratio, threshold, min_tokens, names=_BUDGET_NAMES)


def _options(checkpoint: str | None, **stage: Any) -> dict[str, Any]:
    """The method's options from model_args: `checkpoint`, and a two-stage method's `layer`
    (int), `llm_retention` / `llm_merged` (float) where given."""
    out: dict[str, Any] = {"checkpoint": str(checkpoint)} if checkpoint else {}
    for key, value in stage.items():
        if value is None:
            continue
        try:
            out[key] = int(str(value)) if key == "layer" else float(str(value))
        except ValueError:
            kind = "an integer" if key == "layer" else "a number"
            raise ValueError(f"model_args {key}={value!r}: must be {kind}") from None
    return out


def row_fields(row: RowLog) -> dict[str, Any]:
    """The compression fields of one request in lmms-eval's sample log (`token_counts`)."""
    out: dict[str, Any] = {
        "visual_tokens_before": row.tokens_before,
        "visual_tokens_after": row.tokens_after,
        "realized_ratio": round(row.tokens_before / max(1, row.tokens_after), 4),
        "compression_ms": round(row.compression_ms, 3),
    }
    if row.kept_digests:
        out["kept_digests"] = list(row.kept_digests)
    if row.importance:
        out["importance"] = list(row.importance)
    if row.in_model:  # flashvid-llm, holitom-llm: query-dependent
        out["in_model"] = dict(row.in_model)
    return out


class CompressedGenerate:
    """Stands where lmms-eval keeps the HF model: `generate` compresses, the rest delegates.

    `rows` holds one `RowLog` (`methods.build.row_logs`) per row of the last `generate`.
    """

    def __init__(
        self, model: Any, compressor: TimedCompressor | None, budget: TokenBudget | None
    ) -> None:
        import craft_adapters
        from craft_eval.in_model import attach_in_model

        self._hf = model
        self._compressor = compressor
        self._wrapped = craft_adapters.wrap(model, compressor, budget=budget)
        self.in_model = attach_in_model(self._wrapped, compressor)  # two-stage methods
        self._video_token_id = self._wrapped.adapter.video_token_id
        self.rows: list[RowLog] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hf, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrapped(*args, **kwargs)

    @torch.no_grad()
    def generate(self, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError("craft plugin: pass processor outputs to generate() as keywords")
        ids = kwargs.get("input_ids")
        if self._compressor is not None:
            self._compressor.reset()
        out = self._wrapped.generate(**kwargs)
        self.rows = self._records(ids)
        return out

    def _records(self, ids: Any) -> list[RowLog]:
        if not isinstance(ids, torch.Tensor):
            return []
        counts = (ids == self._video_token_id).sum(dim=1).tolist()
        rows = row_logs(self._wrapped.last_compression, self._compressor, counts)
        from craft_eval.in_model import in_model_fields

        stage = in_model_fields(self.in_model).get("in_model")
        if stage and len(rows) == 1:  # the stage takes one prompt per call
            rows[0].in_model = stage
        return rows


class _DocLog:
    """A read-through view of lmms-eval's `task_dict` that logs (task, split, doc_id) reads."""

    def __init__(self, inner: Any, log: list[tuple[Any, ...]], path: tuple[Any, ...] = ()):
        self._inner, self._log, self._path = inner, log, path

    def __getitem__(self, key: Any) -> Any:
        value = self._inner[key]
        if len(self._path) == 2:
            self._log.append((*self._path, key))
            return value
        return _DocLog(value, self._log, (*self._path, key))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __contains__(self, key: Any) -> bool:
        return key in self._inner

    def __iter__(self) -> Any:
        return iter(self._inner)

    def __len__(self) -> int:
        return len(self._inner)


class CraftLMMixin:
    """Put in front of an lmms-eval model class: `class X(CraftLMMixin, LmmsClass)`."""

    _model: Any
    task_dict: Any

    def __init__(
        self,
        *,
        method: str = "none",
        checkpoint: str | None = None,
        ratio: Any = None,
        threshold: Any = None,
        min_tokens: Any = None,
        allow_untrained: bool = False,
        layer: Any = None,
        llm_retention: Any = None,
        llm_merged: Any = None,
        **kwargs: Any,
    ) -> None:
        method = str(method).lower()
        stage = {"layer": layer, "llm_retention": llm_retention, "llm_merged": llm_merged}
        untrained = allow_untrained is True or str(allow_untrained).lower() == "true"
        budget = parse_budget(method, ratio, threshold, min_tokens)
        # checked before the model loads; built (sized to the model) after
        check_method(
            method, _options(checkpoint, **stage), allow_untrained=untrained, spelling=MODEL_ARGS
        )
        super().__init__(**kwargs)
        hf_model = getattr(self, "model", self._model)  # unwrapped from accelerate's wrappers
        compressor = build_compressor(
            method,
            _options(checkpoint, **stage),
            hidden_size=int(hf_model.config.get_text_config().hidden_size),
            allow_untrained=untrained,
            spelling=MODEL_ARGS,
        )
        self._model = CompressedGenerate(hf_model, compressor, budget)
        self.craft_method = method
        self.craft_budget = budget  # the TokenBudget parsed from model_args (None: method=none)

    def generate_until(self, requests: list[Any]) -> list[Any]:
        from lmms_eval.api.instance import GenerationResult

        log: list[tuple[Any, ...]] = []
        original = self.task_dict
        keyed: dict[tuple[Any, ...], list[RowLog]] = {}
        compressed: CompressedGenerate = self._model
        inner_generate = compressed.generate

        def generate(*args: Any, **kwargs: Any) -> Any:
            out = inner_generate(*args, **kwargs)
            rows = compressed.rows
            reads = list(dict.fromkeys(log)) if len(log) != len(rows) else list(log)
            if len(reads) == len(rows):
                for key, row in zip(reads, rows):
                    keyed.setdefault(key, []).append(row)
            log.clear()
            return out

        self.task_dict = _DocLog(original, log) if isinstance(original, Mapping) else original
        compressed.generate = generate  # type: ignore[method-assign]
        try:
            results = super().generate_until(requests)  # type: ignore[misc]
        finally:
            self.task_dict = original
            del compressed.generate
        out = []
        for request, result in zip(requests, results):
            doc_id, task, split = request.args[-3:]
            rows = keyed.get((task, split, doc_id))
            out.append(_with_fields(result, rows.pop(0) if rows else None, GenerationResult))
        self._log_summary([r for r in out if isinstance(r, GenerationResult)])
        return out

    def _log_summary(self, results: list[Any]) -> None:
        """Averages over this call's requests into lmms-eval's `throughput` summary."""
        from lmms_eval.models.model_utils.gen_metrics import log_metrics

        fields = [r.token_counts.craft for r in results if hasattr(r.token_counts, "craft")]
        if not fields:
            return
        extra: dict[str, Any] = {"craft_samples": len(fields)}
        for key in ("visual_tokens_before", "visual_tokens_after", "compression_ms"):
            extra[f"craft_{key}"] = sum(f[key] for f in fields) / len(fields)
        before = sum(f["visual_tokens_before"] for f in fields)
        extra["craft_realized_ratio"] = before / max(
            1, sum(f["visual_tokens_after"] for f in fields)
        )
        log_metrics(
            total_elapsed_time=0.0, total_gen_tokens=0, avg_speed=0.0, additional_metrics=extra
        )


def _with_fields(result: Any, row: RowLog | None, result_cls: Any) -> Any:
    """The request's result with the compression fields in its `TokenCounts`."""
    from lmms_eval.api.instance import TokenCounts

    if isinstance(result, result_cls):
        text, counts = result.text, result.token_counts
    else:
        text, counts = result, None
    if row is None:
        return result
    merged = CraftTokenCounts.make(TokenCounts, counts, row_fields(row))
    return result_cls(text=text, token_counts=merged)


class CraftTokenCounts:
    """Factory of `TokenCounts` subclasses whose `to_dict` adds the compression fields
    (lmms-eval writes `to_dict()` into each sample's `token_counts`)."""

    _cls: Any = None

    @classmethod
    def make(cls, base: type, counts: Any, fields: dict[str, Any]) -> Any:
        if cls._cls is None:

            class _Counts(base):  # type: ignore[valid-type,misc]
                craft: dict[str, Any]

                def to_dict(self) -> dict[str, Any]:
                    return {**super().to_dict(), **self.craft}

            cls._cls = _Counts
        merged = cls._cls(
            input_tokens=getattr(counts, "input_tokens", None),
            output_tokens=getattr(counts, "output_tokens", None),
            reasoning_tokens=getattr(counts, "reasoning_tokens", None),
        )
        merged.craft = dict(fields)
        return merged
