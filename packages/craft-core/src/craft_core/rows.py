"""Where the eager loop keeps the current rows: the `RowStore` protocol and its three stores.

    store = row_store(features, tracks_grad=False)   # features [N, D], any float dtype
    rows = store.gather(ids)                          # [k, D] float32
    store.replace(ids, new_rows)

Rows are carried in float32 whatever the input dtype (a bf16 row rounded back every round
would select differently from its own float32 upcast) and cast once at the end. Without
autograd, a few hundred tokens get one copy written in place (`CopiedRows`), more get a
buffer of rewritten rows only (`SlotRows`); with autograd nothing is written in place
(`PieceRows`). All three return the same values (tested in `tests/test_dense.py`). The
compiled loop's `compiled.PaddedState` is a row store too (its eager fallback round).
"""

from __future__ import annotations

from typing import Protocol

import torch

from craft_core.dense import DENSE_MAX_TOKENS


class RowStore(Protocol):
    """The current float32 rows of a video's tokens, read and rewritten by original index."""

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (`[k]` original indices) -> `[k, D]` float32."""
        ...

    def replace(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Rows `ids` (`[k]`, distinct) now read from `rows` (`[k, D]` float32)."""
        ...


def row_store(features: torch.Tensor, tracks_grad: bool) -> RowStore:
    """The store for `features` (`[N, D]`): stitched pieces when a gradient must flow, else
    in-place rows (a plain copy for up to `DENSE_MAX_TOKENS` tokens)."""
    if tracks_grad:
        return PieceRows(features)
    if features.shape[0] <= DENSE_MAX_TOKENS:
        return CopiedRows(features)
    return SlotRows(features)


class SlotRows:
    """Current feature rows in float32, without autograd: rewritten rows in place.

    Rows are carried in float32 whatever the input dtype (a bf16 row rounded back every round
    would select differently from its own float32 upcast) and cast once at the end. The input
    is never copied or modified: row i reads the input until it is first rewritten, then its
    slot in a buffer (a target rewritten again reuses its slot). The slot count lives on the
    device; the host only keeps an upper bound (rows rewritten so far, at most N) to size the
    buffer, which grows by doubling: no host sync.
    """

    def __init__(self, features: torch.Tensor) -> None:
        self.features = features
        self.slot = torch.full((features.shape[0],), -1, dtype=torch.long, device=features.device)
        self.buffer = torch.empty(0, features.shape[1], device=features.device)
        self.used = torch.zeros((), dtype=torch.long, device=features.device)
        self.bound = 0  # host upper bound on `used`

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (`[k]` original indices) -> `[k, D]` float32."""
        if self.bound == 0:
            return self.features[ids].float()
        slot = self.slot[ids]
        rewritten = self.buffer[slot.clamp(min=0)]
        return torch.where((slot >= 0).unsqueeze(1), rewritten, self.features[ids].float())

    def replace(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Rows `ids` (`[k]`, distinct) now read from `rows` (`[k, D]` float32)."""
        slot = self.slot[ids]
        fresh = slot < 0
        bound = min(self.bound + ids.numel(), self.features.shape[0])
        if bound > self.buffer.shape[0]:
            grown = min(max(2 * self.buffer.shape[0], bound), self.features.shape[0])
            buffer = torch.empty(grown, rows.shape[1], device=rows.device)
            buffer[: self.bound] = self.buffer[: self.bound]
            self.buffer = buffer
        counted = torch.cumsum(fresh, 0)
        slot = torch.where(fresh, self.used + counted - 1, slot)
        self.slot[ids] = slot
        self.used = self.used + counted[-1]
        self.bound = bound
        self.buffer[slot] = rows


class CopiedRows:
    """Current feature rows in float32, without autograd, for a few hundred tokens: one copy
    of the input (`[N, D]` float32, N <= `DENSE_MAX_TOKENS`), rewritten in place. The same
    rows as `SlotRows` (a float32 upcast is exact) with one op per gather and per write
    instead of the slot arithmetic: at small N the ops, not the bytes, are the cost."""

    def __init__(self, features: torch.Tensor) -> None:
        self.rows = features.detach().float().clone()

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (`[k]` original indices) -> `[k, D]` float32."""
        return self.rows[ids]

    def replace(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Rows `ids` (`[k]`, distinct) now read from `rows` (`[k, D]` float32)."""
        self.rows[ids] = rows


class PieceRows:
    """Current feature rows in float32, with autograd: nothing is written in place.

    Row i lives in `pieces[piece[i]][row[i]]`: piece 0 is the input, piece m the targets
    rewritten in round m, and gathers stitch the pieces together (copying `[N, D]` every
    round instead would cost O(N D) per round).
    """

    def __init__(self, features: torch.Tensor) -> None:
        n = features.shape[0]
        self.pieces = [features]
        self.piece = torch.zeros(n, dtype=torch.long, device=features.device)
        self.row = torch.arange(n, device=features.device)

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (`[k]` original indices) -> `[k, D]` float32."""
        piece = self.piece[ids]
        if len(self.pieces) == 1 or not bool(piece.any()):
            return self.pieces[0][ids].float()
        parts, positions = [], []
        for index in torch.unique(piece).tolist():
            where = torch.nonzero(piece == index).squeeze(1)
            parts.append(self.pieces[index][self.row[ids[where]]].float())
            positions.append(where)
        order = torch.argsort(torch.cat(positions))
        return torch.cat(parts)[order]

    def replace(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Rows `ids` (`[k]`, distinct) now read from `rows` (`[k, D]` float32)."""
        self.piece[ids] = len(self.pieces)
        self.row[ids] = torch.arange(ids.numel(), device=ids.device)
        self.pieces.append(rows)
