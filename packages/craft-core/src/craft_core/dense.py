"""The small-N pairing: every exact similarity of the video kept in one `[N, N]` matrix.

    pairing = DensePairing(embed)      # embed [N, d_sim] float64 exact (selection.row_keys)
    edges = pairing.round_edges(active_ids, square_norms, floor, threshold)

For a few hundred tokens, the float32 pass, its error bound and the exact rechecks of
`PairingState` / `FullPairing` cost far more in per-op overhead than computing every
similarity exactly: `E_i . E_j` is exact in float64 in any order (`selection.py`), so one
float64 product gives the same values as the certified path, hence the same partners and the
same selection (tested against both on the reference cases). A round then costs one row max
over the matrix; its targets' rows and columns are rewritten by one `[T, N]` product and the
sources' columns are struck out. `CraftConfig(pairing="auto")` takes this path on the CPU when
N <= `DENSE_MAX_TOKENS` (memory: `8 N^2` bytes).
"""

from __future__ import annotations

import torch

from craft_core.pairing import ranked_edges
from craft_core.selection import RankedEdges

DENSE_MAX_TOKENS = 1024
"""Largest N that `pairing="auto"` pairs densely on the CPU (measured: `nox -s bench`)."""


class DensePairing:
    """Exact similarities of all pairs, `[N, N]` float64; struck-out entries are -inf.

    Attributes:
        embed: `[N, d_sim]` float64 exact embeddings (rows of inactive tokens are stale).
        sims: `[N, N]` float64: `sims[i, j]` is the exact `E_i . E_j` for active `j != i`,
            -inf on the diagonal and in the columns of tokens that left.
        full_rows: pairing work so far, in rows of an N x N pass.
        counts: `(decided, rechecked)` rows of the last round: every row exact, none rechecked.
        fallbacks: always 0 (nothing is ever in doubt).
    """

    def __init__(self, embed: torch.Tensor) -> None:
        n = embed.shape[0]
        self.embed = embed
        self.sims = embed @ embed.T  # integers times 2^-46 below 2^53: exact in any order
        self.sims.fill_diagonal_(float("-inf"))
        # 0 for active columns, -inf for tokens that left: added to freshly computed rows.
        self.gone = torch.zeros(n, dtype=torch.float64, device=embed.device)
        self.full_rows = float(n)
        self.counts = (0, 0)
        self.fallbacks = 0

    def round_edges(
        self,
        active_ids: torch.Tensor,
        square_norms: torch.Tensor,
        floor: int,
        threshold: float | None,
    ) -> RankedEdges:
        """Pairing and selection of one round; `sizes` `[3]` (nothing in doubt)."""
        # Columns are original indices, so the first maximum is the smallest index: the tie
        # rule of `selection.full_partners`.
        sim, partner = self.sims[active_ids].max(dim=1)
        self.counts = (active_ids.numel(), 0)
        return ranked_edges(active_ids, partner, sim, square_norms, floor, threshold)

    def settle(self, active_ids: torch.Tensor, in_doubt: int) -> bool:
        """Nothing to settle: every similarity is exact."""
        return True

    def fallback(self, active_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Never needed (`settle` is always True)."""
        raise AssertionError("DensePairing never falls back")

    def update(
        self,
        targets: torch.Tensor,
        new_embed: torch.Tensor,
        active_ids: torch.Tensor,
        sources: torch.Tensor,
    ) -> None:
        """Apply one round: `sources` (`[E]`) leave, `targets` (`[T]`) take `new_embed`
        (`[T, d_sim]`); `active_ids` is unused (the struck-out columns say who left)."""
        del active_ids
        self.gone[sources] = float("-inf")
        self.sims.index_fill_(1, sources, float("-inf"))
        self.embed[targets] = new_embed
        rows = torch.addmm(self.gone, new_embed, self.embed.T)  # exact, then -inf where gone
        rows[torch.arange(targets.numel(), device=rows.device), targets] = float("-inf")
        self.sims[targets] = rows
        self.sims[:, targets] = rows.T
        self.full_rows += targets.numel()
