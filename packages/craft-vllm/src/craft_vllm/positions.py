"""M-RoPE positions of a compressed Qwen video, in vLLM's "pruned media" format.

vLLM's video pruning (`SupportsMultiModalPruning`) hands the runner each item's kept rows
with extra columns: `(t, h, w)` of every kept row relative to the item's first position, and
one column whose value, added to the item's start, is the position of the first text token
after it. The runner (`recompute_mrope_positions`) then writes the real positions. CRAFT
keeps each output row's ORIGINAL `(t, h, w)`, so these columns are the full grid's rows at
`kept_index`, and the text after the video continues exactly where it does uncompressed
(`max over the FULL grid + 1`): Qwen's original rule, which vLLM's own
`get_mrope_input_positions` follows and the checkpoints were trained with. transformers 5.x's
`get_rope_index` starts that text at `start + max(h, w)` instead (Qwen2.5-VL); craft-adapters
follows Qwen's rule with `wrap(..., positions="original")`, which is what the equality tests
compare against.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

BASE = 256
"""An integer x rides in a row's extra columns as the pair (x // BASE, x % BASE): each part an
integer up to 256, exact in bfloat16 (flat.py's original row index, glm4v.py's slot and
relative positions)."""


def grid_positions(t: int, h: int, w: int, t_factor: float = 1.0) -> np.ndarray:
    """`[3, t*h*w]` int64 `(t, h, w)` of a `t x h x w` grid of merged tokens, row-major.

    Temporal rows are scaled by `t_factor` (Qwen2.5-VL: `tokens_per_second * second_per_grid`)
    and floored in float64, as vLLM's own `get_mrope_input_positions` does uncompressed.
    """
    grid = np.indices((t, h, w)).reshape(3, -1).astype(np.int64)
    if t_factor != 1.0:
        grid[0] = (grid[0] * t_factor).astype(np.int64)
    return grid


def pruned_position_columns(grid: np.ndarray, kept_index: torch.Tensor) -> torch.Tensor:
    """`[n_kept, 4]` long: `(t, h, w)` of the kept rows + the text-after offset column.

    Args:
        grid: `[3, N]` positions of the full item (`grid_positions`).
        kept_index: `[n_kept]` original row of each output row (ascending).
    """
    full = torch.from_numpy(grid).T  # [N, 3]
    kept = full[kept_index.cpu().long()]
    after = torch.full((kept.shape[0], 1), int(grid.max()) + 1, dtype=torch.long)
    return torch.cat([kept, after], dim=1)


def prompt_positions(
    num_tokens: int, items: list[tuple[int, int, np.ndarray]]
) -> tuple[torch.Tensor, int]:
    """`([3, L] positions, delta)` of a prompt whose media items may be compressed.

    `items`: `(offset, placeholder count, [3, N] full grid positions)` sorted by offset. The
    placeholders get the first rows of the grid (the runner overwrites them with the kept
    rows' positions when the encoder runs); the text after an item starts at the item's start
    + `grid.max() + 1`, whatever was kept, so a prompt served from the prefix cache (encoder
    not run again) gets the same positions as a fresh one.
    """
    parts: list[np.ndarray] = []
    cursor, next_pos = 0, 0
    for offset, count, grid in items:
        text = offset - cursor
        parts.append(np.broadcast_to(np.arange(text), (3, text)) + next_pos)
        start = next_pos + text
        parts.append(grid[:, :count] + start)
        next_pos = start + int(grid.max()) + 1
        cursor = offset + count
    tail = num_tokens - cursor
    parts.append(np.broadcast_to(np.arange(tail), (3, tail)) + next_pos)
    positions = np.concatenate(parts, axis=1)
    delta = int(positions.max()) + 1 - num_tokens if positions.size else 0
    return torch.from_numpy(np.ascontiguousarray(positions)), delta


def exact_columns(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`[K, 2 m]` columns of `dtype` holding `[K, m]` integers in 0 .. BASE**2 - 1 exactly
    (each as its `BASE` pair); `media_rows` reads them back."""
    values = values.long()
    pairs = torch.stack([values // BASE, values % BASE], dim=2)
    return pairs.reshape(values.shape[0], -1).to(dtype)


class ColumnPositions:
    """Mixin of a model whose encoder hands each media row on with `craft_columns` extra
    columns (`exact_columns`: where the row goes), which vLLM's runner gives back to its
    pruning hook, `recompute_mrope_positions`: the columns are stripped and the positions
    written (`craft_write_positions`, the model's rule) into the media tokens the rows fill.
    Subclasses give the media token ids (`craft_media_ids`) and the rule."""

    craft_columns = 2

    def craft_media_ids(self) -> tuple[int, ...]:
        """The token ids of the placeholder slots the embeddings fill."""
        raise NotImplementedError

    def craft_write_positions(
        self, positions: torch.Tensor, values: torch.Tensor, where: torch.Tensor
    ) -> int:
        """Write into `positions` `[3, L]` the positions of the slots `where` `[n]` from
        their rows' columns `values` `[n, craft_columns // 2]`; -> the largest position + 1."""
        raise NotImplementedError

    def recompute_mrope_positions(
        self,
        input_ids: list[int] | torch.Tensor,
        multimodal_embeddings: Sequence[torch.Tensor],
        mrope_positions: torch.LongTensor,
        num_computed_tokens: int,
    ) -> tuple[Sequence[torch.Tensor], torch.Tensor, int]:
        """Strip the columns and write the positions of the media tokens these embeddings
        fill: the first `sum(rows)` media tokens from `num_computed_tokens` (the runner hands
        the items overlapping the scheduled chunk, in order)."""
        columns = self.craft_columns
        ids = torch.as_tensor(input_ids, device=mrope_positions.device).long()
        media = torch.isin(ids, ids.new_tensor(list(self.craft_media_ids())))
        media[:num_computed_tokens] = False
        embeds = [e[:, :-columns] for e in multimodal_embeddings]
        if multimodal_embeddings:
            cols = torch.cat([e[:, -columns:] for e in multimodal_embeddings]).round().long()
        else:
            cols = torch.zeros((0, columns), dtype=torch.long)
        values = (cols[:, 0::2] * BASE + cols[:, 1::2]).to(mrope_positions.device)
        where = media.nonzero(as_tuple=True)[0][: values.shape[0]]
        positions = mrope_positions.clone()
        end = self.craft_write_positions(positions, values, where)
        return embeds, positions, end - int(ids.numel())
