"""GatedMerge: the learnable part of CRAFT, how a target fuses its sources (algorithm.md).

    x_t_new = x_t - sum_{i in S} w_i * G_i (.) (x_t - x_i)

`w` is a softmax over the target's sources of position-aware scores (3D-RoPE query/key on
the tokens' original (t, h, w)) plus the selection similarity; `G` is a per-channel gate from
an MLP on `[x_t ; x_i]`, modulated by the merge round through adaLN-Zero, so that a fresh
module gives `G = 0.5` everywhere. About 5M parameters at D = 2560.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from craft_core.config import CraftConfig


def round_embedding(round_index: int, dim: int, device: torch.device) -> torch.Tensor:
    """phi(m): sine-cosine encoding of the merge round, as for diffusion timesteps. `[dim]`."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=device) / half)
    args = float(round_index) * freqs
    return torch.cat([torch.cos(args), torch.sin(args)])


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """`[.., r] -> [.., r]`: (x1, x2) -> (-x2, x1) on the two halves (non-interleaved RoPE)."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class GatedMerge(nn.Module):
    """Fuses each target with its sources; the module's parameters are CRAFT's only weights.

    Parameters (names as in the paper): `w_q`, `w_k` `[D -> r]`; `w_down` `[2D -> d_h]`;
    `w_mod` `[d_phi -> 2 d_h]` whose bias is `b_mod`; `w_up` `[d_h -> D]`.
    """

    rope_inv_freq: torch.Tensor
    rope_axis: torch.Tensor

    def __init__(self, config: CraftConfig) -> None:
        super().__init__()
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
        """3D rotary embedding. `x [n, r]` float32, `coords [n, 3]` -> `[n, r]`."""
        angles = coords[:, self.rope_axis].float() * self.rope_inv_freq  # [n, r/2]
        cos = torch.cat([angles.cos(), angles.cos()], dim=-1)
        sin = torch.cat([angles.sin(), angles.sin()], dim=-1)
        return x * cos + rotate_half(x) * sin

    def source_weights(
        self,
        x_targets: torch.Tensor,
        x_sources: torch.Tensor,
        group: torch.Tensor,
        coords_targets: torch.Tensor,
        coords_sources: torch.Tensor,
        similarity: torch.Tensor,
    ) -> torch.Tensor:
        """w `[E]` float32: softmax over each target's sources (sums to 1 per target)."""
        num_targets = x_targets.shape[0]
        counts = torch.bincount(group, minlength=num_targets)
        if self.config.weighting == "uniform":
            return 1.0 / counts[group].float()
        weights = torch.ones(group.numel(), dtype=torch.float32, device=group.device)
        # A lone source gets weight 1 whatever its score: skip the projections for it.
        shared = torch.nonzero(counts[group] >= 2).squeeze(1)
        if shared.numel() == 0:
            return weights
        shared_group = group[shared]
        owners, owner_row = torch.unique(shared_group, return_inverse=True)
        dtype = self.w_q.weight.dtype
        query = F.normalize(self.w_q(x_sources[shared].to(dtype)).float(), dim=-1)
        key = F.normalize(self.w_k(x_targets[owners].to(dtype)).float(), dim=-1)
        query = self.rope3d(query, coords_sources[shared])
        key = self.rope3d(key, coords_targets[owners])
        logits = ((query * key[owner_row]).sum(-1) + similarity[shared].float()) / (
            self.config.temperature
        )
        peak = torch.full((owners.numel(),), float("-inf"), device=logits.device)
        peak = peak.scatter_reduce(0, owner_row, logits.detach(), reduce="amax")
        exp = torch.exp(logits - peak[owner_row])
        total = torch.zeros(owners.numel(), device=exp.device).index_add(0, owner_row, exp)
        return weights.index_put((shared,), exp / total[owner_row])

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
        group: torch.Tensor,
        coords_targets: torch.Tensor,
        coords_sources: torch.Tensor,
        similarity: torch.Tensor,
        round_index: int,
    ) -> torch.Tensor:
        """Fuse every target with its sources.

        Args:
            x_targets: `[T, D]` current rows of the targets.
            x_sources: `[E, D]` current rows of the sources, one per edge.
            group: `[E]` long, the target row (0..T-1) of each edge.
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
        weights = self.source_weights(
            x_targets, x_sources, group, coords_targets, coords_sources, similarity
        )
        # x_t - sum_i w_i G_i (x_t - x_i) = x_t + sum_i c_i (x_i - x_t), c_i = w_i G_i.
        if reduce == "gate":
            coeff = self.gate(x_targets, x_sources, group, round_index).float()
            coeff = coeff * weights.unsqueeze(1)
        else:
            coeff = weights.unsqueeze(1).expand(-1, x_targets.shape[1])
        base = x_targets.float()
        counts = torch.bincount(group, minlength=x_targets.shape[0])
        lone = counts[group] == 1
        # Most targets absorb one source: one fused lerp each, no scatter.
        new = base.index_put(
            (group[lone],),
            torch.lerp(base[group[lone]], x_sources[lone].float(), coeff[lone]),
        )
        shared = torch.nonzero(~lone).squeeze(1)
        if shared.numel():
            owner = group[shared]
            step = coeff[shared] * (x_sources[shared].float() - base[owner])
            new = new.index_add(0, owner, step)
        return new.to(x_targets.dtype)
