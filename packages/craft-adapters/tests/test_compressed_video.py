"""`compress_videos` + `save_compressed_video` / `load_compressed_video`: compress once, read
the same rows back in another process; every malformed field is refused by name."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import torch
from adapters_testkit import KeepEvery, make_frames
from safetensors.torch import save_file

from craft_adapters import (
    CompressedVideo,
    build_inputs,
    load_compressed_video,
    save_compressed_video,
    wrap,
)
from craft_adapters.compressed import checkpoint_sha256
from craft_core import CraftCompressor, CraftConfig


def _slow_coords(n: int, grid: tuple[int, int, int], step: int) -> list[list[int]]:
    """(t, h, w) of every `step`-th token, counted one at a time over the grid."""
    out, i = [], 0
    for t in range(grid[0]):
        for h in range(grid[1]):
            for w in range(grid[2]):
                if i % step == 0:
                    out.append([t, h, w])
                i += 1
    return out


@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl"])
def test_rows_and_coords_are_what_the_compressor_kept(tiny_models: dict, name: str) -> None:
    model, processor = tiny_models[name]
    inputs = build_inputs(processor, make_frames(4), 2.0, "What?")
    keep = KeepEvery(2)
    (video,) = wrap(model, keep, ratio=2.0).compress_videos(**inputs)
    seen = keep.calls[-1]["features"]  # the [N, D] rows the compressor was given
    n = seen.shape[0]
    assert video.num_tokens == n
    assert video.coords.tolist() == _slow_coords(n, video.grid, 2)
    assert torch.equal(video.kept_index, torch.arange(0, n, 2))
    pairs = (seen[0::2] + seen[1::2]) / 2  # KeepEvery's rule: the mean of each pair
    torch.testing.assert_close(video.features, pairs)
    assert video.metadata["model_type"] == name and video.metadata["budget"] == "ratio=2"
    assert "craft_sha256" not in video.metadata  # a stub has no weights to hash


def test_threshold_mode_round_trips_across_processes(tiny_models: dict, tmp_path) -> None:
    model, processor = tiny_models["qwen2_5_vl"]
    inputs = build_inputs(processor, make_frames(6, seed=1), 2.0, "What?")
    torch.manual_seed(0)
    wrapped = wrap(model, CraftCompressor(CraftConfig(hidden_size=64)).eval(), threshold=0.5)
    (video,) = wrapped.compress_videos(**inputs)
    assert video.features.shape[0] == wrapped.last_compression.tokens_after < video.num_tokens
    assert video.metadata["hidden_size"] == 64  # what a server checks (check_made_with)
    assert video.metadata["craft_sha256"] == checkpoint_sha256(wrapped.compressor)
    path = save_compressed_video(tmp_path / "clip.safetensors", video)
    code = (
        "import json, sys; from craft_adapters import load_compressed_video as load; "
        "v = load(sys.argv[1]); print(json.dumps([v.features.tolist(), v.coords.tolist(), "
        "list(v.grid), v.metadata]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
    )
    features, coords, grid, metadata = json.loads(out.stdout)
    assert torch.equal(torch.tensor(features, dtype=torch.float32), video.features)
    assert coords == video.coords.tolist() and tuple(grid) == video.grid
    assert metadata == video.metadata and metadata["second_per_grid"] == 1.0
    assert metadata["budget"] == "threshold=0.5"


def _good() -> dict[str, Any]:
    coords = torch.tensor([[0, 0, 0], [0, 1, 1], [1, 0, 1]])
    return {"features": torch.ones(3, 4), "coords": coords, "grid": (2, 2, 2)}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"features": torch.tensor([[1.0, float("nan")]] * 3)}, "NaN"),
        ({"features": torch.ones(3, 4, dtype=torch.long)}, "features"),
        ({"coords": torch.tensor([[0, 0, 0], [0, 1, 1], [2, 0, 0]])}, "fit the grid"),
        ({"coords": torch.tensor([[0, 0, 0], [0, 1, 1], [0, 0, -1]])}, "fit the grid"),
        ({"coords": torch.tensor([[0, 0, 0], [0, 1, 1]])}, "K = 3"),
        ({"coords": torch.tensor([[0, 0], [0, 1], [1, 0]])}, "[K, 3]"),
        ({"coords": torch.tensor([[0, 1, 1], [0, 0, 0], [1, 0, 1]])}, "distinct"),
        ({"coords": torch.tensor([[0, 0, 0], [0, 0, 0], [1, 0, 1]])}, "distinct"),
        ({"coords": torch.ones(3, 3)}, "coords"),
        ({"grid": (2, 2)}, "grid"),
        ({"grid": (2, 0, 2)}, "grid"),
    ],
)
def test_malformed_fields_are_named(change: dict, field: str) -> None:
    with pytest.raises((ValueError, TypeError), match=field.replace("[", r"\[")):
        CompressedVideo(**{**_good(), **change})


def test_files_that_are_not_compressed_videos_are_named(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing\.safetensors"):
        load_compressed_video(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match=r"junk\.safetensors is not a readable"):
        load_compressed_video(tmp_path / "junk.safetensors")
    save_file({"weight": torch.ones(2)}, str(tmp_path / "weights.safetensors"))
    with pytest.raises(ValueError, match=r"weights\.safetensors is not a compressed video"):
        load_compressed_video(tmp_path / "weights.safetensors")
    good = save_compressed_video(tmp_path / "good.safetensors", CompressedVideo(**_good()))
    bad = _good()
    bad["features"][1, 2] = float("inf")  # written past the check, as a foreign writer could
    header = {"format": "craft-compressed-video/1", "grid": "[2, 2, 2]"}
    save_file({"features": bad["features"], "coords": bad["coords"]}, str(good), header)
    with pytest.raises(ValueError, match=r"good\.safetensors: .*NaN/inf"):
        load_compressed_video(good)
