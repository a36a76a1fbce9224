"""HoliTom's stage before the language model: static windows by dynamic programming, static
slots averaged over time and clustered, the rest kept by attention.

Shao et al., "HoliTom: Holistic Token Merging for Fast Video Large Language Models",
NeurIPS 2025. Re-stated from the official code, github.com/cokeshao/HoliTom at commit
e9b2972f6895c9e7d7fe74eb8c3a2ecaab8056e0, `holitom/llava_arch.py`:

1. `prepare_inputs_labels_for_multimodal`: the cosine of every token with the token at the
   same place in the next frame; `select_static_windows`: a window `[s, e]` saves
   `(e - s) * #{places similar (> tau) across every step of the window}` tokens, and
   dynamic programming over the frames picks the windows (at most `max_window_size`
   frames, a window of one frame saving nothing) that save the most; the retention is then
   raised to `min(r * N / (N - saved), 1)`.
2. `get_static_dynamic_features`: in a window of several frames the places similar across
   it are static: one slot each, the mean over the window's frames; the other places are
   dynamic, per frame.
3. `holitom` -> `merge_tokens_by_attention_density` (per frame, dynamic tokens):
   `ceil(n * r)` tokens, `round(ceil(n * r) * (1 - D))` of them the top attention, the
   others (`D > 0`) DPC-kNN centres of the rest, merged as below.
4. `merge_tokens_by_density` + `merge_tokens_by_clustering` (the static slots of a window):
   `round(s * r)` DPC-kNN centres (`k = min(K, clusters)`, `cdist / sqrt(D)`); every other
   slot joins its nearest centre; a centre with members becomes
   `beta * centre + (1 - beta) * mean(members)` (the environment's `NO_BETA` unset, as the
   published scripts run it).

Deliberate deviations (craft-eval's docs/baselines.md, HoliTom): `D > 0` runs what the code means (the
official `pos.masked_select(mask.unsqueeze(-1))` broadcasts to `[B, n, n]` and crashes);
a static slot is placed at its window's first frame and every kept token at its own
place (the official code puts a window's static slots before its dynamic tokens); places
are matched across frames by `(h, w)` (uneven frames: a place missing in a frame is not
static); ties go to the smaller index where the official code adds `rand * 1e-6` to the
density; the budget is exact by default (`exact_budget=True`: `floor(N / ratio)` split over
the dynamic frames and static groups by size, largest remainder; False: the official
counts with `r = 1 / ratio`); when the static windows would leave fewer tokens than that,
the longest window allowed is halved until they leave enough. The stage inside the language model is `holitom-llm`
(`craft_eval.baselines.in_model`).
"""

from __future__ import annotations

import math

import torch

from craft_core import CompressionResult
from craft_eval.baselines._common import (
    ATTENTION,
    ATTENTION_NOTE,
    COUNT,
    Checked,
    apportion,
    baseline,
    check_settings,
    finish,
    frames_of,
    most_similar,
    normalized,
    opening,
    top_indices,
)
from craft_eval.baselines.flashvid import density_peaks

NAME = "holitom"
EXACT = "donot_use_mm_for_euclid_dist"  # cdist pair by pair


def place_table(coords: torch.Tensor, frames: list[torch.Tensor]) -> torch.Tensor:
    """`[T, P]` token index at each place `(h, w)` (sorted) of each frame, -1 where absent."""
    places, place_of = torch.unique(coords[:, 1:], dim=0, return_inverse=True)
    table = torch.full((len(frames), places.shape[0]), -1, dtype=torch.long)
    for f, members in enumerate(frames):
        table[f, place_of[members]] = members
    return table.to(coords.device)


def step_similarity(e: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """`[T - 1, P]` cosine of each place with the same place in the next frame (`e`
    normalised rows); -inf where either frame lacks the place."""
    both = (table[:-1] >= 0) & (table[1:] >= 0)
    a, b = e[table[:-1].clamp(min=0)], e[table[1:].clamp(min=0)]
    sims = (a * b).sum(dim=-1)
    return torch.where(both, sims, torch.full_like(sims, -math.inf))


def static_windows(sim: torch.Tensor, tau: float, max_window: int) -> tuple[list, float]:
    """`select_static_windows`: the windows `[(start, end)]` covering the frames in order,
    and the tokens they save. `sim [T - 1, P]`."""
    t = sim.shape[0] + 1
    similar = (sim > tau).float()
    saved = torch.zeros(t, t)
    for s in range(t - 1):
        run = torch.cumprod(similar[s:], dim=0).sum(dim=-1)  # places static over s..s+1+i
        saved[s, s + 1 :] = run * torch.arange(1, t - s)
    best = [0.0] * t
    start = [0] * t
    for i in range(t):
        value, first = (best[i - 1] if i > 0 else 0.0), i
        for size in range(2, min(i + 1, max_window) + 1):
            j = i - size
            candidate = (best[j] if j >= 0 else 0.0) + float(saved[j + 1, i])
            if candidate > value:
                value, first = candidate, j + 1
        best[i], start[i] = value, first
    windows, i = [], t - 1
    while i >= 0:
        windows.append((start[i], i))
        i = start[i] - 1
    return windows[::-1], best[-1]


def merge_into_centres(
    rows: torch.Tensor, count: int, knn: int, beta: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`merge_tokens_by_density` / `_by_clustering` on `rows [m, D]`: `count` DPC-kNN
    centres, every other row joining its nearest centre (`cdist`, first minimum).

    Returns the centres (positions in `rows`, ascending), their rows `[c, D]`
    (`beta * centre + (1 - beta) * mean(members)` where a centre has members) and each
    row's centre `[m]` (index into the centres).
    """
    x = rows
    centres = density_peaks(rows, count, min(knn, count))
    owner = torch.cdist(rows, rows[centres], compute_mode=EXACT).argmin(dim=-1)
    owner[centres] = torch.arange(centres.numel(), device=x.device)
    is_member = torch.ones(rows.shape[0], dtype=torch.bool, device=x.device)
    is_member[centres] = False
    one_hot = torch.nn.functional.one_hot(owner[is_member], centres.numel()).to(rows.dtype)
    members = one_hot.sum(dim=0)[:, None]
    mean = (one_hot.T @ rows[is_member]) / members.clamp(min=1.0)
    merged = torch.where(members > 0, beta * rows[centres] + (1.0 - beta) * mean, rows[centres])
    return centres, merged, owner


def _units(table: torch.Tensor, sim: torch.Tensor, windows: list, tau: float) -> list:
    """The groups HoliTom compresses separately: `("dynamic", tokens [n])` per frame of a
    window, `("static", slots [s, W])` per window of several frames (each slot: its
    place's tokens over the window's frames, the first frame's first)."""
    units = []
    for first, last in windows:
        present = (table[first : last + 1] >= 0).all(dim=0)
        if last > first:
            static = present & (sim[first:last] > tau).all(dim=0)
        else:
            static = torch.zeros_like(present)
        if bool(static.any()):
            units.append(("static", table[first : last + 1, static].T))
        for f in range(first, last + 1):
            row = table[f, ~static]
            units.append(("dynamic", row[row >= 0]))
    return units


@baseline(
    NAME,
    kind="merge",
    needs=("attention",),
    saliency=ATTENTION,
    description="HoliTom (official code, before the LLM): static windows by dynamic "
    "programming, static slots averaged and clustered, the rest kept by attention."
    + ATTENTION_NOTE,
)
def holitom(
    features: torch.Tensor,
    coords: torch.Tensor,
    budget: Checked,
    importance: torch.Tensor | None,
    *,
    tau: float = 0.8,
    d: float = 0.0,
    beta: float = 0.6,
    knn: int = 7,
    max_window: int = 1024,
    exact_budget: bool = True,
) -> CompressionResult:
    """HoliTom before the language model (see the module docstring).

    Args:
        features: `[N, D]` one video's tokens; coords: `[N, 3]` `(t, h, w)`.
        importance: `[N]` attention received per token (L2-norm proxy without it).
        tau: a place is static across a step when its cosine exceeds this (the published
            scripts: 0.8, 0.65 at 10% retention).
        d: the share of each dynamic frame's budget given to clusters (`D`, default 0).
        beta: a centre's own weight when members merge into it.
        knn: the most neighbours of the DPC-kNN density (`K`); max_window: the longest
            static window in frames.
        exact_budget: exactly `max(1, floor(N / ratio))` tokens; False: the official counts.
    """
    check_settings(NAME, d=(d, "in [0, 1]"), knn=(knn, COUNT), max_window=(max_window, COUNT))
    settings = dict(tau=tau, d=d, beta=beta, knn=knn, max_window=max_window)
    settings["exact_budget"] = exact_budget
    scores, info, done = opening(NAME, features, coords, budget, importance, settings)
    if done is not None:
        return done
    n, x = features.shape[0], features.float()
    e = normalized(x)
    table = place_table(coords, frames_of(coords).members)
    sim = step_similarity(e, table)
    windows, saved = fitting_windows(sim, tau, max_window, n - budget.floor if exact_budget else n)
    units = _units(table, sim, windows, tau)
    r = min((1.0 / budget.ratio) / ((n - saved) / n), 1.0)
    counts = _counts(units, budget.floor if exact_budget else None, r)
    kept, rows, representative = _compress_units(x, scores, units, counts, settings)
    _adopt_dropped(e, kept, representative)
    info["windows"] = [[a, b] for a, b in windows]
    return finish(NAME, features, coords, kept, representative, rows, info=info)


def fitting_windows(
    sim: torch.Tensor, tau: float, max_window: int, savable: float
) -> tuple[list, float]:
    """`static_windows`, the longest window allowed halved until the windows save at most
    `savable` tokens (the exact budget: `N - floor(N / ratio)`; N: the official windows)."""
    windows, saved = static_windows(sim, tau, max_window)
    while saved > savable:  # windows too long to fill the budget
        max_window //= 2
        windows, saved = static_windows(sim, tau, max_window)
    return windows, saved


def _compress_units(
    x: torch.Tensor, scores: torch.Tensor, units: list, counts: list[int], settings: dict
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each unit of `_units` compressed to its count: `(kept [K], rows [K, D],
    representative [N])`."""
    kept, rows, representative = [], [], torch.arange(x.shape[0], device=x.device)
    for (kind, tokens), count in zip(units, counts, strict=True):
        if kind == "static":
            part = _static(x, tokens, count, settings, representative)
        else:
            part = _dynamic(x, scores, tokens, count, settings, representative)
        kept.append(part[0])
        rows.append(part[1])
    return torch.cat(kept), torch.cat(rows), representative


def _counts(units: list, exact: int | None, r: float) -> list[int]:
    """Tokens each unit keeps: `exact` split by size (largest remainder), or the official
    `ceil(n * r)` per dynamic frame and `round(s * r)` per static group."""
    sizes = [int(tokens.shape[0]) for _, tokens in units]
    if exact is not None:
        return apportion(exact, sizes, sizes)
    return [
        math.ceil(size * r) if kind == "dynamic" else round(size * r)
        for (kind, _), size in zip(units, sizes, strict=True)
    ]


def _dynamic(
    x: torch.Tensor,
    scores: torch.Tensor,
    tokens: torch.Tensor,
    count: int,
    settings: dict,
    representative: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One frame's dynamic tokens `[n]`: `round(count * (1 - d))` by attention, the rest of
    `count` DPC-kNN centres of the others. -> (kept, rows); `representative` in place."""
    dominant = round(count * (1.0 - settings["d"]))
    top = top_indices(scores[tokens], dominant)
    rest = torch.ones(tokens.numel(), dtype=torch.bool, device=x.device)
    rest[top] = False
    kept, rows = [tokens[top]], [x[tokens[top]]]
    others = tokens[rest]
    if count - dominant > 0 and others.numel():
        centres, merged, owner = merge_into_centres(
            x[others], count - dominant, settings["knn"], settings["beta"]
        )
        representative[others] = others[centres][owner]
        kept.append(others[centres])
        rows.append(merged)
    return torch.cat(kept), torch.cat(rows)


def _static(
    x: torch.Tensor, slots: torch.Tensor, count: int, settings: dict, representative: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One window's static slots `[s, W]` (token indices): each the mean over the window,
    placed at the first frame; `count` DPC-kNN centres merge the rest. -> (kept, rows)."""
    place = slots[:, 0]
    representative[slots] = place[:, None].expand_as(slots)
    if count <= 0:
        return place[:0], x[:0]
    centres, merged, owner = merge_into_centres(
        x[slots].mean(dim=1), count, settings["knn"], settings["beta"]
    )
    representative[slots] = place[centres][owner][:, None].expand_as(slots)
    return place[centres], merged


def _adopt_dropped(e: torch.Tensor, kept: torch.Tensor, representative: torch.Tensor) -> None:
    """A token in no kept row (dropped, as the official code does) points at its most
    similar kept token. In place."""
    is_kept = torch.zeros(e.shape[0], dtype=torch.bool, device=e.device)
    is_kept[kept] = True
    lost = torch.nonzero(~is_kept[representative]).squeeze(1)
    if lost.numel():
        representative[lost] = kept[most_similar(e[lost], e[kept])]
