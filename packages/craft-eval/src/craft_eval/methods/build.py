"""One way from a method name to a compressor: `check_method` and `build_compressor`.

`craft-eval run` (HFBackend), the lmms-eval plugin, the demo and `craft-eval efficiency`
all build their compressor here:

    compressor = build_compressor("visionzip", hidden_size=2560)   # a TimedCompressor
    model = craft_adapters.wrap(hf_model, compressor, budget=TokenBudget(ratio=8))

One registry lookup, one argument check (`check_method`: the name, the option keys, the
checkpoint) and one timing wrapper. `TimedCompressor` is a `craft_core.TokenCompressor` that
declares the `needs_attention` of the method it wraps (and forwards its other attributes,
`hidden_size`, ...), so an attention-using method gets the vision tower's attention through
every path. Errors name the argument as the caller spells
it (`Spelling`: `--method-arg` on the command line, `model_args` in lmms-eval).
"""

from __future__ import annotations

import hashlib
import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from craft_core import CompressionResult, TokenBudget, TokenCompressor
from craft_eval.methods.ahead import AheadResults, Pending
from craft_eval.methods.registry import MethodInfo, get_method_info, list_methods

__all__ = [
    "CLI",
    "MODEL_ARGS",
    "CallRecord",
    "RowLog",
    "Spelling",
    "TimedCompressor",
    "build_compressor",
    "check_method",
    "result_digest",
    "row_logs",
]


@dataclass(frozen=True)
class Spelling:
    """How a caller names the method arguments in its error messages."""

    method: str = "method="
    checkpoint: str = "checkpoint="
    option: str = "option "
    untrained: str = "allow_untrained=True"


CLI = Spelling("--method ", "--checkpoint ", "--method-arg ", "--allow-untrained")
MODEL_ARGS = Spelling(
    "model_args method=", "model_args checkpoint=", "model_args ", "allow_untrained=true"
)


def _options_of(info: MethodInfo) -> set[str]:
    """The option names `info.factory` takes: `info.options` where the registry names them
    (a baseline's settings), else its signature (CRAFT's factories: every CraftConfig field
    and run option)."""
    if info.options is not None:
        return set(info.options)
    params = inspect.signature(info.factory).parameters.values()
    allowed = {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    if any(p.kind is p.VAR_KEYWORD and p.name == "overrides" for p in params):
        from craft_core import CraftConfig
        from craft_core.runtime import RunOptions

        allowed |= set(CraftConfig.model_fields) | set(RunOptions.model_fields) | {"device"}
    return allowed


def check_method(
    method: str,
    options: dict[str, Any] | None = None,
    *,
    allow_untrained: bool = False,
    spelling: Spelling = Spelling(),
) -> MethodInfo | None:
    """The registry entry of `method` (None for "none") after checking its arguments.

    `options` are the factory's keyword arguments (`checkpoint` among them). Refused, with a
    ValueError naming the argument: an unknown method, an option the factory does not take,
    a method that needs a trained checkpoint without one (unless `allow_untrained`: plumbing
    checks with a fresh random module), a checkpoint that is not an existing folder.
    """
    options = dict(options or {})
    if method == "none":
        if options.get("checkpoint") is not None:
            raise ValueError(f"{spelling.checkpoint.strip()} needs a method (not 'none')")
        if options:
            raise ValueError(f"{spelling.option}{sorted(options)[0]} needs a method (not 'none')")
        return None
    try:
        info = get_method_info(method)
    except KeyError:
        known = ", ".join(m.name for m in list_methods())
        raise ValueError(f"{spelling.method}{method} is unknown; known: none, {known}") from None
    allowed = _options_of(info)
    unknown = sorted(set(options) - allowed)
    if unknown == ["checkpoint"]:
        raise ValueError(f"{spelling.checkpoint.strip()} is not used by {method}")
    if unknown:
        known = ", ".join(sorted(allowed - {"checkpoint", "hidden_size"})) or "none"
        raise ValueError(
            f"{spelling.option}{unknown[0]}: {method} has no such option; known: {known}"
        )
    checkpoint = options.get("checkpoint")
    if "checkpoint" in info.needs and checkpoint is None and not allow_untrained:
        raise ValueError(
            f"{spelling.method}{method} needs {spelling.checkpoint}PATH (a trained merge "
            f"module); {spelling.untrained} runs a fresh untrained one for plumbing checks"
        )
    if checkpoint is not None and not _folder_or_hub_id(str(checkpoint)):
        raise ValueError(
            f"{spelling.checkpoint}{checkpoint}: no such folder, and not a Hub id "
            "('org/name' or 'org/name@revision')"
        )
    return info


def _folder_or_hub_id(checkpoint: str) -> bool:
    """True for an existing folder or a well-formed Hub id ("org/name", "org/name@rev");
    whether the id exists (or is cached, offline) is huggingface_hub's to say when loading."""
    if Path(checkpoint).is_dir():
        return True
    if Path(checkpoint).exists():
        return False  # a file: a checkpoint is a folder
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    repo_id = checkpoint.partition("@")[0]
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return False
    return repo_id.count("/") == 1


def build_compressor(
    method: str,
    options: dict[str, Any] | None = None,
    *,
    hidden_size: int | None = None,
    allow_untrained: bool = False,
    spelling: Spelling = Spelling(),
) -> TimedCompressor | None:
    """The registered `method` built with `options`, timed (None for "none").

    `hidden_size` (the language model's width) goes to factories that take it. A checkpoint
    that cannot be loaded raises a ValueError naming it.
    """
    info = check_method(method, options, allow_untrained=allow_untrained, spelling=spelling)
    if info is None:
        return None
    kwargs = dict(options or {})
    if hidden_size is not None and "hidden_size" in _options_of(info):
        kwargs.setdefault("hidden_size", int(hidden_size))
    try:
        built = info.factory(**kwargs)
    except Exception as error:
        checkpoint = kwargs.get("checkpoint")
        if checkpoint is None:
            raise
        raise ValueError(
            f"{spelling.checkpoint}{checkpoint}: cannot be loaded ({error})"
        ) from error
    return TimedCompressor(built)


def result_digest(result: Any) -> str:
    """sha256 (16 hex) of a result's kept indices and its features (as float32): equal
    digests mean the same tokens were kept with the same rows."""
    h = hashlib.sha256()
    h.update(result.kept_index.detach().to("cpu", torch.int64).contiguous().numpy().tobytes())
    h.update(result.features.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass
class CallRecord:
    """One video's compression: its time (its share, by token count, of a batched
    `compress_many` call) and what it kept (on the CPU)."""

    ms: float
    coords: torch.Tensor
    kept_index: torch.Tensor
    assignment: torch.Tensor
    digest: str
    importance: str | None = None  # what ranked the tokens, where the method records it
    batch: int = 1  # videos in the compressor call it came from (> 1: computed ahead)


class TimedCompressor:
    """A built method, timed per call; `calls` records each video (one `CallRecord` a video,
    also for the videos of one `compress_many` call).

    A `craft_core.TokenCompressor` declaring what the method declares (`needs_attention`);
    other attributes (`hidden_size`, ...) are the method's.
    """

    def __init__(self, method: TokenCompressor) -> None:
        self.method = method
        self.calls: list[CallRecord] = []
        self.ahead = AheadResults()  # videos compressed ahead of their questions (ahead.py)

    def __getattr__(self, name: str) -> Any:
        if name == "method":  # not yet set (copy / unpickle): no recursion
            raise AttributeError(name)
        return getattr(self.method, name)

    @property
    def needs_attention(self) -> bool:
        return bool(self.method.needs_attention)

    @property
    def batches(self) -> bool:
        """The method has its own batched entry (CRAFT's `compress_many`): computing videos
        ahead of their questions (`compute_ahead`) pays."""
        return callable(getattr(self.method, "compress_many", None))

    @property
    def elapsed_ms(self) -> float:
        """Total time of the calls since the last `reset()`."""
        return sum(call.ms for call in self.calls)

    @property
    def last(self) -> CallRecord | None:
        return self.calls[-1] if self.calls else None

    def reset(self) -> None:
        self.calls = []

    def __call__(
        self,
        features: torch.Tensor,
        coords: torch.Tensor,
        budget: TokenBudget,
        *,
        importance: torch.Tensor | None = None,
    ) -> CompressionResult:
        if self.ahead.capture is not None:
            self.ahead.record([features], [coords], budget)
        if importance is None and (taken := self.ahead.take(features, coords, budget)):
            result, ms, batch = taken
            self.calls.append(_record(ms, coords, result, batch=batch))
            return result
        _sync(features.device)
        start = time.perf_counter()
        result = self.method(features, coords, budget, importance=importance)
        _sync(features.device)
        ms = (time.perf_counter() - start) * 1000.0
        self.calls.append(_record(ms, coords, result))
        return result

    def compress_many(
        self,
        features: Sequence[torch.Tensor],
        coords: Sequence[torch.Tensor],
        budget: TokenBudget,
        *,
        importance: Sequence[torch.Tensor | None] | None = None,
    ) -> list[CompressionResult]:
        """Several videos in ONE call of the method's own batched entry (CRAFT's
        `compress_many`), timed as one: each video's `CallRecord` gets the call's time shared
        by token counts (`elapsed_ms` is the call's time). A method without one: one timed
        call a video (`__call__`), as `craft_core.compress_many` does. Videos computed ahead
        (`compute_ahead`) are taken from there when every one of the call's videos was."""
        features, coords = list(features), list(coords)
        if self.ahead.capture is not None:
            self.ahead.record(features, coords, budget)
        if not self.batches:
            imps = list(importance) if importance is not None else [None] * len(features)
            return [self(f, c, budget, importance=i) for f, c, i in zip(features, coords, imps)]
        if not features:
            return []
        if importance is None or all(i is None for i in importance):
            taken = [self.ahead.take(f, c, budget) for f, c in zip(features, coords)]
            if all(t is not None for t in taken):
                done = [t for t in taken if t is not None]
                self.calls += [_record(ms, c, r, batch=b) for (r, ms, b), c in zip(done, coords)]
                return [r for r, _, _ in done]
        results, shares = self._timed_many(features, coords, budget, importance)
        size = len(features)
        self.calls += [_record(ms, c, r, batch=size) for ms, c, r in zip(shares, coords, results)]
        return results

    def compute_ahead(self, pending: Sequence[Pending]) -> None:
        """Compress `pending` videos (recorded by `ahead.capturing()`) in ONE call of the
        method's batched entry per budget; a later call with a video's same features, coords
        and budget takes its result and its share of the time. Results not taken by the
        next `compute_ahead` are dropped (an empty `pending` drops them all)."""
        self.ahead.ready = []
        for budget in {p.budget: None for p in pending}:  # first-seen order
            group = [p for p in pending if p.budget == budget]
            feats, coords = [p.features for p in group], [p.coords for p in group]
            results, shares = self._timed_many(feats, coords, budget, None)
            self.ahead.ready += [(p, r, ms, len(group)) for p, r, ms in zip(group, results, shares)]

    def _timed_many(
        self,
        features: list[torch.Tensor],
        coords: list[torch.Tensor],
        budget: TokenBudget,
        importance: Sequence[torch.Tensor | None] | None,
    ) -> tuple[list[CompressionResult], list[float]]:
        """The method's `compress_many` on the videos, timed: (results, each video's share
        of the call's ms by token count)."""
        _sync(features[0].device)
        start = time.perf_counter()
        own = self.method.compress_many  # type: ignore[attr-defined]
        results = list(own(features, coords, budget, importance=importance))
        _sync(features[0].device)
        ms = (time.perf_counter() - start) * 1000.0
        total = sum(int(f.shape[0]) for f in features) or 1
        return results, [ms * int(f.shape[0]) / total for f in features]


def _record(
    ms: float, coords: torch.Tensor, result: CompressionResult, *, batch: int = 1
) -> CallRecord:
    """What one video's compression left (on the CPU), timed `ms`, from a call of `batch`
    videos."""
    return CallRecord(
        ms=ms,
        coords=coords.detach().cpu(),
        kept_index=result.kept_index.detach().cpu(),
        assignment=result.assignment.detach().cpu(),
        digest=result_digest(result),
        importance=(result.info or {}).get("importance"),
        batch=batch,
    )


@dataclass
class RowLog:
    """What compression did to one batch row (one benchmark item, one lmms-eval request):
    its videos' tokens before and after, the compressor's time on them and, per video, what
    it kept (`CallRecord.digest`: tokens and rows), what ranked the tokens and the rounds."""

    tokens_before: int
    tokens_after: int
    compression_ms: float = 0.0
    kept_digests: list[str] = field(default_factory=list)
    importance: list[str] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    #: a two-stage method's stage inside the LM (`craft_eval.in_model.in_model_fields`)
    in_model: dict[str, Any] = field(default_factory=dict)


def row_logs(
    report: Any, compressor: TimedCompressor | None, video_tokens: Sequence[int]
) -> list[RowLog]:
    """One `RowLog` per batch row of the last forward or `generate()`, the one compression
    log of `craft-eval run` (`HFBackend`) and of the lmms-eval plugin.

    Args:
        report: the wrapped model's `last_compression` (craft-adapters' report: its
            `videos` in call order, each with `batch_index`, `tokens_before`,
            `tokens_after`, `rounds`), or None.
        compressor: the timed compressor of that call (its `calls`: one per video, in the
            report's order), or None for the uncompressed model.
        video_tokens: per row, its video tokens in the input: the row's counts, unchanged,
            where nothing was compressed (no report, or a report without videos).
    """
    if report is None or not report.videos:
        return [RowLog(int(n), int(n)) for n in video_tokens]
    rows = [RowLog(0, 0) for _ in video_tokens]
    calls = compressor.calls if compressor is not None else []
    for k, video in enumerate(report.videos):
        row = rows[video.batch_index]
        row.tokens_before += int(video.tokens_before)
        row.tokens_after += int(video.tokens_after)
        row.rounds.append(int(video.rounds))
        if k < len(calls):
            row.compression_ms += calls[k].ms
            row.kept_digests.append(calls[k].digest)
            if calls[k].importance:
                row.importance.append(calls[k].importance)
    return rows


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
