"""CraftConfig: every hyper-parameter of the CRAFT compressor, with the paper's defaults.

The config is a frozen pydantic model so that a checkpoint's `config.json` round-trips exactly
and a bad value is rejected with the field's name before any tensor is touched. Integer fields
are strict (a bool, a float or a string such as "8" is refused: `hidden_size=True` must not
become 1); float fields take ints and numeric strings (YAML reads `1e-6` as a string), never a
bool, NaN or inf.
"""

from __future__ import annotations

import numbers
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)


def _whole(value: Any) -> Any:
    # pydantic's lax int takes True, "8" and 8.0; its strict int refuses NumPy integers. A
    # Python or NumPy integer is an int here, nothing else is.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"must be an int, got {type(value).__name__} {value!r}")
    return int(value)


StrictInt = Annotated[int, BeforeValidator(_whole)]

LEGACY_FIELDS = ("compile", "pairing", "selection", "sim_block")
"""Fields of 0.2-0.6 that are run options since 1.0 (`runtime.RunOptions`), or, for
`selection` (its `exact` and `recheck` checks never ran faster) and `pairing` (one eager
runner since 1.1), removed."""


class CraftConfig(BaseModel):
    """Hyper-parameters of `CraftCompressor` (see `docs/algorithm.md`).

    Only `hidden_size` has no default: it is the width `D` of the language model's embedding
    space, which the vision projector already maps the video tokens into. How the loop runs
    (precision, compile, pairing, block size) is not here: see `runtime.RunOptions`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    hidden_size: StrictInt = Field(
        gt=0, description="D: width of the video tokens (the language model's hidden size)."
    )
    sim_dim: StrictInt = Field(
        default=128,
        gt=0,
        le=512,
        description="d_sim: width of the fixed random projection used for selection similarity "
        "(at most 512, so that similarities are computed exactly in float64).",
    )
    rank: StrictInt = Field(
        default=128,
        gt=0,
        description="r: width of the query/key projections W_q, W_k of the position-aware "
        "weighting. Must be even (RoPE rotates pairs).",
    )
    gate_hidden: StrictInt = Field(
        default=512, gt=0, description="d_h: hidden width of the per-channel gate MLP."
    )
    round_embed_dim: StrictInt = Field(
        default=256,
        gt=0,
        description="d_phi: width of the sine-cosine encoding phi(m) of the merge round m. Even.",
    )
    temperature: float = Field(
        default=0.1,
        gt=0.0,
        description="tau: softmax temperature of the source weights. Decided here (the paper "
        "gives no value): both terms of the logit, Q.K and s_ti, lie in [-1, 1], so 0.1 lets "
        "the learned scorer move a weight by about e^20 while an untrained scorer stays mild.",
    )
    seed: StrictInt = Field(
        default=0,
        ge=0,
        description="Seed of the CPU generator that draws W_rand; same seed and hidden_size give "
        "the same matrix on every machine.",
    )
    weighting: Literal["position", "uniform"] = Field(
        default="position",
        description="Source weights w_i: 'position' = softmax of RoPE3d(Q).RoPE3d(K) + s_ti over "
        "the target's sources; 'uniform' = 1/|S|.",
    )
    reduce: Literal["gate", "mean", "target"] = Field(
        default="gate",
        description="How sources are fused into the target: 'gate' = learned per-channel gate; "
        "'mean' = G = 1 (weighted mean of the sources); 'target' = G = 0 (pruning).",
    )
    rope_theta: float = Field(
        default=10000.0, gt=0.0, description="Base of the 3D rotary frequencies."
    )
    rope_sections: tuple[StrictInt, StrictInt, StrictInt] = Field(
        default=(16, 24, 24),
        description="Rotary pairs given to t, h and w, in that order; must sum to rank / 2.",
    )
    layer_norm_eps: float = Field(
        default=1e-6, gt=0.0, description="Epsilon of the affine-free LayerNorm inside the gate."
    )

    @model_validator(mode="before")
    @classmethod
    def _no_run_options(cls, data: Any) -> Any:
        # 0.2-0.6 kept how the loop runs in the config; since 1.0 it is chosen at build or
        # load time (`runtime.RunOptions`), and `from_pretrained` drops it from old files.
        if isinstance(data, dict):
            if "selection" in data:
                raise ValueError(
                    "selection is not a CraftConfig field since craft-core 1.0: it was "
                    "removed (selection is always the certified exact one); drop it"
                )
            if "pairing" in data:
                raise ValueError(
                    "pairing is not a CraftConfig field since craft-core 1.0, nor a run "
                    "option since 1.1 (every eager call runs the one batched round): drop it"
                )
            moved = [k for k in LEGACY_FIELDS if k in data]
            if moved:
                raise ValueError(
                    f"{moved[0]} is not a CraftConfig field since craft-core 1.0: it is a run "
                    f"option, chosen when building or loading, e.g. "
                    f"CraftCompressor(config, {moved[0]}=...) or "
                    f"CraftCompressor.from_pretrained(path, {moved[0]}=...)"
                )
        return data

    @field_validator("temperature", "rope_theta", "layer_norm_eps", mode="before")
    @classmethod
    def _no_bool(cls, value: Any) -> Any:
        # pydantic's float accepts True as 1.0: a flag where a number belongs is an error.
        if isinstance(value, bool):
            raise ValueError(f"must be a number, not the bool {value}")
        return value

    @model_validator(mode="after")
    def _check_shapes(self) -> CraftConfig:
        if self.rank % 2:
            raise ValueError(f"rank must be even (RoPE rotates pairs), got {self.rank}")
        if self.round_embed_dim % 2:
            raise ValueError(f"round_embed_dim must be even, got {self.round_embed_dim}")
        if any(s < 0 for s in self.rope_sections):
            raise ValueError(f"rope_sections must be non-negative, got {self.rope_sections}")
        if sum(self.rope_sections) != self.rank // 2:
            raise ValueError(
                f"rope_sections {self.rope_sections} must sum to rank / 2 = {self.rank // 2}"
            )
        return self
