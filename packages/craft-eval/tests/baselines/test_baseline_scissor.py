"""LLaVA-Scissor (both modes) and Scissor-Merge against hand-worked examples."""

from __future__ import annotations

import pytest
import torch
from baseline_helpers import check_result, grid_coords, video

from craft_core import CraftCompressor, CraftConfig
from craft_eval.baselines import llava_scissor, scissor_merge
from craft_eval.baselines.scissor import connected_components
from craft_eval.methods import get_method


def components_reference(adjacency: torch.Tensor) -> list[int]:
    """Breadth-first search; components numbered by their smallest member."""
    n = adjacency.shape[0]
    label = [-1] * n
    count = 0
    for start in range(n):
        if label[start] >= 0:
            continue
        label[start], queue = count, [start]
        while queue:
            i = queue.pop()
            for j in torch.nonzero(adjacency[i] | adjacency[:, i]).squeeze(1).tolist():
                if label[j] < 0:
                    label[j] = count
                    queue.append(j)
        count += 1
    return label


@pytest.mark.parametrize("seed", range(5))
def test_connected_components_match_bfs(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n = 40
    sims = torch.rand(n, n, generator=g)
    sims = (sims + sims.T) / 2
    for tau in (0.9, 0.95, 0.98):
        labels = connected_components(sims, tau).tolist()
        assert labels == components_reference(sims > tau)


def test_scissor_hand_worked_frame() -> None:
    """Two components {0, 1, 2} (around (1, 0)) and {3, 4} (around (0, 1)).

    Representatives (1, 0) and (0, 1); token 2 is the closest to its representative, 3 and 4
    tie (the smaller index stands). Final rows (rep + sum assigned) / (n + 1) = the reps.
    """
    x = torch.tensor([[1, 0.1], [1, -0.1], [1, 0], [0.1, 1], [-0.1, 1]])
    coords = grid_coords(1, 1, 5)
    result = llava_scissor(x, coords, threshold=0.9)
    assert result.kept_index.tolist() == [2, 3]
    assert result.assignment.tolist() == [0, 0, 0, 1, 1]
    torch.testing.assert_close(result.features, torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    assert result.info["settings"]["mode"] == "threshold"


def test_scissor_merges_across_frames() -> None:
    """Frame 0 = {a, b}, frame 1 = {a', c}: per frame nothing joins; across frames a and a'
    join. The final rows follow (rep + sum assigned) / (n + 1)."""
    a, b, c = torch.tensor([2.0, 0, 0]), torch.tensor([0, 1.0, 0]), torch.tensor([0, 0, 1.0])
    a2 = torch.tensor([1.0, 0.3, 0])  # cosine 0.958 with a
    x = torch.stack([a, b, a2, c])
    result = llava_scissor(x, grid_coords(2, 1, 2), threshold=0.9)
    assert result.kept_index.tolist() == [
        0,
        1,
        3,
    ]  # mean at 5.7 degrees: a (0) is closer than a' (16.7)
    assert result.assignment.tolist() == [0, 1, 0, 2]
    rep = (a + a2) / 2
    torch.testing.assert_close(result.features, torch.stack([(rep + a + a2) / 3, b, c]))


def test_scissor_budget_search_lands_on_the_count() -> None:
    features, coords = video(4, 4, 4, dim=16, seed=0, noise=0.3)
    result = llava_scissor(features, coords, ratio=6.0)
    check_result(result, features, coords, 10)
    assert result.info["settings"]["mode"] == "budget"
    if result.info["adjusted"] == 0:  # the searched tau reproduces the count on its own
        again = llava_scissor(
            features, coords, threshold=result.info["settings"]["tau"], min_tokens=1
        )
        assert torch.equal(again.kept_index, result.kept_index)
        torch.testing.assert_close(again.features, result.features)


def test_scissor_trims_and_pads_when_all_tokens_are_alike() -> None:
    """One component below tau = 1, eight singletons at it: no tau gives 4."""
    coords = grid_coords(2, 2, 2)
    features = torch.ones(8, 4)
    result = llava_scissor(features, coords, ratio=2.0)
    check_result(result, features, coords, 4)
    assert result.info["adjusted"] == 4  # 8 singletons trimmed to 4
    floored = llava_scissor(features, coords, threshold=0.9, min_tokens=3)
    assert floored.num_kept == 3


def test_scissor_merge_reduces_to_known_cases() -> None:
    features, coords = video(3, 3, 3, dim=16, seed=2)
    plain = llava_scissor(features, coords, ratio=4.0)
    target = CraftCompressor(CraftConfig(hidden_size=16, reduce="target"))
    pruned = scissor_merge(features, coords, compressor=target, ratio=4.0)
    check_result(pruned, features, coords, 6)
    assert torch.equal(pruned.kept_index, plain.kept_index)
    assert torch.equal(pruned.assignment, plain.assignment)
    torch.testing.assert_close(pruned.features, features[pruned.kept_index])  # G = 0

    mean = CraftCompressor(CraftConfig(hidden_size=16, weighting="uniform", reduce="mean"))
    averaged = scissor_merge(features, coords, compressor=mean, ratio=4.0)
    for row, kept in enumerate(averaged.kept_index.tolist()):
        sources = [
            i for i in torch.nonzero(averaged.assignment == row).squeeze(1).tolist() if i != kept
        ]
        expected = features[sources].mean(dim=0) if sources else features[kept]
        torch.testing.assert_close(averaged.features[row], expected)


def test_scissor_merge_from_checkpoint(tmp_path) -> None:
    features, coords = video(3, 3, 3, dim=16, seed=3)
    torch.manual_seed(0)
    module = CraftCompressor(CraftConfig(hidden_size=16))
    module.save_pretrained(tmp_path / "ckpt")
    direct = scissor_merge(features, coords, compressor=module, ratio=3.0)
    method = get_method("scissor-merge", checkpoint=tmp_path / "ckpt")
    loaded = method(features, coords, ratio=3.0)
    torch.testing.assert_close(loaded.features, direct.features)
    assert loaded.info["checkpoint"] == str(tmp_path / "ckpt")
    assert loaded.rounds == 1
