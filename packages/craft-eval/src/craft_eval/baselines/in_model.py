"""FlashVID's and HoliTom's stage inside the language model, and the two-stage methods
`flashvid-llm` and `holitom-llm` (the stage before the language model, then this one).

Both keep, at decoder layer L, the video rows the LAST token of the prompt attends to most
in layer L - 1 (mean over heads); craft-adapters' `InModelDrop` runs the layer mechanics
(positions, masks, KV cache), `craft_eval.in_model.attach_in_model` puts it on a model for
a method built here. The rules, re-stated from the official code:

- FlashVID, github.com/Fanziyang-v/FlashVID @ 1d37422c5afcaa15ee46b5355f5ba798fa93290a,
  `flashvid/utils.py:fastv_prune` (called from `flashvid/modeling_qwen2.py`'s decoder loop
  at `pruning_layer = 20`, scores from layer 19): keep `ceil(n * llm_retention_ratio)`
  (0.3) rows by `attn_based_token_selection` (top-k of the score), unchanged. Qwen3-VL:
  the same call in `flashvid/modeling_qwen3_vl.py:Qwen3VLTextModel_forward`
  (@ 8b83706dc5c70d73581dad2da9871d8c28282dbc; the last query's softmax over the keys,
  scaled by `head_dim ** -0.5`), after the three deepstack levels (layers 0-2), which it
  therefore never selects; `InModelDrop` does select them for a layer before the last.
- HoliTom, github.com/cokeshao/HoliTom @ e9b2972f6895c9e7d7fe74eb8c3a2ecaab8056e0,
  `holitom/modeling_qwen2.py:Qwen2Model_holitom.forward` (`HOLITOM_k = 18`,
  `HOLITOM_r = 0.5` in the published scripts): keep `round(n * (1 - r))` rows by the score;
  every other row, in ascending order, is averaged into its most similar kept row
  (cosine of the hidden states entering layer L, computed before any merge):
  `h_t = (h_t + h_i) / 2`, one after the other.

These methods depend on the question (the last token), so a video compressed with them
cannot be stored once and served to many questions: craft-adapters refuses
`encode_video` / `compress_videos` while the stage is attached, naming the method.
Deviations (craft-eval's docs/baselines.md): ties go to the smaller position (the official `topk`
leaves them unspecified); one prompt per call; every video of a prompt is scored together;
the stage runs on every backbone craft-adapters supports (the papers: FlashVID on
LLaVA-OneVision, LLaVA-Video, Qwen2.5-VL, Qwen3-VL; HoliTom on LLaVA-OneVision /
LLaVA-Video), on Qwen3.5 only where layer L - 1 is a softmax-attention layer.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from craft_core import CompressionResult
from craft_eval.baselines._common import ATTENTION, COUNT, Baseline, check_settings
from craft_eval.baselines.flashvid import flashvid
from craft_eval.baselines.holitom import holitom
from craft_eval.methods.base import Method, Request
from craft_eval.methods.registry import register_method

#: `rule(hidden [n, D], score [n]) -> (kept positions [k] ascending, their rows or None)`
Rule = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]


def top_by_score(score: torch.Tensor, count: int) -> torch.Tensor:
    """The `count` highest scores' positions, ascending (ties: the smaller position)."""
    order = torch.sort(score, descending=True, stable=True).indices
    return torch.sort(order[: max(0, min(count, score.numel()))]).values


def flashvid_rule(retention: float = 0.3) -> Rule:
    """`fastv_prune`: the `ceil(n * retention)` best-scored rows, unchanged."""
    check_settings("flashvid-llm", llm_retention=(retention, "in (0, 1]"))

    def rule(hidden: torch.Tensor, score: torch.Tensor) -> tuple[torch.Tensor, None]:
        return top_by_score(score, math.ceil(hidden.shape[0] * retention)), None

    return rule


def holitom_rule(merged: float = 0.5) -> Rule:
    """HoliTom's layer-k merge: `round(n * (1 - merged))` best-scored rows kept; every other
    row (ascending) averaged into its most similar kept row, one after the other."""
    check_settings("holitom-llm", llm_merged=(merged, "in [0, 1)"))

    def rule(hidden: torch.Tensor, score: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]
        kept = top_by_score(score, round(n * (1 - merged)))
        is_kept = torch.zeros(n, dtype=torch.bool, device=hidden.device)
        is_kept[kept] = True
        others = torch.nonzero(~is_kept).squeeze(1)
        x = hidden.float()
        if kept.numel() == 0 or others.numel() == 0:
            return kept, hidden[kept]
        owner = (F.normalize(x[others], dim=-1) @ F.normalize(x[kept], dim=-1).T).argmax(-1)
        return kept, _halving_merge(x, kept, others, owner).to(hidden.dtype)

    return rule


def _halving_merge(
    x: torch.Tensor, kept: torch.Tensor, others: torch.Tensor, owner: torch.Tensor
) -> torch.Tensor:
    """`[k, D]`: kept row t after `h_t = (h_t + h_i) / 2` for its members i in ascending
    order: `h_t / 2^m + sum_j h_(i_j) / 2^(m - j + 1)` (m members, j = 1..m)."""
    members = torch.bincount(owner, minlength=kept.numel())
    rank = torch.zeros_like(owner)
    for t in torch.nonzero(members).squeeze(1).tolist():
        at = torch.nonzero(owner == t).squeeze(1)
        rank[at] = torch.arange(1, at.numel() + 1, device=x.device)
    weight = torch.pow(0.5, (members[owner] - rank + 1).double()).to(x.dtype)
    rows = x[kept] * torch.pow(0.5, members.double()).to(x.dtype)[:, None]
    return rows.index_add(0, owner, x[others] * weight[:, None])


@dataclass(frozen=True)
class InModelStage:
    """What a two-stage method does inside the language model: at decoder layer `layer`,
    `rule` (a craft-adapters `KeepRule`) on the video rows. `name`: the method's."""

    name: str
    layer: int
    rule: Rule


class TwoStage(Method):
    """A stage before the language model (a `Baseline`) plus `in_model_stage`.

    As a `craft_core.TokenCompressor` it is the first stage (the budget: the rows that
    reach the language model); `craft_eval.in_model.attach_in_model` adds the second to a
    model. `query_dependent`: the second stage reads the question.
    """

    needs_attention = True
    query_dependent = True

    def __init__(self, name: str, before: Baseline, stage: InModelStage) -> None:
        self.name, self.before, self.in_model_stage = name, before, stage

    def compress(self, request: Request, **settings: Any) -> CompressionResult:
        result = self.before.compress(request, **settings)
        stage = self.in_model_stage
        result.info["method"] = self.name
        result.info["in_model"] = {"layer": stage.layer, "query_dependent": True}
        return result


def _register(name: str, before: Baseline, make_rule: Callable[[float], Rule], spec: tuple) -> None:
    """Register `name`: `before`'s options plus `layer` and the rule's share option
    `spec = (option, default layer, default share, description)`."""
    share, default_layer, default_share, description = spec
    params = inspect.signature(before.core).parameters.values()
    first = tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY)

    def factory(**given: Any) -> TwoStage:
        layer = given.get("layer", default_layer)
        check_settings(name, layer=(layer, COUNT))
        stage = InModelStage(name, layer, make_rule(given.get(share, default_share)))
        return TwoStage(name, before.bind(**{k: given[k] for k in first if k in given}), stage)

    factory.__module__, factory.__qualname__ = __name__, f"factory[{name}]"
    register_method(
        name,
        kind="merge",
        needs=("attention",),
        description=description,
        saliency=ATTENTION,
        options=(*first, "layer", share),
    )(factory)


_register(
    "flashvid-llm",
    flashvid,
    flashvid_rule,
    (
        "llm_retention",
        20,
        0.3,
        "FlashVID, both stages: `flashvid` before the LM, then the "
        "ceil(30%) video rows the last token attends to most from layer 20 (query-dependent).",
    ),
)
_register(
    "holitom-llm",
    holitom,
    holitom_rule,
    (
        "llm_merged",
        18,
        0.5,
        "HoliTom, both stages: `holitom` before the LM, then at layer 18 "
        "half the video rows merged into the ones the last token attends to most "
        "(query-dependent).",
    ),
)
