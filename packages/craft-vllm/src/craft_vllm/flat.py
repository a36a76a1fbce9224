"""1-D RoPE served with original positions: what LLaVA-OneVision and InternVL share.

Both language models use 1-D RoPE, and craft-adapters gives every kept row its ORIGINAL
position (its index in the uncompressed placeholder) and the text after a video the
positions it has uncompressed. vLLM lets a model set its own positions only through its
M-RoPE machinery, so these variants run on it:

- the config gets `mrope_section = [rotary_dim / 2, 0, 0]` (`update_model_config`, run by
  the plugin before the runner exists): M-RoPE whose first row drives every rotary
  dimension IS 1-D RoPE, rows 1 and 2 are never read;
- `get_mrope_input_positions` writes the prompt's positions: the text after a media item
  starts at the item's start + its UNCOMPRESSED length (`craft_full_length`); rows 1 and 2
  hold each placeholder's start;
- `embed_multimodal` appends each row's slot in the uncompressed placeholder to its
  embedding (two exact columns, `index // 256` and `index % 256`: exact in bfloat16 too),
  and `recompute_mrope_positions` writes `start + index` into row 0 of the media tokens
  (`craft_media_ids`) the runner scheduled (idempotent: the start is read from row 1).

A compressed video that arrives as a payload (`precompressed.py`) is read into a
`PayloadInput` (`payload_input`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from craft_vllm.payload import COORDS, COUNT, GRID
from craft_vllm.positions import ColumnPositions, exact_columns, prompt_positions


def update_model_config(model_config: Any) -> None:
    """Turn the served LLM's 1-D RoPE into M-RoPE read from row 0 only (same rotations)."""
    text = model_config.hf_config.get_text_config()
    rope = dict(getattr(text, "rope_parameters", None) or {})
    if "mrope_section" in rope:
        return
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    rotary = int(head * rope.get("partial_rotary_factor", 1.0))
    rope.setdefault("rope_type", "default")
    rope["mrope_section"] = [rotary // 2, 0, 0]
    text.rope_parameters = rope


def index_columns(index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`[K, 2]` (`index // BASE`, `index % BASE`) of `[K]` original row indices."""
    return exact_columns(index.long()[:, None], dtype)


@dataclass
class PayloadInput:
    """Compressed videos of one batch (`precompressed.py`): rows `[sum K, D]`, coords
    `[sum K, 3]`, counts `[V]`, grids `[V, 3]` (F, P, P)."""

    rows: torch.Tensor
    coords: torch.Tensor
    counts: list[int]
    grids: list[list[int]]

    def videos(self) -> list[tuple[torch.Tensor, torch.Tensor, list[int]]]:
        """Each video's `([K, D] rows, [K] original index t * P * P + h * P + w, (F, P, P))`."""
        out = []
        for rows, coords, grid in zip(
            self.rows.split(self.counts), self.coords.split(self.counts), self.grids
        ):
            _, h, w = grid
            out.append((rows, (coords[:, 0] * h + coords[:, 1]) * w + coords[:, 2], grid))
        return out


def _flat(value: Any) -> torch.Tensor:
    """A flat field as the runner hands it: one tensor, or one per video."""
    if isinstance(value, (list, tuple)):
        return torch.cat([torch.as_tensor(v) for v in value])
    return torch.as_tensor(value)


def payload_input(kwargs: Mapping[str, Any]) -> PayloadInput | None:
    """The compressed videos among a batch's multimodal kwargs, or None (raw videos)."""
    if kwargs.get(COUNT) is None:
        return None
    counts = [int(k) for k in _flat(kwargs[COUNT]).reshape(-1)]
    grids = _flat(kwargs[GRID]).reshape(-1, 3).tolist()
    rows, coords = _flat(kwargs["video_embeds"]), _flat(kwargs[COORDS]).long()
    return PayloadInput(rows.reshape(-1, rows.shape[-1]), coords.reshape(-1, 3), counts, grids)


def grid_tokens(feature: Any) -> int | None:
    """N = T * H * W of a compressed video's feature (its payload grid), else None."""
    if GRID not in feature.data:
        return None
    t, h, w = (int(x) for x in feature.data[GRID].data.tolist())
    return t * h * w


class FlatPositions(ColumnPositions):
    """Mixin of a 1-D RoPE CRAFT model (the module docstring). Subclasses give the media
    token ids (`craft_media_ids`) and each video's uncompressed length (`craft_full_length`);
    each row's 2 columns hold its original index in the video."""

    def craft_full_length(self, feature: Any) -> int:
        """The uncompressed placeholder length of one video feature."""
        raise NotImplementedError

    def get_mrope_input_positions(
        self, input_tokens: list[int], mm_features: list[Any]
    ) -> tuple[torch.Tensor, int]:
        """`[3, L]` positions: row 0 the 1-D positions (text after a video where it is
        uncompressed), rows 1 and 2 each placeholder's start (`recompute_mrope_positions`)."""
        items = []
        for f in sorted(mm_features, key=lambda f: f.mm_position.offset):
            count = f.mm_position.length
            full = self.craft_full_length(f) if f.modality == "video" else count
            line = np.broadcast_to(np.arange(full), (3, full)).copy()
            line[1:] = 0  # rows 1, 2: the start, on every placeholder
            items.append((f.mm_position.offset, count, line))
        return prompt_positions(len(input_tokens), items)

    def craft_write_positions(
        self, positions: torch.Tensor, values: torch.Tensor, where: torch.Tensor
    ) -> int:
        """Row 0 of each media token: its item's start (row 1) + its original index."""
        positions[0, where] = positions[1, where] + values[:, 0]
        return int(positions[0].max()) + 1
