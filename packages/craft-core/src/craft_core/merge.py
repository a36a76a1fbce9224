"""GatedMerge: the learnable part of CRAFT, how a target fuses its sources (algorithm.md).

    x_t_new = x_t - sum_{i in S} w_i * G_i (.) (x_t - x_i)

`w` is a softmax over the target's sources of position-aware scores (3D-RoPE query/key on
the tokens' original (t, h, w)) plus the selection similarity; `G` is a per-channel gate from
an MLP on `[x_t ; x_i]`, modulated by the merge round through adaLN-Zero, so that a fresh
module gives `G = 0.5` everywhere. About 5M parameters at D = 2560.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from craft_core.config import CraftConfig


@functools.lru_cache(maxsize=1024)
def _round_embedding_cpu(round_index: int, dim: int) -> torch.Tensor:
    # Cached across calls: a tensor made under an outer `torch.inference_mode()` would be an
    # inference tensor, which a later call with autograd cannot save for backward.
    with torch.inference_mode(False):
        half = dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) / half)
        args = float(round_index) * freqs
        return torch.cat([torch.cos(args), torch.sin(args)]).float()


def round_embedding(round_index: int, dim: int, device: torch.device) -> torch.Tensor:
    """phi(m): sine-cosine encoding of the merge round, as for diffusion timesteps. `[dim]`.

    Computed once per (m, dim) on the CPU and copied: one small transfer instead of seven
    kernel launches every round.
    """
    return _round_embedding_cpu(round_index, dim).to(device)


@dataclass
class GroupLayout:
    """Edges grouped by target, in the order GatedMerge expects.

    The `lone` targets with a single source come first, edge i belonging to target row i;
    then the shared targets, their edges contiguous. Lone groups are most of a round and
    fuse with one `lerp` on slices, with no gather or scatter.

    Attributes:
        order: `[E]` permutation that puts the caller's edges into this layout.
        targets: `[T]` target ids, in row order.
        group: `[E]` target row of each edge (after `order`).
        lone: number of single-source targets (= their edges).
    """

    order: torch.Tensor
    targets: torch.Tensor
    group: torch.Tensor
    lone: int


def group_edges(edge_targets: torch.Tensor) -> GroupLayout:
    """Lay out edges given the target id of each (`[E]`) for `GatedMerge.forward`."""
    unique, inverse, counts = torch.unique(edge_targets, return_inverse=True, return_counts=True)
    single = counts == 1
    rank = torch.cat([torch.nonzero(single).squeeze(1), torch.nonzero(~single).squeeze(1)])
    row_of = torch.empty_like(rank)
    row_of[rank] = torch.arange(rank.numel(), device=rank.device)
    group = row_of[inverse]
    order = torch.argsort(group, stable=True)
    return GroupLayout(order, unique[rank], group[order], int(single.sum()))


class GatedMerge(nn.Module):
    """Fuses each target with its sources; the module's parameters are CRAFT's only weights.

    Parameters (names as in the paper): `w_q`, `w_k` `[D -> r]`; `w_down` `[2D -> d_h]`;
    `w_mod` `[d_phi -> 2 d_h]` whose bias is `b_mod`; `w_up` `[d_h -> D]`.
    """

    rope_inv_freq: torch.Tensor
    rope_axis: torch.Tensor

    def __init__(self, config: CraftConfig) -> None:
        super().__init__()
        if not isinstance(config, CraftConfig):
            raise TypeError(f"config must be a CraftConfig, got {type(config).__name__}")
        self.config = config
        width, rank, hidden = config.hidden_size, config.rank, config.gate_hidden
        self.w_q = nn.Linear(width, rank, bias=False)
        self.w_k = nn.Linear(width, rank, bias=False)
        self.w_down = nn.Linear(2 * width, hidden)
        self.w_mod = nn.Linear(config.round_embed_dim, 2 * hidden)
        self.w_up = nn.Linear(hidden, width)
        self.reset_gate()

        pairs = rank // 2
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, rank, 2).float() / rank))
        # Pair p is rotated by coordinate axis section[p]: the first rope_sections[0] pairs by
        # t, the next by h, the last by w (Qwen2-VL's M-RoPE layout).
        section = torch.repeat_interleave(torch.arange(3), torch.tensor(config.rope_sections))
        assert section.numel() == pairs
        self.register_buffer("rope_inv_freq", inv_freq, persistent=False)
        self.register_buffer("rope_axis", section, persistent=False)

    def reset_gate(self) -> None:
        """adaLN-Zero: W_up, its bias, W_mod and b_mod at zero, so G = 0.5 exactly."""
        for layer in (self.w_up, self.w_mod):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def rope3d(self, x: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        """3D rotary embedding. `x [n, r]` float32, `coords [n, 3]` -> `[n, r]`.

        Pair p = (x_p, x_{p + r/2}) turns by `coords[axis(p)] * inv_freq[p]` (rotate-half)."""
        angles = coords[:, self.rope_axis].float() * self.rope_inv_freq  # [n, r/2]
        cos, sin = angles.cos(), angles.sin()
        first, second = x.chunk(2, dim=-1)
        return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)

    def source_weights(
        self,
        x_targets: torch.Tensor,
        x_sources: torch.Tensor,
        group: torch.Tensor,
        coords_targets: torch.Tensor,
        coords_sources: torch.Tensor,
        similarity: torch.Tensor,
    ) -> torch.Tensor:
        """w `[E]` float32: softmax over each target's sources (sums to 1 per target).

        Shapes: `x_targets [T, D]`, `x_sources [E, D]`, `group [E]` (target row of each
        edge), `coords_* [., 3]`, `similarity [E]`.
        """
        num_targets = x_targets.shape[0]
        if self.config.weighting == "uniform":
            counts = torch.zeros(num_targets, device=group.device)  # no bincount: no host sync
            counts.index_add_(0, group, torch.ones(group.shape, device=group.device))
            return 1.0 / counts[group]
        dtype = self.w_q.weight.dtype
        query = F.normalize(self.w_q(x_sources.to(dtype)).float(), dim=-1)
        key = F.normalize(self.w_k(x_targets.to(dtype)).float(), dim=-1)
        query = self.rope3d(query, coords_sources)
        key = self.rope3d(key, coords_targets)
        logits = ((query * key[group]).sum(-1) + similarity.float()) / self.config.temperature
        peak = torch.full((num_targets,), float("-inf"), device=logits.device)
        peak = peak.scatter_reduce(0, group, logits.detach(), reduce="amax")
        exp = torch.exp(logits - peak[group])
        total = torch.zeros(num_targets, device=exp.device).index_add(0, group, exp)
        return exp / total[group]

    def gate(
        self,
        x_targets: torch.Tensor,
        x_sources: torch.Tensor,
        group: torch.Tensor,
        round_index: int,
    ) -> torch.Tensor:
        """G `[E, D]` in (0, 1): the per-channel gate of each (target, source) edge."""
        dtype = self.w_down.weight.dtype
        width = self.config.hidden_size
        # W_down [x_t ; x_i] = W_t x_t + W_s x_i: the target half once per target, not per edge.
        weight_target = self.w_down.weight[:, :width]
        weight_source = self.w_down.weight[:, width:]
        hidden = F.linear(x_targets.to(dtype), weight_target)[group]
        hidden = hidden + F.linear(x_sources.to(dtype), weight_source, self.w_down.bias)
        return self.gate_from_hidden(hidden, round_index)

    def gate_from_hidden(self, hidden: torch.Tensor, round_index: int) -> torch.Tensor:
        """GELU, affine-free LN, round modulation, W_up, sigmoid: `[E, d_h] -> [E, D]`."""
        hidden = F.gelu(hidden)
        hidden = F.layer_norm(hidden, (hidden.shape[-1],), eps=self.config.layer_norm_eps)
        phi = round_embedding(round_index, self.config.round_embed_dim, hidden.device)
        gamma, beta = self.w_mod(phi.to(hidden.dtype)).chunk(2)
        return torch.sigmoid(self.w_up(hidden * (1 + gamma) + beta))

    def forward(
        self,
        x_targets: torch.Tensor,
        x_sources: torch.Tensor,
        layout: GroupLayout,
        coords_targets: torch.Tensor,
        coords_sources: torch.Tensor,
        similarity: torch.Tensor,
        round_index: int,
    ) -> torch.Tensor:
        """Fuse every target with its sources.

        Args:
            x_targets: `[T, D]` current rows of `layout.targets`.
            x_sources: `[E, D]` current rows of the sources, in layout order.
            layout: the grouping from `group_edges` (lone targets first).
            coords_targets: `[T, 3]` original (t, h, w) of the targets.
            coords_sources: `[E, 3]` original (t, h, w) of the sources.
            similarity: `[E]` selection similarity s_ti of each edge.
            round_index: the merge round m (1-based).

        Returns:
            `[T, D]` new target rows, in the dtype of `x_targets`.
        """
        reduce = self.config.reduce
        if reduce == "target":
            return x_targets
        lone, group = layout.lone, layout.group
        gate = None
        if reduce == "gate":
            gate = self.gate(x_targets, x_sources, group, round_index).float()
        # x_t - sum_i w_i G_i (x_t - x_i): a lone source has w = 1, so x_t + G (x_i - x_t);
        # with G = 1 that is x_i itself. Separate mul and add (no lerp, whose FMA use differs
        # between CPU instruction paths) keep every row the same bits on every path.
        if gate is None:
            lone_rows = x_sources[:lone].float()
        else:
            base = x_targets[:lone].float()
            lone_rows = base + gate[:lone] * (x_sources[:lone].float() - base)
        if lone == x_targets.shape[0]:
            return lone_rows.to(x_targets.dtype)
        shared_group = group[lone:] - lone
        weights = self.source_weights(
            x_targets[lone:],
            x_sources[lone:],
            shared_group,
            coords_targets[lone:],
            coords_sources[lone:],
            similarity[lone:],
        ).unsqueeze(1)
        coeff = weights if gate is None else gate[lone:] * weights
        shared_base = x_targets[lone:].float()
        step = coeff * (x_sources[lone:].float() - shared_base[shared_group])
        shared_rows = shared_base.index_add(0, shared_group, step)
        return torch.cat([lone_rows, shared_rows]).to(x_targets.dtype)
