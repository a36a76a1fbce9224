"""`VideoSession`: many questions about one video, which is compressed and prefilled once.

`CraftModel.encode_video` builds a session from a prompt that ends after the video; each
`ask` appends the question tokens to the compressed prefix and generates from a copy of the
prefix's KV cache, so the vision tower, the compressor and the prefix prefill run once per
video rather than once per question.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

from craft_adapters.splice import Prepared
from craft_core.checks import check_index_tensor

if TYPE_CHECKING:  # wrapper.py imports this module to build sessions
    from craft_adapters.wrapper import CraftModel

__all__ = ["VideoSession"]


class VideoSession:
    """A compressed, prefilled video prefix; `ask` answers questions about it.

    Each `ask` continues from a `copy.deepcopy` of the prefix cache, so questions do not see
    each other and the video prefix is never recomputed. (Qwen3.5's linear-attention states
    cannot be cropped back, hence a copy rather than a crop.)

    Attributes:
        report: the `CompressionReport` of the prefix.
        prefix_length: tokens of the compressed prefix in the cache.
    """

    def __init__(self, owner: CraftModel, inputs: dict[str, Any], prep: Prepared, cache: Any):
        self._owner = owner
        self._inputs = inputs
        self._prep = prep
        self._cache = cache
        self.report = prep.report
        self.prefix_length = int(prep.input_ids.shape[1])

    def _question_positions(self, q_ids: torch.Tensor) -> torch.Tensor:
        """Positions of the question tokens, as the full uncompressed prompt would give them."""
        adapter = self._owner.adapter
        inputs = self._inputs
        full = dict(inputs)
        full["input_ids"] = torch.cat([inputs["input_ids"], q_ids], dim=1)
        full["attention_mask"] = torch.cat(
            [inputs["attention_mask"], torch.ones_like(q_ids)], dim=1
        )
        if inputs.get("mm_token_type_ids") is not None:
            mm = inputs["mm_token_type_ids"]
            full["mm_token_type_ids"] = torch.cat([mm, mm.new_zeros(q_ids.shape)], dim=1)
        positions, _ = adapter.full_positions(full)
        return positions[..., -q_ids.shape[1] :]

    @torch.no_grad()
    def ask(self, question_inputs: Any, **generate_kwargs: Any) -> torch.Tensor:
        """Answer one question; returns only the NEW token ids, `[1, T]`.

        Args:
            question_inputs: the question's token ids that follow the video prefix (a
                `[1, q]` tensor, or a mapping with `input_ids`, e.g. a tokenizer output made
                with `add_special_tokens=False`), typically the rest of the user turn and the
                assistant prompt.
            generate_kwargs: passed to HF `generate` (`max_new_tokens=16`, `do_sample`, ...).
        """
        q_ids = question_inputs
        if not isinstance(q_ids, torch.Tensor):
            q_ids = question_inputs["input_ids"]
        q_ids = torch.as_tensor(q_ids)
        if q_ids.dim() == 1:
            q_ids = q_ids.unsqueeze(0)
        check_index_tensor("question input_ids", q_ids, dim=2)
        if q_ids.shape[0] != 1 or q_ids.shape[1] == 0:
            raise ValueError(f"question input_ids must be [1, q>0], got {tuple(q_ids.shape)}")
        owner, prep = self._owner, self._prep
        q_ids = q_ids.to(prep.input_ids.device)
        if bool((q_ids == owner.adapter.video_token_id).any()):
            raise ValueError("a question must not contain video placeholder tokens")
        q_pos = self._question_positions(q_ids)
        ids = torch.cat([prep.input_ids, q_ids], dim=1)
        pos = torch.cat([prep.position_ids, q_pos.to(prep.position_ids.device)], dim=-1)
        mask = torch.cat([prep.attention_mask, torch.ones_like(q_ids)], dim=1)
        extra = {
            k: torch.cat([v, v.new_zeros(q_ids.shape)], dim=1)
            for k, v in prep.extra.items()
            if k != "labels"
        }
        cache = copy.deepcopy(self._cache)
        with owner._mask_guard():
            out = owner.model.generate(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                past_key_values=cache,
                **extra,
                **generate_kwargs,
            )
        owner.last_compression = self.report
        seqs = out if isinstance(out, torch.Tensor) else out.sequences
        return seqs[:, ids.shape[1] :]
