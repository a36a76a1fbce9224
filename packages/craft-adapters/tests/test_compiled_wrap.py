"""`wrap` with craft-core's compiled loop (`CraftCompressor(config, compile=True)`): the same
kept tokens and the same logits as with the eager loop (one tiny backbone: the graphs compile
once). The loop is offered on CUDA only; craft-core's run option `allow_cpu=True` runs it on
the CPU here.

    uv run pytest packages/craft-adapters/tests/test_compiled_wrap.py -q -p no:cacheprovider
"""

from __future__ import annotations

from typing import Any

import torch
from adapters_testkit import make_frames

from craft_adapters import build_inputs, wrap
from craft_core import CraftCompressor, CraftConfig


@torch.no_grad()
def test_wrap_with_the_compiled_loop_equals_eager(tiny_models: dict[str, Any]) -> None:
    model, processor = tiny_models["qwen2_5_vl"]
    inputs = build_inputs(processor, make_frames(4, 0), 2.0, "What?")
    config = {"hidden_size": 64, "gate_hidden": 32, "round_embed_dim": 16}
    torch.manual_seed(0)
    eager = CraftCompressor(CraftConfig(**config))
    compiled = CraftCompressor(CraftConfig(**config), compile=True, allow_cpu=True)
    compiled.load_state_dict(eager.state_dict())
    want = wrap(model, eager, ratio=3.0)
    got = wrap(model, compiled, ratio=3.0)
    logits = want(**inputs).logits
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert torch.equal(got(**inputs).logits, logits)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs  # it did compile
    assert torch.equal(got.compressed_index(0), want.compressed_index(0))
    assert got.compressed_index(0).numel() < inputs["input_ids"].shape[1]
