"""The model backend: reader -> processor -> adapter (compressor inside) -> generate.

`HFBackend` runs a transformers VLM of a backbone craft-adapters supports. Per item it
  1. reads the clip with craft-adapters' reader (fps=2, at most 64 frames by default; the
     question's [start, end] segment where the benchmark gives one),
  2. builds the prompt with the checkpoint's chat template (system prompt and forced reply
     start where the protocol asks for them) and the processor outputs through craft-adapters,
  3. generates greedily through `craft_adapters.wrap(model, compressor, ratio=...)`,
and measures on the way: compression time (the compressor's own call, timed separately),
prefill latency (the language model's first forward inside `generate`: CUDA events on a GPU,
wall clock on CPU) and the KV cache of the prompt (bytes held by the real cache object that
forward returns).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

import numpy as np
import torch

from craft_core import TokenBudget
from craft_eval.efficiency import cache_nbytes
from craft_eval.input_cache import InputCache, Prepared
from craft_eval.methods.build import row_logs
from craft_eval.runner import Generation, VideoDecodeError
from craft_eval.tasks import Item, Prompt


def adapters_status() -> tuple[bool, str]:
    """(usable, what is missing) for the parts of craft-adapters the pipeline needs."""
    try:
        import craft_adapters
    except ImportError as error:
        return False, f"craft-adapters cannot be imported ({error})"
    missing = [n for n in ("wrap", "read_video", "build_inputs") if not hasattr(craft_adapters, n)]
    if missing:
        return False, "craft-adapters lacks " + ", ".join(missing)
    return True, ""


def load_pretrained(path: str | Path, device: str | torch.device | None = None) -> tuple[Any, Any]:
    """A real checkpoint and its processor (bf16 on a GPU, float32 on CPU), in eval mode."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    model: Any = AutoModelForImageTextToText.from_pretrained(str(path), dtype=dtype)
    return model.to(dev).eval(), AutoProcessor.from_pretrained(str(path))


def read_frames(
    path: str, *, fps: float, max_frames: int, segment: tuple[float, float] | None = None
) -> tuple[np.ndarray, float, bool]:
    """Frames uint8 [F, H, W, 3] through craft-adapters' reader, the rate they represent,
    and whether the frame cap bound. Any failure to open or decode raises `VideoDecodeError`.

    With a `segment` (MVBench's [start, end] seconds) the clip is sampled at `fps` over its
    whole length and the frames inside the segment are kept (uniformly thinned to
    `max_frames` when there are more).
    """
    from craft_adapters import read_video

    if not Path(path).is_file():
        raise VideoDecodeError(f"video not found: {path}")
    try:
        if segment is None:
            video = read_video(path, fps=fps, max_frames=max_frames)
            frames, rate = np.asarray(video.frames), float(video.fps)
            capped = rate < fps - 1e-6
        else:
            video = read_video(path, fps=fps, max_frames=1_000_000)
            times = np.asarray(video.timestamps)
            inside = np.nonzero((times >= segment[0]) & (times <= segment[1]))[0]
            if inside.size == 0:  # a segment shorter than one sampling step: nearest frame
                inside = np.array([int(np.argmin(np.abs(times - (segment[0] + segment[1]) / 2)))])
            rate = float(video.fps)
            capped = inside.size > max_frames
            if capped:
                rate *= max_frames / inside.size
                inside = inside[np.rint(np.linspace(0, inside.size - 1, max_frames)).astype(int)]
            frames = np.asarray(video.frames)[inside]
    except Exception as error:  # any reader failure is this item's error, not the run's
        raise VideoDecodeError(f"{path}: {type(error).__name__}: {error}") from error
    if frames.shape[0] == 0:
        raise VideoDecodeError(f"{path}: no frame could be decoded")
    return frames, rate, capped


def build_model_inputs(processor: Any, frames: np.ndarray, fps: float, prompt: Prompt) -> Any:
    """Processor outputs for one video + prompt through craft-adapters' `build_inputs`.

    A forced reply start (MVBench's original protocol) is appended as tokens after the
    assistant prompt.
    """
    from craft_adapters import build_inputs

    inputs = build_inputs(processor, frames, fps, prompt.text, system=prompt.system or None)
    if prompt.assistant_prefix:
        extra = processor.tokenizer(
            prompt.assistant_prefix, add_special_tokens=False, return_tensors="pt"
        )["input_ids"]
        inputs["input_ids"] = torch.cat([inputs["input_ids"], extra], dim=1)
        inputs["attention_mask"] = torch.cat(
            [inputs["attention_mask"], torch.ones_like(extra)], dim=1
        )
        for key in ("mm_token_type_ids", "token_type_ids"):
            if key in inputs:
                inputs[key] = torch.cat([inputs[key], torch.zeros_like(extra)], dim=1)
    return inputs


class _PrefillProbe:
    """Hooks the language model: the first forward of each generate() is the prefill;
    its duration and the size of the cache it returns are recorded."""

    def __init__(self, language_model: torch.nn.Module, device: torch.device) -> None:
        self.device = device
        self.armed = False
        self.prefill_ms: float | None = None
        self.kv_bytes: int | None = None
        self.seq_len: int | None = None
        self._start: Any = None
        language_model.register_forward_pre_hook(self._pre, with_kwargs=True)
        language_model.register_forward_hook(self._post, with_kwargs=True)

    def arm(self) -> None:
        self.armed = True
        self.prefill_ms = self.kv_bytes = self.seq_len = None

    def _pre(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if not self.armed:
            return
        if self.device.type == "cuda":
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()
        embeds = kwargs.get("inputs_embeds")
        ids = kwargs.get("input_ids")
        ref = embeds if embeds is not None else ids
        self.seq_len = int(ref.shape[1]) if ref is not None else None

    def _post(self, module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        if not self.armed:
            return
        self.armed = False
        if self.device.type == "cuda":
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            torch.cuda.synchronize(self.device)
            self.prefill_ms = float(self._start.elapsed_time(end))
        else:
            self.prefill_ms = (time.perf_counter() - self._start) * 1000.0
        cache = getattr(output, "past_key_values", None)
        if cache is not None:
            self.kv_bytes = cache_nbytes(cache, self.seq_len)[0]


def _language_model(model: Any) -> torch.nn.Module:
    inner = getattr(model, "model", model)
    lm = getattr(inner, "language_model", None)
    if lm is None:
        raise ValueError(f"{type(model).__name__}: no .model.language_model to time the prefill")
    return lm  # type: ignore[no-any-return]


class HFBackend:
    """A transformers VLM + a registered compression method, for `run_benchmark`.

    Args:
        model, processor: a transformers VLM of a supported backbone and its processor.
        method: registry name, or "none" for the uncompressed model.
        budget: the `TokenBudget`, passed to the wrapped model as it is; or its fields
            (ratio / threshold / min_tokens), parsed here once.
        method_kwargs: passed to the method's factory (e.g. checkpoint=...).
        merge_map_dir: if given, the first `merge_maps` items' merge data is saved there.
        input_cache: decoded frames and processor outputs shared with the other backends
            of the same model and processor (`InputCache`); None: built for every call.
    """

    def __init__(
        self,
        model: Any,
        processor: Any,
        *,
        method: str = "none",
        ratio: float | None = None,
        threshold: float | None = None,
        min_tokens: int | None = None,
        budget: TokenBudget | None = None,
        method_kwargs: dict[str, Any] | None = None,
        fps: float = 2.0,
        max_frames: int = 64,
        merge_map_dir: str | Path | None = None,
        merge_maps: int = 0,
        input_cache: InputCache | None = None,
    ) -> None:
        import craft_adapters
        from craft_core import budget_of
        from craft_eval.in_model import attach_in_model, in_model_fields
        from craft_eval.methods.build import build_compressor

        self.processor = processor
        self.method = method
        self.fps = fps
        self.max_frames = max_frames
        self.device = next(model.parameters()).device
        self.compressor = build_compressor(
            method,
            method_kwargs,
            hidden_size=int(model.config.get_text_config().hidden_size),
            allow_untrained=True,  # the command line refused untrained runs already
        )
        if self.compressor is None:
            budget = None
        else:
            budget = budget_of(budget, ratio=ratio, threshold=threshold, min_tokens=min_tokens)
        self.model = craft_adapters.wrap(model, self.compressor, budget=budget)
        self.in_model = attach_in_model(self.model, self.compressor)  # two-stage methods
        self._in_model_fields = in_model_fields
        self.probe = _PrefillProbe(_language_model(model), self.device)
        self.merge_map_dir = None if merge_map_dir is None else Path(merge_map_dir)
        self.merge_maps = merge_maps
        self._saved_maps = 0
        self.input_cache = input_cache
        if input_cache is not None and self.compressor is not None:
            self._share_vision(input_cache)

    def _share_vision(self, cache: InputCache) -> None:
        """The wrapped model encodes a clip through `cache.vision`: once for every backend
        sharing `cache` (the same output object: the adapters build new outputs from it,
        never change it). Not for a method that reads the tower's attention: its recording
        needs the tower to run."""
        from craft_adapters.attention import wants_attention

        if wants_attention(self.compressor):
            return
        adapter = self.model.adapter
        encode = adapter.encode_videos

        def shared(inputs: dict[str, Any]) -> Any:
            return cache.vision(inputs.get(adapter.video_pixels_key), lambda: encode(inputs))

        # this backend's adapter only (`wrap` builds one a call)
        adapter.encode_videos = shared  # type: ignore[method-assign]

    def generate(self, item: Item, prompt: Prompt) -> Generation:
        frames, _, capped, inputs = self._prepare(item, prompt)
        if self.compressor is not None:
            self.compressor.reset()
        self.probe.arm()
        with torch.inference_mode():
            out = self.model.generate(
                **inputs,
                max_new_tokens=prompt.max_new_tokens,
                do_sample=False,
                output_logits=True,  # the first step's: scorers need no second prefill
                return_dict_in_generate=True,
            )
        new = out.sequences[:, inputs["input_ids"].shape[1] :]
        reply = self.processor.batch_decode(new, skip_special_tokens=True)[0]
        report = getattr(self.model, "last_compression", None)
        (log,) = row_logs(report, self.compressor, [self._count_video_tokens(inputs)])
        extra: dict[str, Any] = {}
        if log.rounds:
            extra["rounds"] = log.rounds
        batch = (
            max((call.batch for call in self.compressor.calls), default=1) if self.compressor else 1
        )
        if batch > 1:  # computed ahead (prefetch): compress_ms is this video's share
            extra["compress_batch"] = batch
        if log.kept_digests:  # which tokens and rows each video kept (cross-path checks)
            extra["kept_digests"] = log.kept_digests
        if log.importance:  # and what ranked them
            extra["importance"] = log.importance
        if self.probe.kv_bytes is not None:
            extra["kv_mb"] = self.probe.kv_bytes / 2**20
        if self.probe.seq_len is not None:
            extra["prefill_len"] = self.probe.seq_len
        extra.update(self._in_model_fields(self.in_model))
        self._maybe_save_merge_map(item, frames)
        return Generation(
            reply=reply,
            tokens_before=log.tokens_before or None,  # None: no video token found
            tokens_after=log.tokens_after or None,
            num_frames=int(frames.shape[0]),
            frames_capped=capped,
            compress_ms=None if self.compressor is None else log.compression_ms,
            prefill_ms=self.probe.prefill_ms,
            extra=extra,
            first_logprobs=_log_softmax(out.logits[0][0]),
        )

    def prefetch(self, questions: Sequence[tuple[Item, Prompt]]) -> None:
        """Compress the videos of the next `questions` in ONE call of the method's batched
        entry, ahead of their `generate` calls, which take the results (`methods/ahead.py`:
        the same tokens and rows; a record's `compress_ms` is its video's share of that
        call, `compress_batch` the videos in it). Only for a method with its own batched
        entry (CRAFT); a question whose video cannot be read is left to its `generate`.
        Results no `generate` took are dropped at the next call (`prefetch([])`: now)."""
        from craft_eval.methods.ahead import Captured

        compressor = self.compressor
        if compressor is None or not compressor.batches:
            return
        pending = []
        for item, prompt in questions:
            try:
                inputs = self._prepare(item, prompt)[3]
            except VideoDecodeError:
                continue
            # the vision tower runs, then the compressor records the video and stops the call
            with compressor.ahead.capturing() as seen, torch.inference_mode(), suppress(Captured):
                self.model(**inputs, logits_to_keep=1)
            pending.extend(seen)
        compressor.compute_ahead(pending)

    @torch.inference_mode()
    def first_token_logprobs(self, item: Item, prompt: Prompt) -> torch.Tensor:
        """Log-probabilities of the first answer token `[V]` float32 (CPU): one forward of
        the wrapped model (compressor inside) on the item's inputs, the next-token
        distribution right after the prompt (for MVBench prompts, the option letter)."""
        inputs = self._prepare(item, prompt)[3]
        # logits_to_keep=1, as generate's prefill: the same lm_head product, the same bits.
        logits = self.model(**inputs, logits_to_keep=1).logits
        return _log_softmax(logits[0, -1])

    def profile(
        self, item: Item, prompt: Prompt, *, warmup: int = 1, repeats: int = 3
    ) -> dict[str, Any]:
        """Efficiency of one item: the compressed prefill (one forward of the wrapped model)
        `warmup + repeats` times; medians of the prefill (language model only) and of the
        compression time, the prompt's KV cache (MB) and the prefill length."""
        import statistics

        inputs = self._prepare(item, prompt)[3]
        prefill: list[float] = []
        compress: list[float] = []
        for i in range(warmup + repeats):
            if self.compressor is not None:
                self.compressor.reset()
            self.probe.arm()
            with torch.inference_mode():
                self.model(**inputs, use_cache=True)
            if i >= warmup and self.probe.prefill_ms is not None:
                prefill.append(self.probe.prefill_ms)
                if self.compressor is not None:
                    compress.append(self.compressor.elapsed_ms)
        return {
            "prefill_ms": statistics.median(prefill) if prefill else None,
            "compress_ms": statistics.median(compress) if compress else None,
            "kv_mb": None if self.probe.kv_bytes is None else self.probe.kv_bytes / 2**20,
            "prefill_len": self.probe.seq_len,
            "timing": ("CUDA events" if self.device.type == "cuda" else "wall clock")
            + f", median of {repeats} after {warmup} warm-up",
        }

    def _prepare(self, item: Item, prompt: Prompt) -> Prepared:
        """The item's frames, their rate, whether the cap bound, and the processor outputs
        on the model's device: from the shared `input_cache` when there is one."""

        def build() -> Prepared:
            frames, rate, capped = read_frames(
                item.video, fps=self.fps, max_frames=self.max_frames, segment=item.segment
            )
            inputs = build_model_inputs(self.processor, frames, rate, prompt)
            on_device = {
                k: v.to(self.device) if isinstance(v, torch.Tensor) else v
                for k, v in dict(inputs).items()
            }
            return frames, rate, capped, on_device

        if self.input_cache is None:
            return build()
        sampling = (item.segment, prompt, self.fps, self.max_frames, str(self.device))
        return self.input_cache.get(InputCache.key(item.video, *sampling), build)

    def _count_video_tokens(self, inputs: dict[str, Any]) -> int:
        # the backbone's adapter knows its video placeholder (InternVL: the image context token)
        token = self.model.adapter.video_token_id
        return int((inputs["input_ids"] == token).sum())

    def _maybe_save_merge_map(self, item: Item, frames: np.ndarray) -> None:
        if (
            self.merge_map_dir is None
            or self.compressor is None
            or self.compressor.last is None
            or self._saved_maps >= self.merge_maps
        ):
            return
        from craft_eval.report import save_merge_data

        last = self.compressor.last
        save_merge_data(
            self.merge_map_dir / f"merge_map_{self._saved_maps}.npz",
            frames,
            last.coords,
            last.assignment,
            last.kept_index,
            title=f"{self.method} on {item.id}",
        )
        self._saved_maps += 1


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """`[V]` logits of one position -> float32 log-probabilities on the CPU."""
    return torch.log_softmax(logits.float(), dim=-1).cpu()
