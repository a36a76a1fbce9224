"""Training configuration: pydantic models loaded from YAML, overridable from the command line.

    cfg = load_config("qwen3_5_4b_stage1.yaml", overrides=["optim.lr=1e-3"], stage=1)
    check_paths(cfg)        # files that must exist, each error naming its field

Every model forbids unknown keys, so a misspelt field is an error that names it. Loading a
config touches no model, video or GPU: the CLI validates everything first, then loads.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from craft_core import TokenBudget

__all__ = [
    "BudgetConfig",
    "ConfigError",
    "DataConfig",
    "DataFile",
    "DistillConfig",
    "LoraConfig",
    "MixtureConfig",
    "ModelConfig",
    "OptimConfig",
    "SourceSpec",
    "TrainConfig",
    "TrainingConfig",
    "apply_overrides",
    "check_paths",
    "load_config",
]


class ConfigError(ValueError):
    """A config that cannot be used; the message names the offending field (`a.b.c`)."""


class _Strict(BaseModel):
    # allow_inf_nan=False: `optim.lr=.inf` (or nan) is refused at load time, naming the field
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: Any) -> Any:
        """Strict where lax coercion changes meaning: `true` is not 1 (`optim.epochs: true`,
        `data.max_frames: yes` in YAML 1.1). Text and int for a float stay accepted (YAML
        reads `1e-3` as text; documented in the README)."""
        if _has_bool(value) and not _takes_bool(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"{value!r} holds a boolean; this field takes no true/false")
        return value


def _has_bool(value: Any) -> bool:
    """A bool, or a list / tuple / mapping holding one (`budget.ratios=[true, 8]`)."""
    if isinstance(value, bool):
        return True
    if isinstance(value, list | tuple):
        return any(_has_bool(v) for v in value)
    if isinstance(value, dict):
        return any(_has_bool(v) for v in value.values())
    return False


def _takes_bool(annotation: Any) -> bool:
    """True when a field of this type may hold a bool (bool, Any, a union or Literal of one)."""
    from typing import get_args

    if annotation is bool or annotation is Any:
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True  # a nested section checks its own fields
    return any(a is bool or a is True or a is False or _takes_bool(a) for a in get_args(annotation))


class LoraConfig(_Strict):
    """CRAFT+: LoRA on the language model's attention projections (paper: r 32, alpha 64)."""

    enabled: bool = Field(default=False, description="Train LoRA adapters too (CRAFT+).")
    rank: int = Field(default=32, gt=0, description="LoRA rank r.")
    alpha: int = Field(default=64, gt=0, description="LoRA alpha (scale alpha / r).")
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="LoRA dropout.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="Projection names inside the LANGUAGE MODEL's attention (the vision tower "
        "is never adapted, even where it uses the same names).",
    )
    lr: float = Field(default=1e-4, gt=0, description="Learning rate of the LoRA parameters.")
    init_from: str | None = Field(
        default=None,
        description="Folder of a saved adapter (a run's `lora/`) to start from; stage 2 takes "
        "the stage-1 run's adapter by default when model.init_from is set.",
    )


class ModelConfig(_Strict):
    """The frozen backbone and the trained merge module."""

    backbone: str = Field(
        min_length=1,
        description="Hugging Face id or local folder of the VLM (Qwen3.5, Qwen2.5-VL, "
        "Qwen3-VL, LLaVA-OneVision).",
    )
    processor: str | None = Field(
        default=None, description="Id or folder of the processor; default: the backbone's."
    )
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="dtype the frozen backbone is loaded in."
    )
    attn_implementation: str | None = Field(
        default="sdpa", description="transformers attention implementation of the backbone."
    )
    craft: dict[str, Any] = Field(
        default_factory=dict,
        description="CraftConfig fields other than hidden_size (read from the backbone), "
        "for a merge module built from scratch.",
    )
    init_from: str | None = Field(
        default=None,
        description="A previous run's output folder, one of its checkpoint folders, or a "
        "`craft/` folder: the merge module starts from it (stage 2 inherits stage 1). "
        "None: from scratch (gate zero-initialised, adaLN-Zero).",
    )
    lora: LoraConfig = Field(default_factory=LoraConfig)

    @field_validator("craft")
    @classmethod
    def _craft_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        from craft_core import CraftConfig

        if "hidden_size" in value:
            raise ValueError("hidden_size is read from the backbone; leave it out")
        try:
            CraftConfig(hidden_size=64, **value)
        except ValidationError as err:
            raise ValueError(_first_error(err)) from None
        return value


class SourceSpec(_Strict):
    """How many rows of one source enter the mixture."""

    cap: int | None = Field(
        default=None,
        gt=0,
        description="At most this many rows (a seeded random subset); None: mixture default_cap.",
    )
    target: int | None = Field(
        default=None,
        gt=0,
        description="Exactly this many rows: a seeded subset if the source is larger, seeded "
        "resampling with replacement (every row at least floor(target / n) times) if smaller. "
        "Excludes cap.",
    )

    @model_validator(mode="after")
    def _one_of(self) -> SourceSpec:
        if self.cap is not None and self.target is not None:
            raise ValueError("give cap or target, not both")
        return self


SAMPLING = re.compile(r"^(all|(first|end|random):(\d+|\d+(\.\d+)?%))$")


class DataFile(_Strict):
    """One data file of a mixture, as LLaVA-OneVision's data YAML writes it."""

    json_path: str = Field(
        min_length=1,
        description="The file (JSON array or JSONL); relative to the mixture's `root`.",
    )
    format: Literal["auto", "llava", "sharegpt", "caption", "craft"] = Field(
        default="auto",
        description="Row format (craft_adapters.data_files); auto: told from the first row's keys.",
    )
    sampling_strategy: str = Field(
        default="all",
        description="all | first:N | first:P% | end:N | end:P% | random:N | random:P%, over "
        "the file's rows as LLaVA-OneVision counts them (random: a subset seeded by `seed` "
        "and the rows' content, kept in file order; a picked row that cannot be used is left "
        "out and listed, not replaced).",
    )
    seed: int | None = Field(
        default=None, ge=0, description="Seed of `random:` (default: the mixture's seed)."
    )
    columns: dict[str, str] | None = Field(
        default=None,
        description="format sharegpt: LLaMA-Factory dataset_info.json `columns` (messages, "
        "system, videos, images, tools); the others keep LLaMA-Factory's defaults.",
    )
    tags: dict[str, str] | None = Field(
        default=None,
        description="format sharegpt: LLaMA-Factory dataset_info.json `tags` (role_tag, "
        "content_tag, user_tag, assistant_tag, system_tag, observation_tag, function_tag).",
    )
    source: str | None = Field(
        default=None,
        min_length=1,
        description="Source name of every row (per-source caps); default: the row's "
        "`data_source`, else the file name without suffix.",
    )
    video_root: str | None = Field(
        default=None, description="Folder relative video paths start in (default: the file's)."
    )
    video_fps: float | None = Field(
        default=None, gt=0, description="Frames per second of the videos given as frame folders."
    )
    duration: Literal["short", "medium", "long"] | None = Field(
        default=None, description="Duration bucket of the file's videos (`duration_mix`)."
    )

    @field_validator("sampling_strategy")
    @classmethod
    def _strategy(cls, value: str) -> str:
        value = value.strip()
        if not SAMPLING.match(value):
            raise ValueError(f"{value!r} is not all, first:N, end:N or random:N (N a count or P%)")
        if value.endswith("%") and not 0 < float(value.split(":")[1][:-1]) <= 100:
            raise ValueError(f"{value!r}: a percentage lies in (0, 100]")
        if value != "all" and not value.endswith("%") and int(value.split(":")[1]) == 0:
            raise ValueError(f"{value!r} takes no row; leave the entry out to skip the file")
        return value

    @field_validator("columns", "tags")
    @classmethod
    def _mapping(cls, value: dict[str, str] | None, info: ValidationInfo) -> dict[str, str] | None:
        from craft_adapters.data_files import COLUMNS, TAGS

        known = COLUMNS if info.field_name == "columns" else TAGS
        unknown = sorted(set(value or ()) - set(known))
        if unknown:
            raise ValueError(f"unknown {unknown}; LLaMA-Factory's names: {', '.join(known)}")
        return value

    @model_validator(mode="after")
    def _sharegpt_only(self) -> DataFile:
        if (self.columns or self.tags) and self.format != "sharegpt":
            raise ValueError("columns / tags (LLaMA-Factory's mapping) need format: sharegpt")
        return self


class MixtureConfig(_Strict):
    """Data files and how much of each enters (`datasets`), per-source caps (the paper caps
    every source at 30K rows) and resampling, and an optional duration mix."""

    root: str | None = Field(
        default=None,
        description="Folder relative `datasets` paths start in (`$VAR` expanded); default: "
        "the mixture file's folder (inline: the working directory).",
    )
    datasets: list[DataFile] = Field(
        default_factory=list, description="Data files read in addition to data.manifests."
    )
    duration_mix: dict[Literal["short", "medium", "long"], float] | None = Field(
        default=None,
        description="Shares of the duration buckets after the caps (e.g. long 0.33, medium "
        "0.35, short 0.31): each bucket is resampled to its share of the mixture's size; every "
        "dataset must then give `duration`.",
    )

    default_cap: int | None = Field(
        default=30000, gt=0, description="Cap of every source not listed in `sources`."
    )
    sources: dict[str, SourceSpec] = Field(
        default_factory=dict, description="Per-source cap or target, by source name."
    )
    seed: int | None = Field(
        default=None, ge=0, description="Seed of the subsampling; None: optim.seed."
    )

    @model_validator(mode="after")
    def _durations(self) -> MixtureConfig:
        if self.duration_mix is None:
            return self
        shares = self.duration_mix
        if (
            not shares
            or any(v <= 0 for v in shares.values())
            or abs(sum(shares.values()) - 1) > 0.02
        ):
            raise ValueError(f"duration_mix: positive shares summing to 1, got {shares}")
        missing = [d.json_path for d in self.datasets if d.duration not in shares]
        if missing or not self.datasets:
            raise ValueError(
                f"duration_mix: every dataset needs a `duration` among {sorted(shares)}; "
                f"missing in {missing or 'datasets (empty)'}"
            )
        return self

    def dataset_path(self, entry: DataFile) -> Path:
        """`entry.json_path`, relative ones under `root` (`$VAR` / `~` expanded)."""
        from craft_adapters.data_files import dataset_path

        return dataset_path(self.root, entry.json_path)


class DataConfig(_Strict):
    """Manifests, mixture, video decoding and prompts."""

    manifests: list[str] = Field(
        default_factory=list,
        description="Data files read whole: craft-train JSONL manifests ({video, caption, "
        "source} / {video, question, answer, source}) or any format of craft_adapters.data_files "
        "(detected). Relative video paths are resolved against video_root, else the file's "
        "folder. More files, with sampling: `mixture.datasets`.",
    )
    video_root: str | None = Field(default=None, description="Folder relative paths start in.")
    mixture: MixtureConfig | str = Field(
        default_factory=MixtureConfig,
        description="The mixture inline, or the path of a YAML file holding one.",
    )
    fps: float = Field(default=2.0, gt=0, description="Frames sampled per second of video.")
    max_frames: int = Field(default=768, ge=2, description="At most this many frames a video.")
    max_pixels: int | None = Field(
        default=None, gt=0, description="Pixel budget of one frame (None: the processor's)."
    )
    max_seq_len: int = Field(
        default=32768,
        gt=0,
        description="Longest UNCOMPRESSED sequence; a longer example is re-read with "
        "proportionally fewer frames.",
    )
    caption_prompt: str = Field(
        default="Describe this video in detail.",
        min_length=1,
        description="User prompt of the stage-1 (caption) examples; a row may give its own "
        "`prompt`.",
    )
    num_workers: int = Field(default=2, ge=0, description="DataLoader worker processes.")
    max_consecutive_failures: int = Field(
        default=32,
        gt=0,
        description="A video that fails to decode is skipped (and counted); this many "
        "failures IN A ROW stop the run instead (a wrong video_root, a lost mount).",
    )


class BudgetConfig(_Strict):
    """The compression budget drawn at every optimizer step (paper, Appendix B)."""

    p_threshold: float = Field(
        default=0.5, ge=0.0, le=1.0, description="Probability of the threshold mode."
    )
    thresholds: list[float] = Field(
        default_factory=lambda: [0.75, 0.8, 0.85, 0.9, 0.95],
        min_length=1,
        description="Similarity thresholds drawn in the threshold mode.",
    )
    ratios: list[float] = Field(
        default_factory=lambda: [2.0, 4.0, 8.0, 16.0, 32.0],
        min_length=1,
        description="Compression ratios drawn in the fixed-ratio mode.",
    )
    min_tokens: int | None = Field(
        default=None, gt=0, description="Floor of the threshold mode (None: N // 128)."
    )

    _ratio_budgets: list[TokenBudget] = PrivateAttr(default_factory=list)
    _threshold_budgets: list[TokenBudget] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _budgets(self) -> BudgetConfig:
        # Each listed value becomes ONE craft-core TokenBudget, checked by craft-core's rules
        # (the error names the field); the run draws these objects (`sample_budget`).
        self._ratio_budgets = _as_budgets("ratios", self.ratios, lambda r: TokenBudget(ratio=r))
        self._threshold_budgets = _as_budgets(
            "thresholds",
            self.thresholds,
            lambda t: TokenBudget(threshold=t, min_tokens=self.min_tokens),
        )
        return self

    @property
    def ratio_budgets(self) -> list[TokenBudget]:
        """One `TokenBudget(ratio=r)` per entry of `ratios`, in order."""
        return list(self._ratio_budgets)

    @property
    def threshold_budgets(self) -> list[TokenBudget]:
        """One `TokenBudget(threshold=t, min_tokens=min_tokens)` per entry of `thresholds`."""
        return list(self._threshold_budgets)


def _as_budgets(
    field: str, values: list[float], build: Callable[[float], TokenBudget]
) -> list[TokenBudget]:
    """`build(value)` for every value; a refused one is a validation error of `field`."""
    budgets = []
    for value in values:
        try:
            budgets.append(build(value))
        except (TypeError, ValueError) as error:
            detail = InitErrorDetails(
                type=PydanticCustomError("budget", "{error}", {"error": str(error)}),
                loc=(field,),
                input=values,
            )
            raise ValidationError.from_exception_data("BudgetConfig", [detail]) from None
    return budgets


class OptimConfig(_Strict):
    """Optimizer, schedule, batch and precision (paper, Table 6)."""

    lr: float = Field(gt=0, description="Learning rate of the merge module.")
    weight_decay: float = Field(default=1e-2, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas.")
    eps: float = Field(default=1e-8, gt=0, description="AdamW epsilon.")
    scheduler: Literal["cosine", "linear", "constant"] = Field(
        default="cosine", description="LR schedule after the warmup."
    )
    warmup_ratio: float = Field(
        default=0.02, ge=0, lt=1, description="Fraction of optimizer steps of linear warmup."
    )
    max_grad_norm: float | None = Field(
        default=1.0, gt=0, description="Gradient clipping (None: none)."
    )
    epochs: int = Field(default=1, gt=0, description="Passes over the mixture.")
    max_steps: int | None = Field(
        default=None, gt=0, description="Stop after this many optimizer steps (None: epochs)."
    )
    per_device_batch_size: int = Field(default=1, gt=0, description="Examples per micro-batch.")
    grad_accum: int = Field(default=4, gt=0, description="Micro-batches per optimizer step.")
    bf16: bool = Field(default=True, description="bf16 mixed precision.")
    gradient_checkpointing: bool = Field(
        default=True, description="Recompute the backbone's activations in the backward pass."
    )
    seed: int = Field(default=42, ge=0, description="Seed of data order, budgets and init.")

    @field_validator("betas")
    @classmethod
    def _betas(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in value):
            raise ValueError(f"betas must lie in [0, 1), got {value}")
        return value


class TrainConfig(_Strict):
    """Where the run writes, how often, and how it is distributed."""

    output_dir: str = Field(min_length=1, description="Folder of checkpoints, logs, result.")
    save_steps: int = Field(default=500, gt=0, description="Checkpoint every this many steps.")
    save_total_limit: int | None = Field(
        default=2, gt=0, description="Keep at most this many checkpoints (None: all)."
    )
    logging_steps: int = Field(default=1, gt=0, description="Log every this many steps.")
    deepspeed: str | None = Field(
        default="zero2",
        description="DeepSpeed JSON config: 'zero2' (shipped, ZeRO-2 with 'auto' values), a "
        "file path, or None for plain DDP / single process.",
    )
    resume: Literal["auto", "never"] | str = Field(
        default="auto",
        description="'auto': continue from the newest checkpoint in output_dir if there is "
        "one; 'never': start over; or the path of a checkpoint folder.",
    )
    progress_bar: bool = Field(default=True, description="tqdm progress bar on rank 0.")
    report_to: list[Literal["tensorboard", "wandb", "none"]] = Field(
        default_factory=list,
        description="Also log to TensorBoard (output_dir/tensorboard) and / or Weights & "
        "Biases (extras craft-train[tensorboard], craft-train[wandb]); [] or [none]: "
        "log.jsonl only.",
    )
    wandb_project: str = Field(default="craft", min_length=1, description="W&B project.")

    @field_validator("report_to")
    @classmethod
    def _report_to(cls, value: list[str]) -> list[str]:
        if "none" in value and len(value) > 1:
            raise ValueError(f"'none' excludes the others, got {value}")
        if len(set(value)) != len(value):
            raise ValueError(f"a backend named twice: {value}")
        return value


DEFAULT_DISTILL_PROMPTS = (
    "Describe this video in detail.",
    "What happens in this video?",
    "What objects and people can be seen in this video?",
    "Where does this video take place, and what is the setting like?",
    "What is the main action in this video, and who or what performs it?",
    "Summarize this video in one sentence.",
)
"""Generic prompts given to the manifest rows of a distillation run that bring none."""


class DistillConfig(_Strict):
    """`stage: distill`: match the uncompressed model on unlabeled videos (craft_train.distill)."""

    prompts: list[str] = Field(
        default_factory=lambda: list(DEFAULT_DISTILL_PROMPTS),
        min_length=1,
        description="Prompts drawn for manifest rows without a `prompt` of their own.",
    )
    prompts_per_video: int = Field(
        default=1, gt=0, description="Prompts drawn (distinct) for each row without a prompt."
    )
    max_new_tokens: int = Field(
        default=128, gt=0, description="Longest teacher response (greedy, cached on disk)."
    )
    temperature: float = Field(
        default=1.0, gt=0, description="Softmax temperature T of the KL (scaled by T^2)."
    )
    ce_weight: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Loss = (1 - w) KL + w CE on the teacher's tokens (0: pure KL).",
    )
    cache_dir: str | None = Field(
        default=None,
        description="Folder of the teacher's cached responses; None: output_dir/teacher.",
    )
    teacher: str | None = Field(
        default=None,
        description="Another model (same tokenizer) as the teacher; None: the backbone itself, "
        "uncompressed (the method). Its own vision tower runs then.",
    )
    shuffle_teacher: bool = Field(
        default=False,
        description="A control for learning tests: each row of a micro-batch is taught the "
        "teacher's distributions of ANOTHER row (the rows rolled by one), i.e. of another "
        "video: nothing about its own video to learn. Needs optim.per_device_batch_size >= 2.",
    )
    keep_teacher_logits: bool = Field(
        default=False,
        description="Keep each example's teacher logits (its last max_new_tokens positions) in "
        "memory, on the training device, after their first forward and reuse them in later "
        "epochs: the teacher is frozen, so from the second epoch on no teacher forward runs. "
        "Costs max_new_tokens x vocabulary floats an example: for a small vocabulary or few "
        "examples over many epochs (a learning test's one-token answers), not a 150k vocabulary.",
    )

    @model_validator(mode="after")
    def _enough_prompts(self) -> DistillConfig:
        if self.prompts_per_video > len(self.prompts):
            raise ValueError(
                f"distill.prompts_per_video: {self.prompts_per_video} distinct prompts asked, "
                f"distill.prompts holds {len(self.prompts)}"
            )
        return self


class TrainingConfig(_Strict):
    """One stage: `craft-train stage1|stage2|distill --config FILE`."""

    stage: Literal[1, 2, "distill"] = Field(
        description="1: caption pre-training; 2: QA; distill: match the uncompressed model."
    )
    model: ModelConfig
    data: DataConfig
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    optim: OptimConfig
    train: TrainConfig
    distill: DistillConfig | None = Field(
        default=None, description="Distillation settings (stage distill only; defaults filled)."
    )

    @model_validator(mode="before")
    @classmethod
    def _distill_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("stage") == "distill" and data.get("distill") is None:
            data = {**data, "distill": {}}
        return data

    @model_validator(mode="after")
    def _stage_rules(self) -> TrainingConfig:
        if self.stage != "distill" and self.distill is not None:
            raise ValueError("distill: this section belongs to stage distill only")
        shuffled = self.distill is not None and self.distill.shuffle_teacher
        if shuffled and self.optim.per_device_batch_size < 2:
            raise ValueError(
                "distill.shuffle_teacher: rows are taught another row's teacher within a "
                "micro-batch; set optim.per_device_batch_size >= 2"
            )
        if self.stage == 2 and self.model.init_from is None:
            raise ValueError(
                "model.init_from: stage 2 inherits the stage-1 merge module; give the stage-1 "
                "run's output folder"
            )
        return self

    def mixture(self) -> MixtureConfig:
        """The mixture, read from its file when `data.mixture` is a path."""
        if isinstance(self.data.mixture, MixtureConfig):
            return self.data.mixture
        return load_mixture(self.data.mixture)


# --------------------------------------------------------------------------- loading


_UNION_TAGS = {"str", "int", "float", "bool", "MixtureConfig"}


def _first_error(err: ValidationError) -> str:
    """`field.path: message` for each error, without pydantic's union-member tags."""
    errors = err.errors()
    # `MixtureConfig | str` given a mapping also fails the `str` branch: that is noise.
    if len(errors) > 1:
        errors = [e for e in errors if e["type"] != "string_type"] or errors
    parts = []
    for e in errors:
        loc = [
            str(p)
            for p in e["loc"]
            if not (
                isinstance(p, str) and (p in _UNION_TAGS or p.startswith(("literal[", "function-")))
            )
        ]
        message = e["msg"].removeprefix("Value error, ")
        parts.append(f"{'.'.join(loc) or '<root>'}: {message}")
    return "; ".join(dict.fromkeys(parts))


def _format(err: ValidationError, where: str) -> ConfigError:
    return ConfigError(f"invalid config {where}: {_first_error(err)}")


def _parse_value(text: str) -> Any:
    """A YAML scalar or flow collection: `1e-3`, `true`, `null`, `[2, 4]`, `{cap: 10}`.

    YAML reads `1e-3` (no dot) as a string; pydantic turns numeric strings into the number
    a float field needs, so that needs no special case here.
    """
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides (values parsed as YAML) to a nested dict, in place.

    Raises:
        ConfigError: an override without `=`, or one that descends into a non-mapping.
    """
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.field=value")
        key, text = item.split("=", 1)
        path = [p for p in key.strip().split(".") if p]
        if not path:
            raise ConfigError(f"override {item!r} has no field name")
        node: Any = data
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(path[: i + 1])
                raise ConfigError(f"{where}: is not a section, cannot set {key.strip()}")
            node = child
        node[path[-1]] = _parse_value(text)
    return data


def _read_yaml(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{what} {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{what} {path} is not valid YAML: {err}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} must hold a mapping, got {type(data).__name__}")
    return data


def shipped_mixture(name: str | Path) -> Path | None:
    """The package's own mixture file of that name (`craft_train/mixtures/`), if `name` is
    a bare file name that exists there and not in the working directory."""
    from importlib import resources

    if Path(name).exists() or Path(name).name != str(name):
        return None
    shipped = Path(str(resources.files("craft_train").joinpath("mixtures").joinpath(str(name))))
    return shipped if shipped.is_file() else None


def load_mixture(path: str | Path) -> MixtureConfig:
    """A mixture from its own YAML file (or a shipped one, by name: `craft_stage1.yaml`)."""
    path = shipped_mixture(path) or path
    data = _read_yaml(Path(path), "mixture file")
    if data.get("root") is None:  # relative `datasets` paths: the file's own folder
        data["root"] = str(Path(path).parent)
    try:
        return MixtureConfig.model_validate(data)
    except ValidationError as err:
        raise _format(err, f"in mixture file {path}") from None


def load_config(
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    *,
    stage: int | str | None = None,
    data: Mapping[str, Any] | None = None,
) -> TrainingConfig:
    """Read, override and validate a config.

    Args:
        path: YAML file (or None with `data`).
        overrides: `a.b=value` strings applied after the file.
        stage: the CLI's sub-command; a file that says another stage is an error, a file that
            says none gets this one.
        data: a dict instead of a file (tests, programmatic use).

    Raises:
        ConfigError: unreadable file, bad override, or invalid field (named in the message).
    """
    if (path is None) == (data is None):
        raise ValueError("give exactly one of path and data")
    raw = _read_yaml(Path(path), "config file") if path is not None else dict(data or {})
    raw = apply_overrides(_deep_copy(raw), overrides)
    if stage is not None:
        if raw.get("stage") is None:
            raw["stage"] = stage
        elif raw["stage"] != stage:
            command = "distill" if stage == "distill" else f"stage{stage}"
            raise ConfigError(
                f"stage: the config is for stage {raw['stage']} but `{command}` was run"
            )
    try:
        cfg = TrainingConfig.model_validate(raw)
    except ValidationError as err:
        raise _format(err, f"{path}" if path is not None else "") from None
    mixture = cfg.mixture()  # a bad mixture file fails now, naming its fields
    if cfg.stage == "distill" and mixture.datasets:
        raise ConfigError(
            "data.mixture.datasets: a distillation run reads data.manifests only (unlabeled "
            "videos with optional prompts); list the files there"
        )
    if not cfg.data.manifests and not mixture.datasets:
        raise ConfigError(
            "data.manifests: no data; list files in data.manifests or in data.mixture's datasets"
        )
    return cfg


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def check_paths(cfg: TrainingConfig) -> None:
    """Files the run reads must exist: raise ConfigError naming the first field that fails.

    Kept apart from parsing so that example configs with placeholder paths still parse.
    A backbone given as a hub id (not a local folder) is not checked here.
    """
    for i, manifest in enumerate(cfg.data.manifests):
        if not Path(manifest).is_file():
            raise ConfigError(f"data.manifests.{i}: file {manifest} does not exist")
    if cfg.data.video_root is not None and not Path(cfg.data.video_root).is_dir():
        raise ConfigError(f"data.video_root: folder {cfg.data.video_root} does not exist")
    if isinstance(cfg.data.mixture, str) and not (
        Path(cfg.data.mixture).is_file() or shipped_mixture(cfg.data.mixture)
    ):
        raise ConfigError(f"data.mixture: file {cfg.data.mixture} does not exist")
    mixture = cfg.mixture()
    for i, entry in enumerate(mixture.datasets):
        path = mixture.dataset_path(entry)
        if not path.is_file():
            unset = "; is an environment variable in it unset?" if "$" in str(path) else ""
            raise ConfigError(
                f"data.mixture.datasets.{i}.json_path: file {path} does not exist{unset}"
            )
    if cfg.model.init_from is not None and not Path(cfg.model.init_from).exists():
        raise ConfigError(f"model.init_from: {cfg.model.init_from} does not exist")
    lora_init = cfg.model.lora.init_from
    if lora_init is not None and not Path(lora_init).is_dir():
        raise ConfigError(f"model.lora.init_from: folder {lora_init} does not exist")
    ds = cfg.train.deepspeed
    if ds is not None and ds != "zero2" and not Path(ds).is_file():
        raise ConfigError(f"train.deepspeed: {ds} is neither 'zero2' nor an existing file")
    resume = cfg.train.resume
    if resume not in ("auto", "never") and not Path(resume).is_dir():
        raise ConfigError(f"train.resume: checkpoint folder {resume} does not exist")
    for field, value in (
        ("model.backbone", cfg.model.backbone),
        ("model.processor", cfg.model.processor),
        ("distill.teacher", cfg.distill.teacher if cfg.distill is not None else None),
    ):
        if value is None:
            continue
        looks_local = value.startswith(("/", "./", "../", "~")) or Path(value).exists()
        if looks_local and not Path(value).expanduser().is_dir():
            raise ConfigError(f"{field}: folder {value} does not exist")


# Fields a resumed run may change: they decide where and how often it reports, never what it
# computes. Every other field must equal the interrupted run's (see `config_drift`).
RESUMABLE_FIELDS = (
    "train.resume",
    "train.output_dir",
    "train.progress_bar",
    "train.report_to",
    "train.wandb_project",
    "train.logging_steps",
    "train.save_steps",
    "train.save_total_limit",
    "data.num_workers",
)


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(_flatten(inner, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: value}


def config_drift(saved: Mapping[str, Any], cfg: TrainingConfig) -> list[str]:
    """Fields (`a.b.c`) whose value in `cfg` differs from the `saved` config of a run, outside
    `RESUMABLE_FIELDS`: resuming with any of them changed would silently mix two runs."""
    old = _flatten(dict(saved))
    new = _flatten(cfg.model_dump(mode="json"))
    keys = sorted(set(old) | set(new))
    return [
        k
        for k in keys
        if old.get(k) != new.get(k) and not any(k.startswith(f) for f in RESUMABLE_FIELDS)
    ]


def dump_config(cfg: TrainingConfig) -> str:
    """The config as YAML (written next to every checkpoint)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
