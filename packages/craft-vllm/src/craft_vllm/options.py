"""The CRAFT settings of a served model, read from its (overridden) Hugging Face config.

A user turns CRAFT on with vLLM's own `--hf-overrides` (or `LLM(hf_overrides=...)`):

    {"architectures": ["CraftQwen2_5_VLForConditionalGeneration"],
     "craft_checkpoint": "/path/to/craft", "craft_ratio": 8}

so the API server (which counts placeholder tokens) and the engine (which compresses) read
the same values from the same config. Everything is checked here, before a request is served.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from craft_core import TokenBudget

KEYS = ("craft_checkpoint", "craft_ratio")
RUN_KEYS = {"craft_compile": "compile", "craft_cuda_graphs": "cuda_graphs"}
"""Run options of the server (not of the checkpoint), each craft-core's `RunOptions` field of
that name: `craft_compile` true runs craft-core's compiled loop (Inductor, replayed as one CUDA
graph a round), `craft_cuda_graphs` true its padded rounds captured as CUDA graphs without
Inductor. CUDA only, one of the two."""
OPTIONAL_KEYS = tuple(RUN_KEYS)
REFUSED = {
    "craft_threshold": "the threshold mode is refused: vLLM reserves each video's token count "
    "when it preprocesses the prompt, before the compressor runs, and a threshold makes that "
    "count depend on the video's content; use craft_ratio, and send threshold-mode videos "
    "compressed beforehand (craft_adapters' compress_videos + craft_vllm.precompressed."
    "video_payload, with enable_mm_embeds)",
    "craft_min_tokens": "craft_min_tokens belongs to the threshold mode, which vLLM cannot "
    "run in the server; use craft_ratio alone (threshold-mode videos: compressed beforehand)",
}


class CraftConfigError(ValueError):
    """A CRAFT setting that cannot be served (the message names the key and what is allowed)."""


@dataclass(frozen=True)
class CraftOptions:
    """What the CRAFT variant of a model does.

    Attributes:
        checkpoint: a folder written by `CraftCompressor.save_pretrained` (craft-train's output).
        budget: craft-core's fixed-ratio budget (`ratio` >= 1), checked once here and
            handed to the compressor as it is: a video of N tokens keeps exactly
            `floor(N / ratio)` (`kept`).
        run: craft-core's run options the server asked for (`RUN_KEYS`: `{"compile": True}`
            from `craft_compile`, `{"cuda_graphs": True}` from `craft_cuda_graphs`); CUDA only.
    """

    checkpoint: Path
    budget: TokenBudget
    run: dict[str, bool] = field(default_factory=dict)

    @property
    def compile(self) -> bool:
        """`craft_compile` was asked for."""
        return bool(self.run.get("compile"))

    @property
    def ratio(self) -> float:
        assert self.budget.ratio is not None  # read_options builds ratio budgets only
        return self.budget.ratio

    def kept(self, num_tokens: int) -> int:
        """Tokens a video of `num_tokens` keeps: craft-core's count, `floor(N / ratio)`.

        craft-core's compressor clamps that floor to 1; a server refuses instead (a video
        shorter than the ratio would silently be compressed less than asked).
        """
        try:
            return self.budget.resolve(num_tokens, clamp=False).floor
        except ValueError as error:
            raise CraftConfigError(f"craft_{error}") from None


def _get(hf_config: Any, key: str) -> Any:
    return getattr(hf_config, key, None)


def read_options(hf_config: Any, architecture: str) -> CraftOptions:
    """The checked CRAFT options of `hf_config`; raise `CraftConfigError` naming the bad key."""
    for key, why in REFUSED.items():
        if _get(hf_config, key) is not None:
            raise CraftConfigError(f"{key}: {why}")
    missing = [k for k in KEYS if _get(hf_config, k) is None]
    if missing:
        raise CraftConfigError(
            f"{architecture} needs {' and '.join(missing)} in --hf-overrides, e.g. "
            '\'{"architectures": ["' + architecture + '"], "craft_checkpoint": "/path/to/craft", '
            '"craft_ratio": 8}\''
        )
    ratio = _get(hf_config, "craft_ratio")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
        raise CraftConfigError(f"craft_ratio must be a number >= 1, got {ratio!r}")
    try:  # craft-core's budget checks the range (one rule for every package)
        budget = TokenBudget(ratio=ratio)
    except ValueError as error:
        raise CraftConfigError(f"craft_{error}") from None
    folder = Path(str(_get(hf_config, "craft_checkpoint"))).expanduser()
    if not folder.is_dir():
        raise CraftConfigError(
            f"craft_checkpoint: folder {folder} does not exist (give the folder that "
            "CraftCompressor.save_pretrained / craft-train wrote: config.json + model.safetensors)"
        )
    return CraftOptions(checkpoint=folder, budget=budget, run=_run_options(hf_config))


def _run_options(hf_config: Any) -> dict[str, bool]:
    """The `RUN_KEYS` set to true, as craft-core's `RunOptions` fields (checked by it: one
    rule for every package, e.g. not both)."""
    from pydantic import ValidationError

    from craft_core.runtime import RunOptions

    run = {}
    for key, name in RUN_KEYS.items():
        value = _get(hf_config, key)
        if value is not None and not isinstance(value, bool):
            raise CraftConfigError(f"{key} must be true or false, got {value!r}")
        if value:
            run[name] = True
    try:
        RunOptions(**run)
    except ValidationError as error:
        keys = " and ".join(k for k, name in RUN_KEYS.items() if name in run)
        why = error.errors()[0]["msg"].removeprefix("Value error, ")
        raise CraftConfigError(f"{keys}: {why}") from None
    return run


def load_compressor(options: CraftOptions, hidden_size: int, device: Any) -> Any:
    """The `CraftCompressor` of `options.checkpoint`, checked against the LLM width, run
    with the run options the server asked for (`craft_compile`, `craft_cuda_graphs`: CUDA only)."""
    import torch

    from craft_core import CraftCompressor

    asked = [k for k, name in RUN_KEYS.items() if name in options.run]
    if asked and torch.device(device).type != "cuda":
        raise CraftConfigError(
            f"{asked[0]}: craft-core's padded CUDA-graph loop runs on CUDA only (on a CPU it "
            f"is slower than eager), but this server runs on {device}; leave {asked[0]} out"
        )
    run: dict[str, Any] = dict(options.run)
    try:
        compressor = CraftCompressor.from_pretrained(options.checkpoint, device=device, **run)
    except (FileNotFoundError, ValueError) as error:
        raise CraftConfigError(f"craft_checkpoint: {error}") from None
    width = compressor.config.hidden_size
    if width != hidden_size:
        raise CraftConfigError(
            f"craft_checkpoint: {options.checkpoint} was trained for hidden size {width}, but the "
            f"served model's language model has hidden size {hidden_size}; use a CRAFT checkpoint "
            "trained for this backbone"
        )
    return compressor.eval()
