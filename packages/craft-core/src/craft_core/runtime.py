"""How a compressor runs, chosen when it is built, loaded or reconfigured; never saved.

    compressor = CraftCompressor(config, precision="fast")             # at build time
    compressor = CraftCompressor.from_pretrained(path, compile=True)   # at load time
    compressor.configure(precision="exact")                            # later, in place

`CraftConfig` holds what defines the function (widths, rank, temperatures, seed, weighting);
`RunOptions` holds how it is computed, as transformers' `attn_implementation` does. None of
these changes the selected tokens' rule; `precision` decides whether the rows are the same
bits on every CPU instruction path (`exact`) or only within float32 rounding (`fast`).
Checkpoints written before 1.0 carry `compile`, `pairing`, `selection` and `sim_block` in
`config.json`: `from_pretrained` drops them with a warning (`LEGACY_FIELDS`); `selection`
(removed in 1.0) and `pairing` (removed in 1.1: one eager runner) are no run options any
more, and naming one is an error that says so.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from craft_core.config import LEGACY_FIELDS, StrictInt

Precision = Literal["exact", "fast"]


class LegacyConfigWarning(UserWarning):
    """A checkpoint's `config.json` holds run options (`LEGACY_FIELDS`), which are ignored."""


class RunOptions(BaseModel):
    """How `CraftCompressor` computes (same tokens' rule for every value; see each field)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    precision: Precision = Field(
        default="exact",
        description="The merge's arithmetic. 'exact': float64, rounded once to the rows' "
        "dtype: the same rows and tokens on every CPU instruction path (AVX-512 / AVX2 / "
        "generic) and CPU == eager CUDA. 'fast': float32: rows within float32 rounding of "
        "'exact', their last bits (and, rarely, the tokens of later rounds) machine-dependent.",
    )
    compile: bool = Field(
        default=False,
        strict=True,
        description="Run each round as one compiled graph (torch.compile, power-of-two size "
        "buckets), replayed as a CUDA graph on CUDA. Refused on a CPU, where it is slower "
        "than eager (README), unless allow_cpu=True. Without autograd only (training runs "
        "eager).",
    )
    cuda_graphs: bool = Field(
        default=False,
        strict=True,
        description="Run each round as the fixed-shape padded round, captured as a CUDA "
        "graph from its own kernels (no Inductor: a capture costs milliseconds) and "
        "replayed: one launch a round. CUDA only (unless allow_cpu=True), without autograd. "
        "compile=True does the same with the round fused by Inductor first (a cold compile "
        "per size bucket).",
    )
    allow_cpu: bool = Field(
        default=False,
        strict=True,
        description="Let compile=True / cuda_graphs=True run on a CPU. Refused by default: a "
        "CPU has no CUDA graphs, so the padded rounds run op by op there (compiled or not), "
        "3-4x slower than the eager loop (README, measured); a CPU call with either option "
        "raises instead of silently taking the slow path. Set it to run or time the padded "
        "loop where there is no GPU (its tests and benchmarks do): the same tokens and rows "
        "as on CUDA. Needs compile=True or cuda_graphs=True.",
    )
    sim_block: StrictInt = Field(
        default=2048,
        gt=0,
        description="Rows per block of the similarity passes: bounds their extra memory to "
        "about sim_block x N float64 values per video of a call. A memory knob only.",
    )
    threads: StrictInt | None = Field(
        default=1,
        ge=1,
        description="Intra-op threads of a call on a CPU: torch.set_num_threads(threads) for "
        "the call, the caller's setting restored after (it is process-wide meanwhile). The "
        "loop is hundreds of small ops a round, and with 2+ threads each op waits at an "
        "OpenMP barrier for a thread that a busy machine may not schedule (README: "
        "measured). None: torch's setting as it is.",
    )

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "selection" in data:
            raise ValueError(
                "selection was removed in craft-core 1.0 ('exact' and 'recheck' gave the "
                "certified values and never ran faster where they run): drop the argument"
            )
        if isinstance(data, dict) and "pairing" in data:
            raise ValueError(
                "pairing was removed in craft-core 1.1: every eager call runs the batched "
                "round (exact incremental pairing, one host sync a round), and "
                "compile / cuda_graphs their own fixed-shape pairing: drop the argument"
            )
        return data

    @model_validator(mode="after")
    def _check(self) -> RunOptions:
        if self.compile and self.cuda_graphs:
            raise ValueError(
                "compile=True already replays its rounds as CUDA graphs; cuda_graphs=True is "
                "the same loop without Inductor: choose one of them"
            )
        if self.allow_cpu and not self.padded():
            raise ValueError(
                "allow_cpu=True lets compile=True or cuda_graphs=True run on a CPU; without "
                "either it changes nothing: drop it (or set allow_cpu=False with them)"
            )
        return self

    def padded(self) -> bool:
        """Whether calls without autograd run the padded round (`compiled.py`)."""
        return self.compile or self.cuda_graphs

    @contextlib.contextmanager
    def cpu_threads(self, device: torch.device) -> Iterator[None]:
        """`threads` intra-op threads while the block runs on a CPU, then the caller's."""
        if self.threads is None or device.type != "cpu":
            yield
            return
        saved = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(saved)

    def merge_dtype(self) -> torch.dtype:
        """The dtype of the merge's arithmetic: float64 (`exact`) or float32 (`fast`)."""
        return torch.float64 if self.precision == "exact" else torch.float32


def split_legacy(data: dict[str, Any], source: object) -> dict[str, Any]:
    """`data` (a `config.json`'s fields) without `LEGACY_FIELDS`, with one warning naming
    those it dropped and how to choose them now."""
    dropped = {k: data[k] for k in LEGACY_FIELDS if k in data}
    if not dropped:
        return data
    spelled = ", ".join(f"{k}={v!r}" for k, v in dropped.items())
    warnings.warn(
        f"{source} was written before craft-core 1.0: its config holds run options "
        f"({spelled}), which are no longer part of a checkpoint and are ignored; choose them "
        "when loading, e.g. CraftCompressor.from_pretrained(path, compile=True)",
        LegacyConfigWarning,
        stacklevel=3,
    )
    return {k: v for k, v in data.items() if k not in dropped}
