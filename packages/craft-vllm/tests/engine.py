"""Run the same videos through vLLM (in process) and through craft-adapters' `generate()`."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import tiny
import torch

T = TypeVar("T")
ARCH = tiny.ARCH
FPS = 2.0
QUESTION = "What happens?"
NEW_TOKENS = 12


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
        **kwargs,
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


def vllm_generate(
    llm: Any, videos: list[np.ndarray], kind: Any = tiny
) -> list[tuple[list[int], int]]:
    """Greedy new tokens and prompt length of each video, all requests in one batch."""
    from vllm import SamplingParams

    text = prompt(kind=kind)
    requests = [{"prompt": text, "multi_modal_data": {"video": video_item(v)}} for v in videos]
    outs = llm.generate(requests, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0))
    return [(list(o.outputs[0].token_ids), len(o.prompt_token_ids)) for o in outs]


def adapters_generate(
    model_dir: Path,
    compressor: Any,
    ratio: float | None,
    videos: list[np.ndarray],
    kind: Any = tiny,
    dtype: torch.dtype = torch.float32,
    threshold: float | None = None,
) -> list[tuple[list[int], int, list[float]]]:
    """craft-adapters' `generate()` on the same folder and videos, one video at a time.

    -> per video: greedy new tokens, prompt length after compression, and the top-2 log-prob
    margin at each step (how far the reference is from a tie).
    """
    from transformers import AutoModelForImageTextToText

    import craft_adapters

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype).eval()
    wrapped = craft_adapters.wrap(model, compressor, ratio=ratio, threshold=threshold)
    processor = kind.processor()
    out = []
    for frames in videos:
        inputs = craft_adapters.build_inputs(processor, frames, FPS, QUESTION)
        gen = wrapped.generate(
            **inputs,
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
        new = gen.sequences[0, inputs["input_ids"].shape[1] :].tolist()
        top = [torch.topk(torch.log_softmax(s[0].float(), -1), 2).values for s in gen.scores]
        margins = [float(v[0] - v[1]) for v in top]
        eos = kind.IDS["<|im_end|>"]
        if eos in new:  # vLLM stops at EOS and returns it; HF pads after it
            new = new[: new.index(eos) + 1]
        report = wrapped.last_compression
        length = inputs["input_ids"].shape[1]
        if report is not None:
            length = report.sequence_length_after
        out.append((new, int(length), margins[: len(new)]))
    return out


TIE = 0.005
"""Top-2 log-prob margin under which the reference is treated as tied. vLLM's CPU kernels
and transformers' differ by up to ~0.003 nats here (measured on the uncompressed model), so
a greedy step closer than that may go either way on another machine."""


def compared(margins: list[float]) -> int:
    """Steps `agree` compares: those before the reference's first near-tie."""
    return next((i for i, m in enumerate(margins) if m < TIE), len(margins))


def agree(served: list[int], reference: list[int], margins: list[float]) -> bool:
    """Greedy tokens equal up to (not including) the reference's first near-tie step."""
    stop = compared(margins)
    return served[:stop] == reference[:stop] and (stop < len(reference) or served == reference)


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
