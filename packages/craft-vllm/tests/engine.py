"""Run the same videos through vLLM (in process) and through craft-adapters' `generate()`."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import numpy as np
import tiny
import torch

T = TypeVar("T")
ARCH = tiny.ARCH
FPS = 2.0
QUESTION = "What happens?"
NEW_TOKENS = 12
LOGPROBS = 20  # vLLM's top log-probs at the first step, compared with transformers' (logprob_gap)


class CraftCall(NamedTuple):
    """One video through a CRAFT module: its input rows and the rows it kept."""

    features: torch.Tensor  # [N, D] float32 copy of the input rows
    kept: torch.Tensor  # [K] kept_index
    rows: torch.Tensor | None = None  # [K, D] the kept rows as computed (vLLM's side)


class Served(NamedTuple):
    """One request served by vLLM."""

    tokens: list[int]  # greedy new tokens
    length: int  # prompt tokens after compression
    first: dict[int, float]  # the first step's top-LOGPROBS log-probs, by token id


class Reference(NamedTuple):
    """The same request through craft-adapters' `generate()`."""

    tokens: list[int]
    length: int
    margins: list[float]  # top-2 log-prob margin of each step (how far from a tie)
    first: torch.Tensor  # [vocab] the first step's log-probs (float32)
    plan: CraftCall | None = None  # what the CRAFT module was given and kept (None: no module)


def _record_compress_many(compressor: Any, calls: list[CraftCall]) -> Callable[[], None]:
    """Record each video `compressor` compresses through its batched entry (craft-adapters
    calls `craft_core.compress_many`, which runs the compressor's own `compress_many`; a
    forward hook would see nothing). Returns the function that puts the entry back."""
    batched = compressor.compress_many

    def record(features: Any, coords: Any, *args: Any, **kwargs: Any) -> Any:
        results = batched(features, coords, *args, **kwargs)
        for f, r in zip(features, results):
            calls.append(CraftCall(f.detach().float().cpu(), r.kept_index.cpu().clone()))
        return results

    compressor.compress_many = record
    return lambda: delattr(compressor, "compress_many")


@contextlib.contextmanager
def bfloat16_conv1d_in_float32() -> Iterator[None]:
    """While it lasts, a bfloat16 `conv1d` on the CPU is computed in float32 and rounded to
    bfloat16 once. Qwen3.5's reference (transformers' Gated DeltaNet falls back to
    `F.conv1d` for its depthwise causal convolution) spent most of its time there: oneDNN's
    bfloat16 depthwise kernel took 2.6 s a call on this CPU against 5 ms in float32, and the
    products of bfloat16 values are exact in float32 (measured on the tiny Qwen3.5's three
    test videos: the same greedy tokens and bit-identical first-step log-probs, 3.4x faster)."""
    import torch.nn.functional as F

    conv = F.conv1d

    def conv1d(
        input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
        dilation: Any = 1, groups: int = 1,
    ) -> Any:  # fmt: skip
        if input.dtype != torch.bfloat16 or input.device.type != "cpu":
            return conv(input, weight, bias, stride, padding, dilation, groups)
        b = None if bias is None else bias.float()
        out = conv(input.float(), weight.float(), b, stride, padding, dilation, groups)
        return out.to(torch.bfloat16)

    F.conv1d = conv1d
    try:
        yield
    finally:
        F.conv1d = conv


def overrides(
    checkpoint: Path | None, ratio: float | None, kind: Any = tiny, **extra: Any
) -> dict[str, Any]:
    """`hf_overrides` of the CRAFT variant of `kind` (a tiny-model module: `tiny`,
    `tiny_qwen3`); None, None: the unmodified backbone."""
    if checkpoint is None and ratio is None and not extra:
        return {}
    out: dict[str, Any] = {"architectures": [kind.ARCH], **extra}
    if checkpoint is not None:
        out["craft_checkpoint"] = str(checkpoint)
    if ratio is not None:
        out["craft_ratio"] = ratio
    return out


KV_CACHE_BYTES = 256 * 2**20
"""The KV cache of each engine and server the tests start: 256 MiB, some 262,000 tokens of
the tiny Qwen2.5-VL (one request holds at most 2,048). vLLM zeroes it at each start: 1 GiB
(`VLLM_CPU_KVCACHE_SPACE=1`, the smallest the variable gives, and where it is set it wins)
cost ~1 s of CPU an engine, some 26 engines a session."""


def run(
    model: Path,
    hf_overrides: dict[str, Any],
    work: Callable[[Any], T],
    dtype: str = "float32",
    **kwargs: Any,
) -> T:
    """`work(llm)` on a fresh `vllm.LLM` (CPU; float32 for exact greedy comparisons, unless
    the backbone's CPU kernels need another `dtype`).

    The engine is dropped before returning: vLLM tears down its process-wide groups when an
    engine is collected, so no reference may outlive the call (a later engine would lose them).
    """
    from vllm import LLM

    llm = LLM(
        str(model),
        dtype=dtype,
        enforce_eager=True,
        max_model_len=2048,
        hf_overrides=hf_overrides,
        limit_mm_per_prompt={"video": 1, "image": 0},
        seed=0,
        **{"kv_cache_memory_bytes": KV_CACHE_BYTES, **kwargs},
    )
    try:
        return work(llm)
    finally:
        del llm
        gc.collect()


def _craft_state(model: Any) -> dict[str, Any]:
    """Runs inside vLLM's worker: the CRAFT module's weights as the engine holds them."""
    return {k: v.detach().cpu().clone() for k, v in model.craft.state_dict().items()}


def served_craft_state(llm: Any) -> dict[str, Any]:
    """The weights of the CRAFT module inside a running engine (one worker on the CPU)."""
    return llm.apply_model(_craft_state)[0]


def same_weights(served: dict[str, Any], module: Any) -> bool:
    """`served` equals `module`'s weights bit for bit, each cast to the engine's dtype."""
    mine = module.state_dict()
    return served.keys() == mine.keys() and all(
        torch.equal(v, mine[k].to(v.dtype)) for k, v in served.items()
    )


def prompt(question: str = QUESTION, kind: Any = tiny) -> str:
    return kind.processor().apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": question}]}],
        add_generation_prompt=True,
        tokenize=False,
    )


def video_item(frames: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """vLLM's video input: frames + the metadata of frames already sampled at FPS."""
    n = int(frames.shape[0])
    meta = {
        "fps": FPS,
        "total_num_frames": n,
        "frames_indices": list(range(n)),
        "duration": n / FPS,
        "video_backend": "opencv",
        "height": int(frames.shape[1]),
        "width": int(frames.shape[2]),
        "do_sample_frames": False,
    }
    return frames, meta


def served(outputs: list[Any]) -> list[Served]:
    """vLLM's `RequestOutput`s of greedy requests made with `sampling()`."""
    return [
        Served(
            list(o.outputs[0].token_ids),
            len(o.prompt_token_ids),
            {int(t): float(lp.logprob) for t, lp in o.outputs[0].logprobs[0].items()},
        )
        for o in outputs
    ]


def sampling() -> Any:
    """Greedy, NEW_TOKENS tokens, the top LOGPROBS log-probs of each step."""
    from vllm import SamplingParams

    return SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, logprobs=LOGPROBS)


def vllm_generate(
    llm: Any, videos: list[np.ndarray], kind: Any = tiny, uuids: list[str] | None = None
) -> list[Served]:
    """Each video served, all requests in one batch (`uuids`: each video's multimodal id,
    instead of its hash: a new id is never served from vLLM's caches)."""
    text = prompt(kind=kind)
    requests = [{"prompt": text, "multi_modal_data": {"video": video_item(v)}} for v in videos]
    for request, uuid in zip(requests, uuids or []):
        request["multi_modal_uuids"] = {"video": [uuid]}
    return served(llm.generate(requests, sampling()))


def adapters_generate(
    model_dir: Path,
    compressor: Any,
    ratio: float | None,
    videos: list[np.ndarray],
    kind: Any = tiny,
    dtype: torch.dtype = torch.float32,
    threshold: float | None = None,
    positions: str | None = "original",
) -> list[Reference]:
    """craft-adapters' `generate()` on the same folder and videos, one video at a time, with
    the positions vLLM uses (`positions="original"`: for Qwen2.5-VL on transformers 5.x the
    library's default rule starts the text after a video elsewhere; craft-adapters'
    docs/internals.md, "Position-id policy per backbone").
    `positions=None`: the library's default rule (a control).
    """
    from transformers import AutoModelForImageTextToText

    import craft_adapters

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype).eval()
    rule = {} if positions is None else {"positions": positions}
    wrapped = craft_adapters.wrap(model, compressor, ratio=ratio, threshold=threshold, **rule)
    processor = kind.processor()
    calls: list[CraftCall] = []
    if isinstance(compressor, torch.nn.Module):
        restore = _record_compress_many(compressor, calls)
    out = []
    for frames in videos:
        inputs = craft_adapters.build_inputs(processor, frames, FPS, QUESTION)
        with bfloat16_conv1d_in_float32():  # Qwen3.5 in bfloat16: 3.4x faster, same bits
            gen = wrapped.generate(
                **inputs,
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
            )
        new = gen.sequences[0, inputs["input_ids"].shape[1] :].tolist()
        logprobs = [torch.log_softmax(s[0].float(), -1) for s in gen.scores]
        top = [torch.topk(lp, 2).values for lp in logprobs]
        margins = [float(v[0] - v[1]) for v in top]
        eos = kind.IDS["<|im_end|>"]
        if eos in new:  # vLLM stops at EOS and returns it; HF pads after it
            new = new[: new.index(eos) + 1]
        report = wrapped.last_compression
        length = inputs["input_ids"].shape[1]
        if report is not None:
            length = report.sequence_length_after
        plan = calls[-1] if calls else None
        out.append(Reference(new, int(length), margins[: len(new)], logprobs[0], plan))
    if isinstance(compressor, torch.nn.Module):
        restore()
    return out


def compress_payloads(
    model_dir: Path,
    compressor: Any,
    videos: list,
    folder: Path,
    kind: Any = tiny,
    threshold: float = 0.98,
) -> list:
    """Each video compressed by craft-adapters (threshold mode), written to a file and read
    back: the `CompressedVideo`s a server is sent."""
    from transformers import AutoModelForImageTextToText

    import craft_adapters

    dtype = getattr(torch, getattr(kind, "DTYPE", "float32"))
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype)
    wrapped = craft_adapters.wrap(model.eval(), compressor, threshold=threshold)
    folder.mkdir(exist_ok=True)
    out = []
    for i, frames in enumerate(videos):
        inputs = craft_adapters.build_inputs(kind.processor(), frames, FPS, QUESTION)
        (video,) = wrapped.compress_videos(**inputs)
        path = craft_adapters.save_compressed_video(folder / f"{i}.safetensors", video)
        out.append(craft_adapters.load_compressed_video(path))
    return out


def made_as(videos: list, like: Any) -> list:
    """`videos` claiming to be made as `like` (its model_type, hidden_size, craft_sha256): a
    control's payloads, which the server would otherwise refuse by their CRAFT digest."""
    import dataclasses

    made = {k: like.metadata[k] for k in ("model_type", "hidden_size", "craft_sha256")}
    return [dataclasses.replace(v, metadata={**v.metadata, **made}) for v in videos]


def logprob_gap(served: Served, reference: Reference) -> float:
    """Largest |vLLM - transformers| first-step log-prob over vLLM's top LOGPROBS tokens.

    Unlike greedy tokens (a tiny random model gives the same ones for many wrong inputs), this
    sees any change in the rows, positions or weights that reach the first logits."""
    return max(abs(lp - float(reference.first[t])) for t, lp in served.first.items())


GAP = {"float32": 1e-3, "bfloat16": 0.15}
"""Largest first-step log-prob gap allowed between vLLM and transformers on the same input,
by the dtype both run in (measured on these tiny models: craft-vllm's docs/tests.md)."""

CONTROL_GAP = {"float32": 1e-2, "bfloat16": 0.75}
"""Smallest gap a control (a wrong module, payload or position rule) must show: far above
`GAP`, so the verdict does not depend on how a CPU rounds."""


def tie(dtype: str = "float32") -> float:
    """Top-2 log-prob margin under which a greedy step is treated as tied: twice `GAP` (each
    of the two log-probs may be off by `GAP` on another machine's kernels)."""
    return 2 * GAP[dtype]


def compared(margins: list[float], dtype: str = "float32") -> int:
    """Steps `agree` compares: those before the reference's first near-tie."""
    return next((i for i, m in enumerate(margins) if m < tie(dtype)), len(margins))


def agree(
    served: list[int], reference: list[int], margins: list[float], dtype: str = "float32"
) -> bool:
    """Greedy tokens equal up to (not including) the reference's first near-tie step."""
    stop = compared(margins, dtype)
    return served[:stop] == reference[:stop] and (stop < len(reference) or served == reference)


def compare(
    served: list[Served], reference: list[Reference], dtype: str = "float32"
) -> list[float]:
    """Assert vLLM served each request as craft-adapters runs it: the same prompt length,
    first-step log-probs within `GAP[dtype]`, and greedy tokens equal up to the reference's
    first near-tie (in float32 the requests together must compare at least half a request's
    steps; in bfloat16 most steps are within `tie("bfloat16")` of a tie, measured, so there
    the log-probs are the check).

    -> the log-prob gap of each request (printed: `pytest -s` shows the margins)."""
    gaps = [logprob_gap(s, r) for s, r in zip(served, reference)]
    steps = [compared(r.margins, dtype) for r in reference]
    print(f"log-prob gaps ({dtype}): {[f'{g:.2e}' for g in gaps]}, steps compared {steps}")
    assert [s.length for s in served] == [r.length for r in reference]
    assert max(gaps) <= GAP[dtype], gaps
    if dtype == "float32":  # bfloat16 steps are mostly within 2 GAP of a tie: log-probs decide
        assert sum(steps) >= NEW_TOKENS // 2, [r.margins for r in reference]
    same = [agree(s.tokens, r.tokens, r.margins, dtype) for s, r in zip(served, reference)]
    assert same == [True] * len(reference)
    return gaps


def control_gaps(
    served: list[Served],
    reference: list[Reference],
    dtype: str = "float32",
    least: float | None = None,
) -> None:
    """Assert a control is far from the reference: its smallest gap over the requests is at
    least `least` (None: `CONTROL_GAP[dtype]`, set well above `GAP[dtype]`)."""
    gaps = [logprob_gap(s, r) for s, r in zip(served, reference)]
    print(f"control gaps ({dtype}): {[f'{g:.2e}' for g in gaps]}")
    assert min(gaps) >= (CONTROL_GAP[dtype] if least is None else least), gaps


def text_tokens(question: str = QUESTION) -> int:
    """Tokens of the prompt other than the video's placeholders."""
    return len(tiny.processor().tokenizer(prompt(question))["input_ids"]) - 1


def video_span(kept: int, question: str = QUESTION) -> tuple[int, int]:
    """(tokens before the first video placeholder, tokens up to the end of the video's turn
    part before the question) of the prompt with `kept` placeholders."""
    tokenizer = tiny.processor().tokenizer
    head = prompt(question).split("<|video_pad|>")[0]
    before = len(tokenizer(head)["input_ids"])
    upto = prompt(question).split(question)[0]
    return before, len(tokenizer(upto)["input_ids"]) - 1 + kept


def _record_video_rows(model: Any) -> None:
    """Runs inside vLLM's worker: from now on keep a copy of each video's rows as
    `_process_video_input` hands them on (for a payload: the rows the engine embeds)."""
    process = model._process_video_input
    model.craft_recorded = []

    def record(video_input: Any) -> Any:
        rows = process(video_input)
        model.craft_recorded.extend(r.detach().cpu().clone() for r in rows)
        return rows

    model._process_video_input = record


def _take_recorded_rows(model: Any) -> list[torch.Tensor]:
    rows, model.craft_recorded = model.craft_recorded, []
    return rows  # type: ignore[no-any-return]


def record_video_rows(llm: Any) -> None:
    """`_record_video_rows` in the engine's one CPU worker."""
    llm.apply_model(_record_video_rows)


def recorded_rows(llm: Any) -> list[torch.Tensor]:
    """The video rows the worker embedded since the last call, in the order it ran them."""
    return llm.apply_model(_take_recorded_rows)[0]  # type: ignore[no-any-return]


def _record_craft_calls(model: Any) -> None:
    """Runs inside vLLM's worker: record each video the served model compresses
    (`craft_compress`, one call per forward) and how many videos each call held."""
    model.craft_calls, model.craft_batches = [], []
    compress = model.craft_compress

    def record(features: list[torch.Tensor], coords: list[torch.Tensor]) -> Any:
        results = compress(features, coords)
        model.craft_batches.append(len(features))
        for f, r in zip(features, results):
            rows = r.features.detach().cpu().clone()
            model.craft_calls.append(CraftCall(f.detach().float().cpu(), r.kept_index.cpu(), rows))
        return results

    model.craft_compress = record


def _take_craft_calls(model: Any) -> tuple[list[CraftCall], list[int]]:
    taken = model.craft_calls, model.craft_batches
    model.craft_calls, model.craft_batches = [], []
    return taken


def record_craft_calls(llm: Any) -> None:
    """`_record_craft_calls` in the engine's one CPU worker."""
    llm.apply_model(_record_craft_calls)


def craft_calls(llm: Any) -> tuple[list[CraftCall], list[int]]:
    """The videos the worker compressed since the last call, in order, and the number of
    videos of each compression call (one call per forward: `[3]` for 3 videos at once)."""
    return llm.apply_model(_take_craft_calls)[0]  # type: ignore[no-any-return]


def same_plans(served: list[CraftCall], reference: list[Reference]) -> list[bool]:
    """Per video: did vLLM's CRAFT keep the rows craft-adapters' kept? Where it did not, the
    two vision towers' bfloat16 rows must differ (asserted): the merge plan followed its input,
    which two engines' bfloat16 kernels round differently (up to one bfloat16 step measured),
    not a difference in how CRAFT is called."""
    same = []
    for call, ref in zip(served, reference):
        assert ref.plan is not None
        equal = call.kept.shape == ref.plan.kept.shape and torch.equal(call.kept, ref.plan.kept)
        if not equal:
            assert not torch.equal(call.features, ref.plan.features)
        same.append(equal)
    return same


def _craft_path(model: Any) -> str:
    """Runs inside vLLM's worker: which loop the served CRAFT module runs (`info["pairing"]`:
    "compiled" for craft-core's compiled loop), on 64 random tokens of one frame."""
    craft = model.craft
    param = next(craft.parameters())
    features = torch.randn(64, craft.config.hidden_size, dtype=param.dtype, device=param.device)
    grid = torch.meshgrid(torch.arange(1), torch.arange(8), torch.arange(8), indexing="ij")
    coords = torch.stack(grid, -1).reshape(-1, 3).to(param.device)
    with torch.inference_mode():
        result = craft(features, coords, ratio=4.0)
    return str(result.info["pairing"])


def served_craft_path(llm: Any) -> str:
    """`_craft_path` of the engine's one CPU worker."""
    return llm.apply_model(_craft_path)[0]
