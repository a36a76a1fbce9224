"""The merge module's share of one training step (forward + backward), measured in one run.

    uv run python packages/craft-train/benchmarks/bench_train.py [--steps 10]

A training step here is one micro-batch through the wrapped VLM (`craft_adapters.wrap`):
vision tower, CRAFT compression, language model, loss, backward. The merge module's part is
its forward (timed by hooks around `CraftCompressor.forward` inside that step) plus its
backward (timed by re-running the compressor alone on the same tokens and back-propagating a
loss of the same shape). Printed: median step time, median compressor time, their ratio.

Configurations: the tiny random Qwen2.5-VL of the tests (CPU, always), and a real-size
Qwen2.5-VL-7B-shaped random model on 64 frames at 448 x 448 (8,192 video tokens, bf16) when
CUDA is present (skipped otherwise).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import torch

from craft_core import CraftCompressor, CraftConfig
from craft_train.model import enable_checkpointing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Timer:
    """Forward time of the compressor inside the step, and its captured inputs."""

    def __init__(self, compressor: CraftCompressor, device: torch.device) -> None:
        self.seconds = 0.0
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.device = device
        original = compressor.forward

        def timed(features: torch.Tensor, coords: torch.Tensor, **kwargs: Any) -> Any:
            _sync(device)
            start = time.perf_counter()
            out = original(features, coords, **kwargs)
            _sync(device)
            self.seconds += time.perf_counter() - start
            self.calls.append((features.detach(), coords))
            return out

        compressor.forward = timed  # type: ignore[method-assign]
        self.original = original


def _compressor_backward(timer: _Timer, budget: dict[str, Any]) -> float:
    """Forward + backward of the compressor alone on the captured tokens, minus forward."""
    total = 0.0
    for features, coords in timer.calls:
        x = features.clone().requires_grad_(True)
        _sync(timer.device)
        start = time.perf_counter()
        out = timer.original(x, coords, **budget)
        _sync(timer.device)
        middle = time.perf_counter()
        out.features.float().square().mean().backward()
        _sync(timer.device)
        total += time.perf_counter() - middle
        del start
    return total


def measure(
    model: Any, compressor: CraftCompressor, inputs: dict[str, Any], steps: int
) -> dict[str, float]:
    device = next(compressor.parameters()).device
    budget = {"ratio": 8.0}
    model.set_budget(**budget)
    timer = _Timer(compressor, device)
    step_times, craft_times = [], []
    for i in range(steps + 2):  # two warm-up steps
        timer.seconds, timer.calls = 0.0, []
        _sync(device)
        start = time.perf_counter()
        out = model(**inputs)
        out.loss.backward()
        _sync(device)
        step = time.perf_counter() - start
        forward = timer.seconds
        backward = _compressor_backward(timer, budget)
        compressor.zero_grad(set_to_none=True)
        if i >= 2:
            step_times.append(step)
            craft_times.append(forward + backward)
    compressor.forward = timer.original  # type: ignore[method-assign]
    step_s, craft_s = statistics.median(step_times), statistics.median(craft_times)
    return {"step_s": step_s, "craft_s": craft_s, "share": craft_s / step_s}


def tiny(steps: int) -> dict[str, float]:
    import numpy as np

    from craft_adapters import build_inputs, wrap
    from craft_adapters.tiny import build_tiny_vlm

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        backbone, processor = build_tiny_vlm("qwen2_5_vl", folder)
    backbone.requires_grad_(False)
    enable_checkpointing(backbone)
    backbone.train()
    compressor = CraftCompressor(CraftConfig(hidden_size=64, rank=16, rope_sections=(2, 3, 3)))
    model = wrap(backbone, compressor, ratio=8.0)
    frames = np.random.default_rng(0).integers(0, 255, (16, 96, 96, 3), dtype=np.uint8)
    inputs = dict(build_inputs(processor, frames, 2.0, "Describe this video."))
    inputs["labels"] = inputs["input_ids"].clone()
    return measure(model, compressor, inputs, steps)


def real_size(steps: int) -> dict[str, float]:
    """Qwen2.5-VL-7B shapes (random weights), one 64-frame 448 x 448 video, bf16 on CUDA."""
    from transformers import AutoModelForImageTextToText, Qwen2_5_VLConfig

    from craft_adapters import wrap
    from craft_adapters.backbones._tiny import mrope, qwen_token_ids

    device = torch.device("cuda")
    ids = qwen_token_ids()  # the tiny tokenizer's special-token ids (inside the 7B vocab)
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": 152064,
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "rope_parameters": mrope([16, 24, 24], theta=1e6),
        },
        vision_config={
            "depth": 32,
            "hidden_size": 1280,
            "out_hidden_size": 3584,
            "fullatt_block_indexes": [7, 15, 23, 31],
        },
        **ids,
    )
    with torch.device(device):
        backbone = AutoModelForImageTextToText.from_config(
            config, dtype=torch.bfloat16, attn_implementation="sdpa"
        )
    backbone.requires_grad_(False)
    enable_checkpointing(backbone)
    backbone.train()
    compressor = CraftCompressor(CraftConfig(hidden_size=3584)).to(device)
    model = wrap(backbone, compressor, ratio=8.0)
    t, h, w = 32, 32, 32  # 64 frames / temporal patch 2; 448 / 14 = 32 patches a side
    n_video = t * h * w // 4
    text = torch.randint(0, 256, (1, 40))
    input_ids = torch.cat(
        [
            text[:, :20],
            torch.tensor([[ids["vision_start_token_id"]]]),
            torch.full((1, n_video), ids["video_token_id"]),
            torch.tensor([[ids["vision_end_token_id"]]]),
            text[:, 20:],
        ],
        dim=1,
    )
    mm = (input_ids == ids["video_token_id"]).long() * 2
    inputs = {
        "input_ids": input_ids.to(device),
        "attention_mask": torch.ones_like(input_ids).to(device),
        "mm_token_type_ids": mm.to(device),
        "pixel_values_videos": torch.randn(
            t * h * w, 3 * 2 * 14 * 14, dtype=torch.bfloat16, device=device
        ),
        "video_grid_thw": torch.tensor([[t, h, w]], device=device),
        "second_per_grid_ts": torch.tensor([1.0], device=device),
        "labels": input_ids.to(device),
    }
    return measure(model, compressor, inputs, steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    result = tiny(args.steps)
    print(
        f"tiny qwen2_5_vl (CPU, 16 frames, ratio 8): step {result['step_s'] * 1e3:.1f} ms, merge "
        f"module {result['craft_s'] * 1e3:.1f} ms, share {result['share']:.1%}"
    )
    if torch.cuda.is_available():
        result = real_size(max(3, args.steps // 2))
        print(
            f"Qwen2.5-VL-7B shapes (CUDA bf16, 64 frames 448x448, 8192 video tokens, ratio 8): "
            f"step {result['step_s'] * 1e3:.1f} ms, merge module {result['craft_s'] * 1e3:.1f} ms, "
            f"share {result['share']:.1%}"
        )
    else:
        print("real-size configuration: skipped (no CUDA)")


if __name__ == "__main__":
    main()
