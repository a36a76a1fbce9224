"""FastVID and TimeChat-Online's DTD against hand-worked examples (the published code's
arithmetic is checked in ../test_baselines_published.py)."""

from __future__ import annotations

import torch
from baseline_helpers import check_result, grid_coords, video

from craft_eval.baselines import dtd, fastvid
from craft_eval.baselines.fastvid import density_peaks, segment_frames


def test_fastvid_segments_at_lowest_and_below_tau() -> None:
    a, b, c = torch.eye(3)
    means = torch.stack([a, a, a, b, b, c])  # adjacent similarities 1, 1, 0, 1, 0
    assert segment_frames(means, segments=2, tau=0.9) == [[0, 1, 2], [3, 4], [5]]
    assert segment_frames(means, segments=2, tau=-2.0) == [[0, 1, 2], [3, 4, 5]]
    assert segment_frames(means, segments=1, tau=-2.0) == [[0, 1, 2, 3, 4, 5]]
    assert len(segment_frames(means, segments=8, tau=-2.0)) == 6
    assert segment_frames(means[:1], segments=8, tau=0.9) == [[0]]


def test_density_peaks_pick_one_per_cluster() -> None:
    g = torch.Generator().manual_seed(0)
    centre_a, centre_b = torch.eye(4)[:2]
    cluster_a = centre_a + 0.05 * torch.randn(6, 4, generator=g)
    cluster_b = centre_b + 0.05 * torch.randn(4, 4, generator=g)
    outlier = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    e = torch.nn.functional.normalize(torch.cat([cluster_a, cluster_b, outlier]), dim=-1)
    picks = density_peaks(e, 2, knn=3).tolist()
    assert sum(p < 6 for p in picks) == 1 and sum(6 <= p < 10 for p in picks) == 1


def test_fastvid_salient_tokens_follow_attention() -> None:
    features, coords = video(2, 4, 4, dim=8, seed=5)
    attention = torch.zeros(32)
    attention[[3, 7, 20, 30]] = 1.0
    # budget 8 = 4 per frame; d = 0.5 keeps 2 salient per frame: the attended ones
    result = fastvid(features, coords, ratio=4.0, importance=attention, d=0.5)
    assert {3, 7, 20, 30} <= set(result.kept_index.tolist())
    for i in (3, 7, 20, 30):
        row = int(result.assignment[i])
        assert int(result.kept_index[row]) == i
        assert int((result.assignment == row).sum()) == 1  # nothing merges into them


def test_fastvid_merges_stay_in_their_segment() -> None:
    g = torch.Generator().manual_seed(2)
    first, second = video(4, 3, 3, dim=8, seed=1, noise=0.1)[0], None
    second = torch.randn(9, 8, generator=g) * 3 + 5
    features = torch.cat([first, second.repeat(4, 1)])
    coords = grid_coords(8, 3, 3)
    result = fastvid(features, coords, ratio=3.0, segments=2)
    assert result.info["segments"] == [4, 4]
    owner = result.kept_index[result.assignment]
    assert torch.equal(coords[owner, 0] >= 4, coords[:, 0] >= 4)


def _two_frame_clip() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    frame0 = torch.randn(4, 6, generator=g)
    frame1 = torch.stack(
        [frame0[0], 2 * frame0[1] + 0.1 * torch.randn(6, generator=g), 3 + frame0[2], -frame0[3]]
    )  # (0,0) repeats, (0,1) nearly repeats, (1,0) shifted away, (1,1) reversed
    return torch.cat([frame0, frame1]), grid_coords(2, 2, 2)


def test_dtd_hand_made_two_frame_clip() -> None:
    features, coords = _two_frame_clip()
    result = dtd(features, coords, threshold=0.9)
    assert result.kept_index.tolist() == [0, 1, 2, 3, 6, 7]
    assert result.kept_index[result.assignment].tolist() == [0, 1, 2, 3, 0, 1, 6, 7]
    torch.testing.assert_close(result.features, features[[0, 1, 2, 3, 6, 7]])
    # budget 7: only the most redundant (4, an exact repeat) goes
    seven = dtd(features, coords, ratio=8 / 7)
    assert seven.kept_index.tolist() == [0, 1, 2, 3, 5, 6, 7]
    assert seven.kept_index[seven.assignment].tolist() == [0, 1, 2, 3, 0, 5, 6, 7]
    # budget 4: the first frame stays whole
    assert dtd(features, coords, ratio=2.0).kept_index.tolist() == [0, 1, 2, 3]


def test_dtd_follows_chains_and_floor() -> None:
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    features = torch.cat([x, x, x])  # a static clip of 3 frames
    coords = grid_coords(3, 2, 2)
    result = dtd(features, coords, threshold=0.5)
    assert result.kept_index.tolist() == [0, 1, 2, 3]
    assert result.assignment.tolist() == [0, 1, 2, 3] * 3
    noisy = features + 0.1 * torch.randn(12, 5, generator=torch.Generator().manual_seed(2))
    floored = dtd(noisy, coords, threshold=0.5, min_tokens=6)
    e = torch.nn.functional.normalize(noisy, dim=-1)
    redundancy = (e[4:] * e[:-4]).sum(dim=-1)  # cosine with the same patch one frame back
    least = (torch.sort(redundancy, stable=True).indices[:2] + 4).sort().values.tolist()
    assert floored.kept_index.tolist() == [0, 1, 2, 3, *least]


def test_dtd_budget_below_first_frame_strides() -> None:
    features, coords = video(1, 1, 5, dim=4, seed=3)
    result = dtd(features, coords, ratio=2.5)  # 2 of 5, no temporal redundancy at all
    assert result.kept_index.tolist() == [0, 4]
    check_result(result, features, coords, 2)
