"""Settings and position arithmetic, without an engine (fast)."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from craft_vllm import CraftConfigError, read_options
from craft_vllm.positions import grid_positions, prompt_positions, pruned_position_columns

ARCH = "CraftQwen2_5_VLForConditionalGeneration"


def _config(**keys):
    return types.SimpleNamespace(**keys)


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"craft_checkpoint": "{ok}", "craft_threshold": 0.9}, "threshold mode is refused"),
        ({"craft_checkpoint": "{ok}", "craft_ratio": 4, "craft_min_tokens": 2}, "craft_min_tokens"),
        ({"craft_ratio": 4}, "needs craft_checkpoint"),
        ({"craft_checkpoint": "{ok}"}, "needs craft_ratio"),
        ({"craft_checkpoint": "/nonexistent", "craft_ratio": 4}, "does not exist"),
        ({"craft_checkpoint": "{ok}", "craft_ratio": 0.5}, "finite number >= 1"),
        ({"craft_checkpoint": "{ok}", "craft_ratio": float("inf")}, "finite number >= 1"),
        ({"craft_checkpoint": "{ok}", "craft_ratio": "8"}, "must be a number"),
        ({"craft_checkpoint": "{ok}", "craft_ratio": True}, "must be a number"),
    ],
)
def test_bad_settings_name_the_key(tmp_path, keys, expected) -> None:
    keys = {k: v.format(ok=tmp_path) if isinstance(v, str) else v for k, v in keys.items()}
    with pytest.raises(CraftConfigError, match=expected):
        read_options(_config(**keys), ARCH)


def test_good_settings(tmp_path) -> None:
    options = read_options(_config(craft_checkpoint=str(tmp_path), craft_ratio=8), ARCH)
    assert options.ratio == 8.0 and options.checkpoint == tmp_path


def _options(folder, ratio):
    return read_options(_config(craft_checkpoint=str(folder), craft_ratio=ratio), ARCH)


def test_kept_count_is_floor_and_never_clamped(tmp_path) -> None:
    assert [_options(tmp_path, 4).kept(n) for n in (4, 7, 8, 128)] == [1, 1, 2, 32]
    assert _options(tmp_path, 2.5).kept(100) == 40
    with pytest.raises(CraftConfigError, match=r"craft_ratio 16 leaves no token .*= 0\)"):
        _options(tmp_path, 16).kept(15)


def test_the_served_budget_is_checked_once(tmp_path, monkeypatch) -> None:
    """`craft_ratio` becomes one TokenBudget when the config is read; each video's count
    and the compressor call take that object as it is (no second check, no second formula)."""
    from unittest import mock

    from craft_core import CraftCompressor, CraftConfig, TokenBudget

    checks = mock.Mock(side_effect=TokenBudget.__post_init__)
    monkeypatch.setattr(TokenBudget, "__post_init__", lambda budget: checks(budget))
    options = _options(tmp_path, 4)
    assert checks.call_count == 1
    compressor = CraftCompressor(CraftConfig(hidden_size=8, sim_dim=4)).eval()
    for n in (8, 12, 40):
        idx = torch.arange(n)
        coords = torch.stack([idx // 4, idx % 4 // 2, idx % 2], -1)
        features = torch.linspace(-1, 1, n * 8).reshape(n, 8).sin()
        with torch.no_grad():
            result = compressor(features, coords, options.budget)
        assert result.num_kept == options.kept(n) == TokenBudget(ratio=4).resolve(n).floor
    assert checks.call_count == 1 + 3  # only the three reference budgets of the line above


def _slow_positions(tokens: list[str], grids: list[tuple[int, int, int, float]]) -> np.ndarray:
    """transformers' Qwen2.5-VL rule, one token at a time: text +1; each video a t x h x w
    grid starting at the next free position; the text after it at max + 1."""
    out, nxt, g = [], 0, iter(grids)
    i = 0
    while i < len(tokens):
        if tokens[i] != "V":
            out.append((nxt, nxt, nxt))
            nxt += 1
            i += 1
            continue
        t, h, w, f = next(g)
        start = nxt
        top = start
        for a in range(t):
            for b in range(h):
                for c in range(w):
                    pos = (start + int(a * f), start + b, start + c)
                    out.append(pos)
                    top = max(top, *pos)
        nxt = top + 1
        i += t * h * w
    return np.array(out).T


def test_uncompressed_prompt_positions_equal_the_slow_rule() -> None:
    grids = [(3, 2, 4, 2.0), (2, 3, 3, 0.5)]
    tokens = ["x"] * 5 + ["V"] * 24 + ["x"] * 3 + ["V"] * 18 + ["x"] * 4
    items = [(5, 24, grid_positions(3, 2, 4, 2.0)), (32, 18, grid_positions(2, 3, 3, 0.5))]
    positions, delta = prompt_positions(len(tokens), items)
    assert np.array_equal(positions.numpy(), _slow_positions(tokens, grids))
    assert delta == int(positions.max()) + 1 - len(tokens)


def test_compressed_prompt_keeps_the_text_after_the_video_in_place() -> None:
    grid = grid_positions(3, 2, 4, 2.0)  # 24 tokens, max 4 (t) -> text after at start + 5
    positions, _ = prompt_positions(5 + 6 + 3, [(5, 6, grid)])
    assert positions[:, 11:].tolist() == [[10, 11, 12]] * 3
    cols = pruned_position_columns(grid, __import__("torch").tensor([0, 9, 23]))
    assert cols.tolist() == [[0, 0, 0, 5], [2, 0, 1, 5], [4, 1, 3, 5]]
