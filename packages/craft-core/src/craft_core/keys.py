"""The exact similarity keys of CRAFT's selection: W_rand and each row's embedding `E` and
squared norm, computed so that every comparison selection makes is the same bits on every path.

**Exact similarities.** Exact duplicate tokens are common in video, so mathematically equal
similarities are common, and a floating-point dot product rounds them differently on every
path (matmul vs dot, block shape, AVX2 vs AVX-512, CPU vs CUDA). Here every quantity that
selection compares is computed EXACTLY, so it is the same bits on every path:

- a feature row is rounded to `X_BITS` significant bits of its largest entry, and W_rand to a
  grid of `2^-W_BITS`; their product is then a sum of integers below 2^53, exact in float64
  whatever the summation order;
- that projection is rounded to `P_BITS` bits of its largest entry, so its squared norm is
  exact too, and the normalisation is one correctly rounded `sqrt` and one division;
- E is rounded to the grid `2^-E_BITS`, so `E_i . E_j` is a multiple of `2^-46` below 2^53
  in magnitude: exact in float64 in any order (`torch.mm`, a dot product, cuBLAS).
- the orientation's row norms are squared norms of the row rounded to `NORM_BITS` bits of its
  largest entry: exact sums of integers.

Only IEEE operations that are correctly rounded (scaling by powers of two, `round`, `sqrt`,
division) or exact take part, so `kept_index`, `assignment` and `rounds` are a pure function
of (rows, coords, config, budget). The grids are far finer than the rounding of float32 rows.

`algorithm.py` (the plain round) and `selection.py` (the fast one) both read their keys here.
"""

from __future__ import annotations

import torch

X_BITS = 23
"""Significant bits kept of each feature, relative to its row's largest entry."""
W_BITS = 16
"""W_rand is rounded to multiples of 2^-W_BITS (its entries lie in [-1, 1])."""
P_BITS = 22
"""Significant bits kept of each projected row before normalisation (d_sim <= 512)."""
E_BITS = 23
"""E is rounded to multiples of 2^-E_BITS: similarities are multiples of 2^-46."""
NORM_BITS = 19
"""Significant bits of each row kept for its exact squared norm (D <= 2^15)."""


def make_projection(hidden_size: int, sim_dim: int, seed: int) -> torch.Tensor:
    """W_rand `[D, d_sim]`: seeded random entries with unit-norm columns, float32.

    Each entry is a sum of four uniform integers in [-4096, 4096) (Irwin-Hall: close to a
    normal, zero mean), drawn with a seeded CPU generator, and each column is divided by its
    norm computed exactly (a sum of integers below 2^53, one correctly rounded sqrt). No
    transcendental function is involved (`torch.randn` uses vectorised log/cos whose last bit
    depends on the CPU's instruction set), so the matrix is the same bits on every machine.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    draws = torch.randint(-4096, 4096, (4, hidden_size, sim_dim), generator=generator)
    weight = draws.sum(dim=0).double()
    norms = (weight * weight).sum(dim=0, keepdim=True).sqrt()
    return (weight / norms).float()


def grid_projection(projection: torch.Tensor) -> torch.Tensor:
    """W_rand as integers `round(W * 2^W_BITS)` in float64, `[D, d_sim]` (exact, any device)."""
    return torch.round(projection.double() * 2.0**W_BITS)


def _row_scale(top: torch.Tensor, bits: int) -> torch.Tensor:
    """`[n, 1]` float64 power of two that brings `top` (each row's largest |entry|, `[n, 1]`
    float64) into [2^(bits-1), 2^bits), built from the exponent bits (exact; no `pow` or
    `exp2` call)."""
    # top = m * 2^e has exponent field f = e + 1023; 2^(bits - 1 - e) has field
    # bits + 2045 - f. The clamp keeps an all-zero row's scale finite (it stays zero).
    field = torch.bitwise_right_shift(top.view(torch.int64), 52).clamp_(min=bits)
    return torch.bitwise_left_shift(bits + 2045 - field, 52).view(torch.float64)


def row_keys(
    features: torch.Tensor, weight: torch.Tensor, block: int = 4096
) -> tuple[torch.Tensor, torch.Tensor]:
    """Everything selection reads of some rows, computed exactly (see the module docstring).

    Args:
        features: `[n, D]` rows (any float dtype).
        weight: `[D, d_sim]` `grid_projection(W_rand)`.
        block: rows per step (bounds the float64 copies to `block x D`).

    Returns:
        `(E [n, d_sim] float64 on the grid 2^-E_BITS, squared norms [n] float64)`; an
        all-zero row gives a zero embedding.
    """
    embeds, norms = [], []
    for start in range(0, features.shape[0], block):
        # Read in the input dtype (no float64 copy): the row maximum is exact in any dtype,
        # and the product with a float64 power of two promotes to float64, exactly.
        rows = features[start : start + block].detach()
        low, high = torch.aminmax(rows, dim=1, keepdim=True)  # one read, no |rows| temporary
        scale = _row_scale(torch.maximum(high, -low).double(), X_BITS)
        # float64, exact: a power of two. Upcast, then scaled in place: a mixed-dtype
        # product, or a second [n, D] float64 temporary, costs 10x (measured, 1 thread).
        scaled = rows.to(torch.float64).mul_(scale)
        # The norm's grid is 2^(NORM_BITS - X_BITS) coarser: one more exact scaling.
        grid = torch.mul(scaled, 2.0 ** (NORM_BITS - X_BITS)).round_()
        # Row-wise dot products of integers below 2^53: exact in any order.
        square = torch.einsum("nd,nd->n", grid, grid)
        norms.append(square * 2.0 ** (2 * (X_BITS - NORM_BITS)) / (scale * scale).squeeze(1))
        # Integers below 2^53: exact in any order. `W^T X^T` runs MKL's float64 kernel about
        # twice as fast as `X W` here (measured, [2048, 1024] x [1024, 128], 1 thread).
        projected = torch.mm(weight.T, scaled.round_().T).T
        top = projected.abs().amax(dim=1, keepdim=True)
        projected = torch.round(projected * _row_scale(top, P_BITS))
        norm = torch.einsum("nd,nd->n", projected, projected).sqrt().unsqueeze(1)  # exact sum
        # A nonzero integer vector has norm >= 1, so the clamp only spares zero rows 0/0.
        embeds.append(torch.round(projected / norm.clamp(min=1.0) * 2.0**E_BITS) * 2.0**-E_BITS)
    if len(embeds) == 1:
        return embeds[0], norms[0]
    if not embeds:
        empty = torch.zeros(0, dtype=torch.float64, device=weight.device)
        return empty.reshape(0, weight.shape[1]), empty
    return torch.cat(embeds), torch.cat(norms)
