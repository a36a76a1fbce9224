"""ToMe and DivPrune against hand-worked examples and slow references."""

from __future__ import annotations

import math

import pytest
import torch
from baseline_helpers import check_result, grid_coords, video

from craft_eval.baselines import divprune, tome


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


def tome_reference(x: torch.Tensor, target: int) -> tuple[list[int], list[torch.Tensor], list[int]]:
    """Plain-loop ToMe: (kept original indices, their rows, representative of every token)."""
    x = x.double()
    active = list(range(x.shape[0]))
    rows = {i: x[i].clone() for i in active}
    size = dict.fromkeys(active, 1.0)
    owner = list(range(x.shape[0]))
    while len(active) > target:
        r = min(len(active) - target, len(active) // 2)
        a_ids, b_ids = active[0::2], active[1::2]
        edges = []
        for pos, i in enumerate(a_ids):
            sims = [_cos(rows[i], rows[j]) for j in b_ids]
            best = max(range(len(b_ids)), key=lambda k: (sims[k], -k))
            edges.append((-sims[best], pos, i, b_ids[best]))
        for _, _, i, j in sorted(edges)[:r]:
            rows[j] = (rows[j] * size[j] + rows[i] * size[i]) / (size[j] + size[i])
            size[j] += size[i]
            owner = [j if o == i else o for o in owner]
            active.remove(i)
    return active, [rows[i] for i in active], owner


def test_tome_merges_two_identical_tokens() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    result = tome(x, grid_coords(1, 1, 2), ratio=2.0)
    assert result.kept_index.tolist() == [1]  # the destination (set b) survives
    assert result.coords.tolist() == [[0, 0, 1]]
    assert result.assignment.tolist() == [0, 0]
    torch.testing.assert_close(result.features, x[:1])


def test_tome_hand_worked_size_weighted_mean() -> None:
    # a = {0, 2}, b = {1, 3}; 0 -> 1 is the best edge, then (r = 1 per step at N=4 -> 3)
    x = torch.tensor([[1.0, 0.0], [1.0, 0.2], [0.0, 1.0], [-1.0, 0.1]])
    result = tome(x, grid_coords(1, 1, 4), ratio=4 / 3)
    assert result.kept_index.tolist() == [1, 2, 3]
    assert result.assignment.tolist() == [0, 0, 1, 2]
    torch.testing.assert_close(result.features[0], torch.tensor([1.0, 0.1]))
    # ratio 4: step 1 merges r = 2 (both a-tokens pick b-token 1): (x0 + x1 + x2) / 3 =
    # (2/3, 0.4) of size 3; step 2 merges it into 3 by size: (3 (2/3, 0.4) + x3) / 4
    deeper = tome(x, grid_coords(1, 1, 4), ratio=4.0)
    assert deeper.kept_index.tolist() == [3] and deeper.rounds == 2
    torch.testing.assert_close(deeper.features[0], torch.tensor([0.25, 0.325]))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ratio", [1.7, 3.0, 8.0])
def test_tome_matches_slow_reference(seed: int, ratio: float) -> None:
    features, coords = video(3, 3, 3, dim=6, seed=seed, noise=0.5)
    result = tome(features, coords, ratio=ratio)
    check_result(result, features, coords, max(1, math.floor(27 / ratio)))
    kept, rows, owner = tome_reference(features, result.num_kept)
    assert result.kept_index.tolist() == kept
    torch.testing.assert_close(result.features, torch.stack(rows).float())
    assert result.kept_index[result.assignment].tolist() == owner


def _planar(degrees: list[float]) -> torch.Tensor:
    rad = torch.tensor(degrees) * math.pi / 180
    return torch.stack([rad.cos(), rad.sin()], dim=1)


def test_divprune_five_points_in_the_plane() -> None:
    """Unit vectors at 0, 10, 20, 95, 180 degrees (distance = 1 - cos).

    Nearest-neighbour distances: 0.015, 0.015, 0.015, 0.741 (95 -> 20), 0.913 (180 -> 95):
    180 goes first. Min distance to {180}: 0 is farthest (2.0) -> 0. To {180, 0}: 95 has
    0.913, 20 only 0.060 -> 95. Then 20 (0.060 beats 10's 0.015).
    """
    x = _planar([0, 10, 20, 95, 180])
    coords = grid_coords(1, 1, 5)
    picks = {2.5: [0, 4], 1.6: [0, 3, 4], 1.25: [0, 2, 3, 4]}
    for ratio, kept in picks.items():
        result = divprune(x, coords, ratio=ratio)
        assert result.kept_index.tolist() == kept
        torch.testing.assert_close(result.features, x[kept])
    two = divprune(x, coords, ratio=2.5)
    # 10 and 20 are nearest to 0; 95 is nearer to 180 (0.913) than to 0 (1.087)
    assert two.kept_index[two.assignment].tolist() == [0, 0, 0, 4, 4]


def divprune_reference(x: torch.Tensor, k: int) -> list[int]:
    """The published loop: full distance matrix, first = argmax of the 2nd-smallest column
    value, then argmax of the column-wise min over the picked rows."""
    e = torch.nn.functional.normalize(x.double(), dim=-1)
    dist = 1.0 - e @ e.T
    picked: list[int] = []
    for i in range(k):
        if i == 0:
            scores = torch.topk(dist, 2, dim=0, largest=False).values[1, :]
        else:
            scores = dist[picked].min(dim=0).values
        picked.append(int(scores.argmax()))
    return sorted(picked)


@pytest.mark.parametrize("seed", range(6))
def test_divprune_matches_published_loop(seed: int) -> None:
    features, coords = video(4, 4, 4, dim=8, seed=seed, noise=0.6)
    for ratio in (2.0, 5.0, 16.0):
        result = divprune(features, coords, ratio=ratio)
        assert result.kept_index.tolist() == divprune_reference(features, result.num_kept)
        e = torch.nn.functional.normalize(features, dim=-1)
        nearest = (e @ e[result.kept_index].T).argmax(dim=1)
        assert torch.equal(result.assignment, nearest)
