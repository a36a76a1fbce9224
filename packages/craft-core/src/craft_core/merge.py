"""GatedMerge: the learnable part of CRAFT, how a target fuses its sources (algorithm.md).

    x_t_new = x_t - sum_{i in S} w_i * G_i (.) (x_t - x_i)

`w` is a softmax over the target's sources of position-aware scores (3D-RoPE query/key on
the tokens' original (t, h, w)) plus the selection similarity; `G` is a per-channel gate from
an MLP on `[x_t ; x_i]`, modulated by the merge round through adaLN-Zero, so that a fresh
module gives `G = 0.5` everywhere. About 5M parameters at D = 2560.

Arithmetic, precision `exact` (the default; `runtime.RunOptions`): every step (projections,
norms, RoPE, softmax, gate MLP, LayerNorm, the fusion) runs in float64 from float32-exact inputs (float32/bf16 rows and weights upcast exactly), and
the new rows are rounded once, at the end, to the rows' dtype. A float32 reduction, norm or
transcendental rounds differently per instruction set (AVX-512 / AVX2 / generic ATen, CUDA,
a compiled kernel's order), and the next round's exact similarities see the last bit. In
float64 those paths differ by a few units of 2^-53 relative, so the one rounding to float32
gives the same bits unless the exact value lies within about 1e-16 (relative) of a float32
rounding boundary: the rows, and so the tokens, are the same on every path except with a
probability of about 1e-8 per value. Precision `fast` runs the same code in float32 (every
method takes `dtype`): about 2.5x less arithmetic time, rows machine-dependent in their last
bits.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from craft_core.config import CraftConfig


@functools.lru_cache(maxsize=1024)
def _round_embedding_cpu(round_index: int, dim: int) -> torch.Tensor:
    # Cached across calls: a tensor made under an outer `torch.inference_mode()` would be an
    # inference tensor, which a later call with autograd cannot save for backward. Python's
    # math (libm, scalar), not a vectorised kernel: the same float64 on every CPU path.
    with torch.inference_mode(False):
        half = dim // 2
        args = [round_index * math.exp(-math.log(10000.0) * i / half) for i in range(half)]
        values = [math.cos(a) for a in args] + [math.sin(a) for a in args]
        return torch.tensor(values, dtype=torch.float64)


def round_embedding(round_index: int, dim: int, device: torch.device) -> torch.Tensor:
    """phi(m): sine-cosine encoding of the merge round, as for diffusion timesteps. `[dim]`
    float64.

    Computed once per (m, dim) on the CPU and copied: one small transfer instead of seven
    kernel launches every round.
    """
    return _round_embedding_cpu(round_index, dim).to(device)


@functools.lru_cache(maxsize=64)
def _rope_inv_freq_cpu(rank: int, theta: float) -> torch.Tensor:
    # float64 from Python's math, cached: not a buffer, which `module.to(bf16)` would round.
    with torch.inference_mode(False):
        return torch.tensor([theta ** (-i / rank) for i in range(0, rank, 2)], dtype=torch.float64)


@functools.lru_cache(maxsize=64)
def _rope_inv_freq(rank: int, theta: float, device: torch.device) -> torch.Tensor:
    # Copied once per device, not once per call: a round captured as a CUDA graph may not
    # copy from host memory (and a cached tensor keeps the address the graph replays).
    with torch.inference_mode(False):
        return _rope_inv_freq_cpu(rank, theta).to(device)


EXACT = torch.float64
"""The merge's arithmetic in the `exact` precision (`runtime.RunOptions.precision`)."""


def _lone_rows(
    x_targets: torch.Tensor,
    x_sources: torch.Tensor,
    group: torch.Tensor,
    gate: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """`[L, D]` new rows of the L lone targets (one source each), in `dtype`.

    A lone source has w = 1, so x_t + G (x_i - x_t) (`fuse` with one source per row); with
    no gate (G = 1) that is x_i itself. `gate`: `[T, D]` of every target (None: no gate).
    """
    if gate is None:
        return _exact(x_sources, dtype)
    lone = x_targets.shape[0]
    return fuse(_exact(x_targets, dtype), _exact(x_sources, dtype), group, gate[:lone])


def _exact(x: torch.Tensor, dtype: torch.dtype = EXACT) -> torch.Tensor:
    """`x` in the merge's arithmetic dtype, differentiable: float64 (`exact`: a float32/bf16
    value upcasts with no rounding) or float32 (`fast`)."""
    return x.to(dtype)


def fuse(
    base: torch.Tensor, sources: torch.Tensor, group: torch.Tensor, coeff: torch.Tensor
) -> torch.Tensor:
    """THE merge formula, `x_t_new = x_t - sum_i c_i (.) (x_t - x_i)`, written as
    `x_t + sum_i c_i (.) (x_i - x_t)` with separate mul and add (no lerp / FMA, whose use
    differs between CPU instruction paths).

    Shapes: `base [T, D]` target rows, `sources [E, D]` source rows, `group [E]` the target
    row of each source, `coeff [E, D]` or `[E, 1]` the weight `w_i G_i`; all in the merge's
    dtype. Returns `[T, D]`."""
    return base.index_add(0, group, coeff * (sources - base[group]))


@dataclass
class GroupLayout:
    """Edges grouped by target, in the order GatedMerge expects.

    The `lone` targets with a single source come first, edge i belonging to target row i;
    then the shared targets, their edges contiguous. Lone groups are most of a round and
    fuse without the softmax (their weight is 1).

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
        self.reset_parameters()

        pairs = rank // 2
        # Pair p is rotated by coordinate axis section[p]: the first rope_sections[0] pairs by
        # t, the next by h, the last by w (Qwen2-VL's M-RoPE layout).
        section = torch.repeat_interleave(torch.arange(3), torch.tensor(config.rope_sections))
        assert section.numel() == pairs
        self.register_buffer("rope_axis", section, persistent=False)
        self._casts: tuple[torch.dtype, dict[int, torch.Tensor]] | None = None

    def reset_parameters(self) -> None:
        """nn.Linear's default init (U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias),
        drawn so that it is the same bits on every CPU path, then `reset_gate`.

        torch's `uniform_` rounds `a + (b - a) u` differently with AVX-512 / AVX2 / generic
        kernels: here u is drawn in float64 (exact multiples of 2^-53 from the global
        generator, so `torch.manual_seed` still decides), scaled by separate, correctly
        rounded float64 ops, and rounded once to float32."""
        with torch.no_grad():
            for layer in (self.w_q, self.w_k, self.w_down):
                bound = 1.0 / math.sqrt(layer.in_features)
                for param in layer.parameters():
                    u = torch.rand(param.shape, dtype=torch.float64, device=param.device)
                    param.copy_((u * 2.0 - 1.0) * bound)
        self.reset_gate()

    def reset_gate(self) -> None:
        """adaLN-Zero: W_up, its bias, W_mod and b_mod at zero, so G = 0.5 exactly."""
        for layer in (self.w_up, self.w_mod):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    @contextlib.contextmanager
    def parameters_cast(self, dtype: torch.dtype) -> Iterator[None]:
        """Within the block, each parameter is cast to `dtype` once instead of once a round
        (a `[d_h, 2D]` float64 copy of `W_down` costs about 6 ms at D = 1,024 on one CPU
        core). The same values: casting is exact. Only without autograd (a cached cast
        would join the rounds' gradients before rounding them); otherwise a no-op."""
        if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
            yield
            return
        self._casts = (dtype, {id(p): p.detach().to(dtype) for p in self.parameters()})
        try:
            yield
        finally:
            self._casts = None

    def _cast(self, param: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`param` in `dtype`: from `parameters_cast`'s cache inside its block, else cast."""
        if self._casts is not None and self._casts[0] == dtype:
            return self._casts[1][id(param)]
        return _exact(param, dtype)

    def rope3d(
        self, x: torch.Tensor, coords: torch.Tensor, dtype: torch.dtype = EXACT
    ) -> torch.Tensor:
        """3D rotary embedding. `x [n, r]` in `dtype`, `coords [n, 3]` -> `[n, r]` in `dtype`.

        Pair p = (x_p, x_{p + r/2}) turns by `coords[axis(p)] * inv_freq[p]` (rotate-half)."""
        inv_freq = _rope_inv_freq(self.config.rank, self.config.rope_theta, x.device)
        angles = _exact(coords[:, self.rope_axis], dtype) * _exact(inv_freq, dtype)  # [n, r/2]
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
        dtype: torch.dtype = EXACT,
    ) -> torch.Tensor:
        """w `[E]` in `dtype`: softmax over each target's sources (sums to 1 per target).

        Shapes: `x_targets [T, D]`, `x_sources [E, D]`, `group [E]` (target row of each
        edge), `coords_* [., 3]`, `similarity [E]`.
        """
        num_targets = x_targets.shape[0]
        if self.config.weighting == "uniform":
            ones = torch.ones(group.shape, dtype=dtype, device=group.device)
            counts = torch.zeros(num_targets, dtype=dtype, device=group.device)
            counts.index_add_(0, group, ones)  # no bincount: no host sync
            return 1.0 / counts[group]
        query = F.normalize(
            F.linear(_exact(x_sources, dtype), self._cast(self.w_q.weight, dtype)), dim=-1
        )
        key = F.normalize(
            F.linear(_exact(x_targets, dtype), self._cast(self.w_k.weight, dtype)), dim=-1
        )
        query = self.rope3d(query, coords_sources, dtype)
        key = self.rope3d(key, coords_targets, dtype)
        logits = (
            (query * key[group]).sum(-1) + _exact(similarity, dtype)
        ) / self.config.temperature
        peak = torch.full((num_targets,), float("-inf"), dtype=logits.dtype, device=logits.device)
        peak = peak.scatter_reduce(0, group, logits.detach(), reduce="amax")
        exp = torch.exp(logits - peak[group])
        total = torch.zeros(num_targets, dtype=exp.dtype, device=exp.device)
        total = total.index_add(0, group, exp)
        return exp / total[group]

    def gate(
        self,
        x_targets: torch.Tensor,
        x_sources: torch.Tensor,
        group: torch.Tensor,
        phi: torch.Tensor,
        dtype: torch.dtype = EXACT,
    ) -> torch.Tensor:
        """G `[E, D]` in `dtype` in (0, 1): the per-channel gate of each (target, source) edge.
        `phi` is the round's `round_embedding(m)` (`[d_phi]` float64)."""
        width = self.config.hidden_size
        weight = self._cast(self.w_down.weight, dtype)
        # W_down [x_t ; x_i] = W_t x_t + W_s x_i: the target half once per target, not per edge.
        hidden = F.linear(_exact(x_targets, dtype), weight[:, :width])[group]
        hidden = hidden + F.linear(
            _exact(x_sources, dtype), weight[:, width:], self._cast(self.w_down.bias, dtype)
        )
        return self.gate_from_hidden(hidden, phi, dtype)

    def gate_from_hidden(
        self, hidden: torch.Tensor, phi: torch.Tensor, dtype: torch.dtype = EXACT
    ) -> torch.Tensor:
        """GELU, affine-free LN, round modulation, W_up, sigmoid: `[E, d_h] -> [E, D]`, in
        `dtype` (float64 in `exact`: the input is upcast exactly). `phi` (`[d_phi]` float64) is the round's
        embedding, a tensor: a compiled graph is not specialised to the round."""
        hidden = F.gelu(_exact(hidden, dtype))
        hidden = F.layer_norm(hidden, (hidden.shape[-1],), eps=self.config.layer_norm_eps)
        modulation = F.linear(
            _exact(phi, dtype),
            self._cast(self.w_mod.weight, dtype),
            self._cast(self.w_mod.bias, dtype),
        )
        gamma, beta = modulation.chunk(2)
        up = F.linear(
            hidden * (1 + gamma) + beta,
            self._cast(self.w_up.weight, dtype),
            self._cast(self.w_up.bias, dtype),
        )
        return torch.sigmoid(up)

    def forward(
        self,
        x_targets: torch.Tensor,
        x_sources: torch.Tensor,
        layout: GroupLayout,
        coords_targets: torch.Tensor,
        coords_sources: torch.Tensor,
        similarity: torch.Tensor,
        round_index: int,
        dtype: torch.dtype = EXACT,
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
            dtype: the arithmetic: float64 (`exact`, the default) or float32 (`fast`).

        Returns:
            `[T, D]` new target rows, in the dtype of `x_targets`: computed in `dtype` and
            rounded once (module docstring).
        """
        reduce = self.config.reduce
        if reduce == "target":
            return x_targets
        lone, group = layout.lone, layout.group
        gate = None
        if reduce == "gate":
            phi = round_embedding(round_index, self.config.round_embed_dim, x_targets.device)
            gate = self.gate(x_targets, x_sources, group, phi, dtype)
        lone_rows = _lone_rows(x_targets[:lone], x_sources[:lone], group[:lone], gate, dtype)
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
            dtype,
        ).unsqueeze(1)
        coeff = weights if gate is None else gate[lone:] * weights
        shared_rows = fuse(
            _exact(x_targets[lone:], dtype), _exact(x_sources[lone:], dtype), shared_group, coeff
        )
        return torch.cat([lone_rows, shared_rows]).to(x_targets.dtype)

    def fuse_all(
        self,
        rows: tuple[torch.Tensor, torch.Tensor],
        group: torch.Tensor,
        coords: tuple[torch.Tensor, torch.Tensor],
        similarity: torch.Tensor,
        phi: torch.Tensor,
        dtype: torch.dtype = EXACT,
    ) -> torch.Tensor:
        """`forward`'s rows with fixed shapes: every target as a group, lone or not (the
        compiled loop's padded rounds; rows of groups it masks are computed and dropped).

        A lone target's softmax weight is exactly 1 (`exp(0) / 1`), so `x_t + (G * 1)(x_i -
        x_t)` is `forward`'s lone row, op for op; with no gate, a lone row is `x_i` itself.

        Shapes: `rows = (x_targets [T, D], x_sources [E, D])`, `group [E]` (target row of
        each edge, in `[0, T)`), `coords = (coords_targets [T, 3], coords_sources [E, 3])`,
        `similarity [E]`, `phi [d_phi]` float64 (`round_embedding` of the round), `dtype`
        the arithmetic (as `forward`). Returns `[T, D]` in the dtype of `x_targets`.
        """
        (x_targets, x_sources), (coords_targets, coords_sources) = rows, coords
        reduce = self.config.reduce
        if reduce == "target":
            return x_targets
        out_dtype = x_targets.dtype
        # Cast once, not in each step: the same values (exact), a third of the copies.
        x_targets, x_sources = _exact(x_targets, dtype), _exact(x_sources, dtype)
        coeff = self.source_weights(
            x_targets, x_sources, group, coords_targets, coords_sources, similarity, dtype
        ).unsqueeze(1)
        if reduce == "gate":
            coeff = self.gate(x_targets, x_sources, group, phi, dtype) * coeff
        fused = fuse(_exact(x_targets, dtype), _exact(x_sources, dtype), group, coeff)
        if reduce == "mean":  # forward copies a lone source (x_t + (x_i - x_t) may round)
            num_targets = x_targets.shape[0]
            count = group.new_zeros(num_targets).index_add_(0, group, torch.ones_like(group))
            # The edge of each lone row (one edge writes it); other rows' entries are unused.
            edge = group.new_zeros(num_targets).scatter_(
                0, group, torch.arange(group.numel(), device=group.device)
            )
            fused = torch.where((count == 1).unsqueeze(1), x_sources[edge], fused)
        return fused.to(out_dtype)
