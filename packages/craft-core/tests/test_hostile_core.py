"""Hostile input to craft-core: a clear error naming what is wrong, never a silent NaN."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from craft_core import CraftCompressor, CraftConfig


def tokens(n: int = 40, dim: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.rand(n, dim, generator=gen), torch.randint(0, 4, (n, 3), generator=gen)


@pytest.mark.parametrize("value", [1e20, -3e16, float("inf"), float("nan")])
def test_huge_or_non_finite_features_are_refused(value: float) -> None:
    x, coords = tokens()
    x[3, 2] = value
    with pytest.raises(ValueError, match=r"magnitude|NaN or inf"):
        CraftCompressor(CraftConfig(hidden_size=16))(x, coords, ratio=4.0)


def test_large_but_accepted_features_give_finite_output() -> None:
    x, coords = tokens()
    compressor = CraftCompressor(CraftConfig(hidden_size=16))
    out = compressor(x * 1e14, coords, ratio=4.0)
    assert torch.isfinite(out.features).all()


def test_checkpoint_with_nan_weights_is_refused(tmp_path) -> None:
    CraftCompressor(CraftConfig(hidden_size=16)).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["merge.w_q.weight"][0, 0] = float("nan")
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"NaN or inf values in \['merge.w_q.weight'\]"):
        CraftCompressor.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "name,content,match",
    [
        ("model.safetensors", b"not a safetensors file", "model.safetensors is not a readable"),
        ("config.json", b"{broken", "config.json is not a valid CRAFT config"),
        ("config.json", b'{"hidden_size": -3}', "config.json is not a valid CRAFT config"),
    ],
)
def test_corrupt_checkpoint_files_name_the_file(tmp_path, name, content, match) -> None:
    CraftCompressor(CraftConfig(hidden_size=16)).save_pretrained(tmp_path)
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=match):
        CraftCompressor.from_pretrained(tmp_path)
