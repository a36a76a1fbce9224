"""VidCom2: frame-adaptive pruning that keeps each frame's most distinctive tokens.

Liu et al., "Video Compression Commander: Plug-and-Play Inference Acceleration for Video
Large Language Models" (VidCom2), EMNLP 2025. On the 50% lowest-variance channels
(normalised), each token gets a multi-scale Gaussian similarity (alpha in 2^-3..2^1) to the
video mean and to its frame mean; a frame's uniqueness is minus its mean video score,
softmaxed with temperature 0.01 into `p`; the frame budget is
`k_f = n_f * base * (1 + p_f - mean(p))` (capped at the frame) and the frame keeps its `k_f`
tokens with the LOWEST score.
"""

from __future__ import annotations

from typing import Any

import torch

from craft_core import CompressionResult
from craft_eval.baselines._common import (
    Checked,
    Frames,
    apportion,
    baseline,
    check_settings,
    finish,
    frames_of,
    group_sum,
    identity,
    most_similar,
    normalized,
    top_indices,
)

NAME = "vidcom2"

ALPHAS = (0.125, 0.25, 0.5, 1.0, 2.0)


def _gaussian(x: torch.Tensor, centre: torch.Tensor, alphas: tuple[float, ...]) -> torch.Tensor:
    dist_sq = ((x - centre) ** 2).sum(dim=-1)
    return sum((torch.exp(-dist_sq / (2 * a)) for a in alphas), torch.zeros_like(dist_sq))


@baseline(
    NAME,
    kind="prune",
    saliency="token features (Gaussian similarity to video / frame means)",
    description="VidCom2: frame-adaptive budgets, keeps each frame's most distinctive tokens.",
)
def vidcom2(
    features: torch.Tensor,
    coords: torch.Tensor,
    budget: Checked,
    importance: torch.Tensor | None,
    *,
    channel_fraction: float = 0.5,
    temperature: float = 0.01,
) -> CompressionResult:
    """Keep exactly `max(1, floor(N / ratio))` tokens, more of them in distinctive frames.

    `base` is the retention ratio `1 / ratio`. The published code rounds each `k_f`
    separately (so the total drifts); here the real-valued `k_f` are apportioned to the exact
    budget by largest remainder, every frame keeping at least one token when the budget
    allows. A pruned token is assigned to the most similar kept token of its frame (of the
    video when its frame keeps none). `importance` is accepted and ignored.
    """
    check_settings(
        NAME, channel_fraction=(channel_fraction, "in (0, 1]"), temperature=(temperature, "> 0")
    )
    n, d = features.shape
    info: dict[str, Any] = {
        "settings": {
            "channel_fraction": channel_fraction,
            "temperature": temperature,
            "alphas": list(ALPHAS),
        },
        "importance": None,
    }
    k = budget.floor
    if k >= n:
        return identity(NAME, features, coords, info)

    frames = frames_of(coords)
    x = features.float()
    channels = top_indices(
        x.var(dim=0, unbiased=False), max(1, int(d * channel_fraction)), largest=False
    )
    sel = normalized(x[:, channels])
    sizes = torch.tensor(frames.sizes, dtype=torch.float32, device=x.device)
    frame_centre = group_sum(sel, frames.frame_id, frames.count) / sizes[:, None]
    video_score = _gaussian(sel, sel.mean(dim=0), ALPHAS)
    frame_score = _gaussian(sel, frame_centre[frames.frame_id], ALPHAS)
    quotas = _frame_quotas(video_score, frames, sizes, budget.ratio, temperature)
    budgets = apportion(k, quotas, frames.sizes, at_least_one=True)

    token_score = video_score + frame_score
    kept_parts = [
        members[top_indices(token_score[members], k_f, largest=False)]
        for members, k_f in zip(frames.members, budgets)
    ]
    kept = torch.cat(kept_parts)

    representative = _assign_in_frame(normalized(x), frames.members, kept_parts, kept)
    info["frame_budgets"] = budgets
    return finish(NAME, features, coords, kept, representative, info=info)


def _frame_quotas(
    video_score: torch.Tensor, frames: Frames, sizes: torch.Tensor, ratio: float, temperature: float
) -> list[float]:
    """Each frame's real-valued token quota `k_f`: `n_f / ratio` scaled up for frames that
    are unlike the video (a softmax over minus their mean video score), at most `n_f`."""
    frame_video_mean = (
        torch.zeros(frames.count, device=sizes.device).index_add(0, frames.frame_id, video_score)
        / sizes
    )
    uniqueness = -frame_video_mean
    p = torch.softmax((uniqueness - uniqueness.max()) / temperature, dim=0)
    scales = ((1.0 + p - p.mean()) / ratio).clamp(max=1.0)
    return (scales * sizes).tolist()  # type: ignore[no-any-return]


def _assign_in_frame(
    e: torch.Tensor, members: list[torch.Tensor], kept_parts: list[torch.Tensor], kept: torch.Tensor
) -> torch.Tensor:
    """`[N]` representative of every token: itself when kept, else the most similar kept
    token of its frame (of the whole video when its frame keeps none). `e`: `[N, D]` unit."""
    n = e.shape[0]
    representative = torch.arange(n, device=e.device)
    is_kept = torch.zeros(n, dtype=torch.bool, device=e.device)
    is_kept[kept] = True
    for frame, kept_f in zip(members, kept_parts):
        dropped = frame[~is_kept[frame]]
        if dropped.numel() == 0:
            continue
        pool = kept_f if kept_f.numel() else kept
        representative[dropped] = pool[most_similar(e[dropped], e[pool])]
    return representative
