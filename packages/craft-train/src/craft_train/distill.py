"""Distillation: train the merge module on unlabeled videos to match the uncompressed model.

    cfg = load_config("qwen3_5_4b_distill.yaml", stage="distill")
    train(cfg)        # the trainer builds a `Distiller` when `cfg.stage == "distill"`

The data is a manifest of videos, each with an optional prompt (rows without one get
`distill.prompts_per_video` prompts drawn from `distill.prompts`). For each (video, prompt)
the frozen backbone, run UNCOMPRESSED, is the teacher:

1. before training, its greedy response is generated once and cached on disk
   (`craft_train.teacher_cache`; a killed run regenerates nothing it has);
2. at every step the teacher's next-token distributions along that response are computed
   again (no grad) and the student, the same backbone with CRAFT at the step's budget, is
   teacher-forced on the same response. The vision tower and projector run ONCE per
   micro-batch: both passes receive the same encoder output (`shared_vision`).

The loss over the response tokens is `(1 - ce_weight) * T^2 * KL(p_T || q_T) + ce_weight *
CE(q, teacher tokens)` (Hinton et al., 2015: `p_T`, `q_T` the teacher's and student's
softmax at temperature T; the T^2 keeps the gradient scale of T = 1). For CRAFT+ the teacher
runs with the LoRA adapters disabled: it is the original model.

`distill.shuffle_teacher` makes a control that must not learn (a learning test's): row b of
every micro-batch is taught the teacher's distributions of row b-1 (the rows rolled by one),
i.e. of another video; `item_kl` then measures against that wrong teacher too.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from craft_core.result import CompressionResult
from craft_train.config import DEFAULT_DISTILL_PROMPTS, ConfigError, TrainingConfig
from craft_train.data import SEQUENCE_KEYS, DecodeError, Example, build_mixture, json_rows
from craft_train.inputs import ExampleEncoder, _append_target
from craft_train.model import ModelBundle
from craft_train.teacher_cache import TeacherCache, example_key, fill_cache

__all__ = [
    "DEFAULT_PROMPTS",
    "DistillEncoder",
    "Distiller",
    "ResponseLogits",
    "Uncompressed",
    "left_align",
    "load_distill_examples",
    "read_distill_manifest",
    "shared_vision",
]

DEFAULT_PROMPTS = DEFAULT_DISTILL_PROMPTS
"""Generic prompts of the manifest rows that bring none (`distill.prompts` by default)."""


# --------------------------------------------------------------------------- data


def read_distill_manifest(
    path: str | Path,
    *,
    prompts: Sequence[str],
    prompts_per_video: int,
    seed: int,
    video_root: str | None = None,
) -> list[Example]:
    """Read one JSONL manifest of `{"video": ..., "prompt": ...?, "source": ...?}` rows.

    A row without a prompt becomes `prompts_per_video` examples with distinct prompts drawn
    from `prompts` (seeded by `seed` and the video path as the row writes it: the same on
    every rank, resume and machine).
    The source defaults to `"distill"`. Examples have an empty target: the teacher writes it.

    Raises:
        ConfigError: a row that is not a JSON object or has no video (file:line named).
    """
    path = Path(path)
    root = Path(video_root) if video_root is not None else path.parent
    examples: list[Example] = []
    for where, row in json_rows(path):
        for field, required in (("video", True), ("prompt", False), ("source", False)):
            value = row.get(field)
            if (required or value is not None) and (
                not isinstance(value, str) or not value.strip()
            ):
                raise ConfigError(f"{where}: field {field!r} must be a non-empty string")
        video = Path(row["video"]).expanduser()
        video = video if video.is_absolute() else root / video
        source = row.get("source") or "distill"
        if row.get("prompt"):
            chosen = [row["prompt"].strip()]
        else:
            rng = random.Random(f"craft-distill/{seed}/{row['video']}")  # as written
            chosen = rng.sample(list(prompts), prompts_per_video)
        examples.extend(Example(str(video), p, "", source) for p in chosen)
    if not examples:
        raise ConfigError(f"{path}: the manifest holds no examples")
    return examples


def load_distill_examples(cfg: TrainingConfig) -> list[Example]:
    """Every manifest of a distillation config, through the mixture (no video is opened)."""
    assert cfg.distill is not None
    examples: list[Example] = []
    for manifest in cfg.data.manifests:
        examples.extend(
            read_distill_manifest(
                manifest,
                prompts=cfg.distill.prompts,
                prompts_per_video=cfg.distill.prompts_per_video,
                seed=cfg.optim.seed,
                video_root=cfg.data.video_root,
            )
        )
    mixture = cfg.mixture()
    return build_mixture(
        examples, mixture, mixture.seed if mixture.seed is not None else cfg.optim.seed
    )


class DistillEncoder(ExampleEncoder):
    """`encoder(example)` -> model inputs of the prompt + the teacher's cached response.

    Labels are -100 on the prompt and the response ids on the response. The frames are
    thinned (as in `ExampleEncoder`) so that the prompt plus `max_new_tokens` fit
    `data.max_seq_len`: generation and training see the same frames.
    """

    def __init__(
        self,
        cfg: TrainingConfig,
        processor: Any,
        responses: dict[str, list[int] | str] | None = None,
    ) -> None:
        super().__init__(cfg, processor)
        assert cfg.distill is not None
        self.max_new_tokens = cfg.distill.max_new_tokens
        self.responses = responses if responses is not None else {}
        self.keyed = cfg.distill.keep_teacher_logits  # rows carry their key: Distiller.kept

    def prompt_inputs(self, example: Example, target_tokens: int | None = None) -> dict[str, Any]:
        """Processor outputs of the video + prompt + assistant prompt (`[1, L]` tensors), with
        room left for `distill.max_new_tokens` response tokens."""
        room = self.max_new_tokens if target_tokens is None else target_tokens
        return super().prompt_inputs(example, room)

    def __call__(self, example: Example) -> dict[str, Any]:
        entry = self.responses.get(example_key(example))
        if entry is None:
            raise DecodeError(f"no teacher response cached for {example.video!r}")
        if isinstance(entry, str):
            raise DecodeError(f"the teacher could not read it: {entry}")
        answer = torch.tensor([entry], dtype=torch.long)
        item = _append_target(self.prompt_inputs(example), answer)
        if self.keyed:
            item["teacher_key"] = example_key(example)
        return item


# --------------------------------------------------------------------------- the two passes


class Uncompressed:
    """The identity compressor: every token kept unchanged (the teacher's view).

    Routed through `craft_adapters.wrap`, it gives the unmodified model's logits while taking
    a precomputed vision encoder output, which is what lets the teacher and the student
    share one run of the vision tower.
    """

    def __call__(
        self, features: torch.Tensor, coords: torch.Tensor, **budget: Any
    ) -> CompressionResult:
        """`features` `[N, D]`, `coords` `[N, 3]` -> all N tokens, in order."""
        index = torch.arange(features.shape[0], device=features.device)
        return CompressionResult(features, coords, index, index.clone(), info={"method": "none"})


@contextlib.contextmanager
def shared_vision(adapters: Sequence[Any], batch: dict[str, Any]) -> Iterator[int]:
    """Run the vision tower + projector on `batch` once (no grad); inside the block every
    `adapter.encode_videos` call on this batch's pixels returns that output.

    The vision tower is frozen, so no gradient is lost. Yields the number of videos encoded.
    """
    pixels = batch.get("pixel_values_videos")
    if pixels is None or not adapters:
        yield 0
        return
    with torch.no_grad():
        encoded = adapters[0].encode_videos(batch)

    def replay(inputs: dict[str, Any]) -> tuple[Any, list[torch.Tensor]]:
        if not _same_shapes(inputs.get("pixel_values_videos"), pixels):
            raise RuntimeError("shared_vision: a call with other pixels than the shared batch")
        return encoded

    for adapter in adapters:
        adapter.encode_videos = replay
    try:
        yield len(encoded[1])
    finally:
        for adapter in adapters:
            del adapter.encode_videos


def _same_shapes(a: Any, b: Any) -> bool:
    """Same tensor shapes (or lists of them: LLaVA-OV's videos of different lengths)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_shapes(x, y) for x, y in zip(a, b))
    return False


def left_align(batch: dict[str, Any], pad_token_id: int) -> dict[str, Any]:
    """Move the right padding of the per-token `[B, L]` tensors to the left.

    Every row then ends at position L - 1 with its response, so the last `R + 1` logits of
    every row (R the longest response) cover every response token, before and after
    compression (`splice_sequence` re-pads on the side the batch was padded on).
    """
    mask = batch["attention_mask"]
    if not bool((mask[:, -1] == 0).any()):
        return batch
    out = dict(batch)
    lengths = mask.sum(dim=1).tolist()
    fills = {"input_ids": pad_token_id, "labels": -100}
    for key in (*SEQUENCE_KEYS,):
        value = batch.get(key)
        if value is None:
            continue
        moved = value.new_full(value.shape, fills.get(key, 0))
        for b, n in enumerate(lengths):
            if n:
                moved[b, -n:] = value[b, :n]
        out[key] = moved
    return out


@dataclass
class ResponseLogits:
    """The logits of one micro-batch at its response tokens (T of them, all rows together)."""

    teacher: torch.Tensor  # [T, V] logits at the response tokens
    student: torch.Tensor  # [T, V]
    targets: torch.Tensor  # [T] the teacher's tokens
    rows: torch.Tensor  # [T] batch row of each token


def _kl_per_token(teacher: torch.Tensor, student: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(softmax(teacher / T) || softmax(student / T)) per row of `[T, V]` logits -> `[T]`."""
    log_p = F.log_softmax(teacher.float() / temperature, dim=-1)
    log_q = F.log_softmax(student.float() / temperature, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


# --------------------------------------------------------------------------- the distiller


def load_teacher(cfg: TrainingConfig, student: Any, device: torch.device | str) -> Any:
    """The frozen `distill.teacher` model (another model with the backbone's vocabulary)."""
    from transformers import AutoModelForImageTextToText

    assert cfg.distill is not None and cfg.distill.teacher is not None
    kwargs: dict[str, Any] = {"dtype": getattr(torch, cfg.model.dtype)}
    if cfg.model.attn_implementation is not None:
        kwargs["attn_implementation"] = cfg.model.attn_implementation
    teacher: Any = AutoModelForImageTextToText.from_pretrained(cfg.distill.teacher, **kwargs)
    mine = int(teacher.config.get_text_config().vocab_size)
    theirs = int(student.config.get_text_config().vocab_size)
    if mine != theirs:
        raise ConfigError(
            f"distill.teacher: its vocabulary has {mine} tokens, the backbone's {theirs}; the "
            "teacher must share the backbone's tokenizer"
        )
    teacher.requires_grad_(False)
    teacher.eval()
    return teacher.to(device)


class Distiller:
    """The teacher of a distillation run, its cached responses, and the loss.

    Args:
        cfg: a config with `stage: distill`.
        bundle: the student (`build_model`): backbone + trained merge module (+ LoRA).
        teacher_model: a separate frozen teacher (`distill.teacher`); None: the student's
            own backbone, uncompressed and without LoRA (the method).
    """

    def __init__(self, cfg: TrainingConfig, bundle: ModelBundle, teacher_model: Any = None) -> None:
        from craft_adapters import wrap

        if cfg.distill is None:
            raise ConfigError("stage: a Distiller needs a config with stage: distill")
        self.cfg = cfg
        self.bundle = bundle
        self.temperature = cfg.distill.temperature
        self.ce_weight = cfg.distill.ce_weight
        self.shuffle_teacher = cfg.distill.shuffle_teacher
        self.separate = teacher_model is not None
        self.teacher_backbone: Any = teacher_model if self.separate else bundle.backbone
        self.teacher = wrap(self.teacher_backbone, Uncompressed(), ratio=1.0)
        self.responses: dict[str, list[int] | str] = {}
        self.max_new_tokens = cfg.distill.max_new_tokens
        # distill.keep_teacher_logits: example_key -> [max_new_tokens, V] teacher logits
        self.keep_logits = cfg.distill.keep_teacher_logits
        self.kept: dict[str, torch.Tensor] = {}
        self.last: dict[str, float] = {}

    @classmethod
    def prepare(
        cls, cfg: TrainingConfig, accelerator: Any, bundle: ModelBundle, examples: list[Example]
    ) -> Distiller:
        """Build the teacher and fill its response cache (every rank takes a share)."""
        assert cfg.distill is not None
        teacher = None
        if cfg.distill.teacher is not None:
            teacher = load_teacher(cfg, bundle.backbone, accelerator.device)
        distiller = cls(cfg, bundle, teacher)
        distiller.fill_cache(examples, accelerator)
        return distiller

    # -- the response cache --------------------------------------------------------------------

    def cache_folder(self) -> Path:
        assert self.cfg.distill is not None
        return Path(self.cfg.distill.cache_dir or Path(self.cfg.train.output_dir) / "teacher")

    def cache_meta(self) -> dict[str, Any]:
        """What decides the responses; a cache written with other values is refused."""
        cfg = self.cfg
        assert cfg.distill is not None
        return {
            "teacher": cfg.distill.teacher or cfg.model.backbone,
            "processor": cfg.model.processor,
            "dtype": cfg.model.dtype,
            "lora_init": None if self.separate else cfg.model.lora.init_from,
            "fps": cfg.data.fps,
            "max_frames": cfg.data.max_frames,
            "max_seq_len": cfg.data.max_seq_len,
            "max_new_tokens": cfg.distill.max_new_tokens,
        }

    def fill_cache(self, examples: list[Example], accelerator: Any = None) -> int:
        """Generate the missing responses (this rank's share), then read them all."""
        rank = accelerator.process_index if accelerator is not None else 0
        world = accelerator.num_processes if accelerator is not None else 1
        main = rank == 0
        if main:
            TeacherCache(self.cache_folder(), self.cache_meta())
        if accelerator is not None:
            accelerator.wait_for_everyone()
        cache = TeacherCache(self.cache_folder(), self.cache_meta(), create=False)
        encoder = DistillEncoder(self.cfg, self.bundle.processor)
        was_training = self.teacher_backbone.training
        self.teacher_backbone.eval()  # no dropout, no activation checkpointing
        try:
            made = fill_cache(
                cache,
                examples,
                lambda example: self.generate(encoder, example),
                rank=rank,
                world=world,
                progress=main and self.cfg.train.progress_bar,
            )
        finally:
            self.teacher_backbone.train(was_training)
        if accelerator is not None:
            accelerator.wait_for_everyone()
        self.responses = cache.responses()
        return made

    @torch.no_grad()
    def generate(self, encoder: DistillEncoder, example: Example) -> list[int]:
        """The teacher's greedy response to one example (token ids, up to the first EOS)."""
        inputs = encoder.prompt_inputs(example)
        device = self.teacher_backbone.device
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        length = int(inputs["input_ids"].shape[-1])
        with self.teacher_mode():
            out = self.teacher_backbone.generate(
                **inputs,
                max_new_tokens=encoder.max_new_tokens,
                do_sample=False,
                use_cache=True,
                pad_token_id=self.bundle.pad_token_id,
            )
        ids = [int(i) for i in out[0, length:].tolist()]
        eos = self.teacher_backbone.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        for i, token in enumerate(ids):
            if token in eos_ids:
                return ids[: i + 1]
        if not ids:
            raise DecodeError("the teacher generated nothing")
        return ids

    def make_encoder(self, cfg: TrainingConfig, processor: Any) -> DistillEncoder:
        """The trainer's `encoder_factory`: examples + cached responses -> model inputs."""
        return DistillEncoder(cfg, processor, self.responses)

    # -- the loss ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def teacher_mode(self) -> Iterator[None]:
        """The original model: LoRA adapters (CRAFT+) off while the teacher runs."""
        peft_model = self.bundle.peft_model
        if self.separate or peft_model is None:
            yield
            return
        with peft_model.disable_adapter():
            yield

    def response_logits(self, model: Any, batch: dict[str, Any]) -> ResponseLogits:
        """Teacher (no grad, uncompressed) and student (compressed) logits at the response
        tokens of `batch` (collated `[B, L]` inputs with `labels` on the response)."""
        batch = left_align(batch, self.bundle.pad_token_id)
        labels = batch["labels"]
        keys = self._row_keys(batch)
        inputs = {k: v for k, v in batch.items() if k not in ("labels", "teacher_key")}
        longest = int((labels != -100).sum(dim=1).max())
        if longest == 0:
            raise ValueError("distillation batch without response tokens (labels all -100)")
        tail = labels[:, -longest:]  # [B, R]: every row's response ends the sequence
        mask = tail != -100
        keep = longest + 1  # logits at L-R-1 .. L-2 predict the R response tokens
        adapters = [] if self.separate else [self.teacher.adapter, self.bundle.model.adapter]
        with shared_vision(adapters, inputs):
            teacher = self._teacher_logits(inputs, keep, keys)
            if self.shuffle_teacher:  # the control: row b is taught row b-1's video
                teacher = teacher.roll(1, dims=0)
            student = model(**inputs, logits_to_keep=keep).logits[:, :-1]
        rows = torch.arange(labels.shape[0], device=labels.device)[:, None].expand_as(tail)
        return ResponseLogits(teacher[mask], student[mask], tail[mask], rows[mask])

    def _row_keys(self, batch: dict[str, Any]) -> list[str] | None:
        """The rows' example keys where `distill.keep_teacher_logits` is on, else None."""
        if not self.keep_logits:
            return None
        if "teacher_key" not in batch:
            raise ValueError(
                "distill.keep_teacher_logits: the batch's rows carry no 'teacher_key' (they were "
                "encoded by another encoder than the Distiller's DistillEncoder)"
            )
        return list(batch["teacher_key"])

    def _teacher_logits(
        self, inputs: dict[str, Any], keep: int, keys: list[str] | None
    ) -> torch.Tensor:
        """`[B, keep - 1, V]`: the teacher's logits at the last `keep - 1` positions of each
        (left-aligned) row. With `keys` (`distill.keep_teacher_logits`) every row's last
        `max_new_tokens` positions are kept after their first forward and read back after
        that: the teacher is frozen, so they are its logits, up to the float rounding of the
        batch they were computed in."""

        def forward(width: int) -> torch.Tensor:
            with torch.no_grad(), self.teacher_mode():
                return self.teacher(**inputs, logits_to_keep=width).logits[:, :-1]

        if keys is None:
            return forward(keep)
        kept, width = self.kept, keep - 1
        if any(key not in kept or kept[key].shape[0] < width for key in keys):
            rows = forward(max(keep, self.max_new_tokens + 1))
            kept.update((key, row.clone()) for key, row in zip(keys, rows))
        return torch.stack([kept[key][-width:] for key in keys])

    def loss(self, model: Any, batch: dict[str, Any]) -> torch.Tensor:
        """The distillation loss of one micro-batch (mean over its response tokens).

        `model` is the student as the trainer calls it (DDP / DeepSpeed engine around
        `bundle.model`); `batch` the collated inputs with `labels` on the response.
        """
        p = self.response_logits(model, batch)
        t = self.temperature
        kl = _kl_per_token(p.teacher, p.student, t).mean() * (t * t)
        loss = kl
        self.last = {"kl": float(kl.detach())}
        if self.ce_weight > 0:
            ce = F.cross_entropy(p.student.float(), p.targets)
            loss = (1.0 - self.ce_weight) * kl + self.ce_weight * ce
            self.last["ce"] = float(ce.detach())
        return loss

    @torch.no_grad()
    def item_kl(self, model: Any, batch: dict[str, Any]) -> torch.Tensor:
        """`[B]`: per row, the mean KL (temperature 1) of the student to the teacher over its
        response tokens (an evaluation measure: no grad)."""
        p = self.response_logits(model, batch)
        per_token = _kl_per_token(p.teacher, p.student, 1.0)
        size = int(batch["input_ids"].shape[0])
        total = torch.zeros(size, device=per_token.device).index_add(0, p.rows, per_token)
        count = torch.bincount(p.rows, minlength=size).clamp_min(1)
        return total / count
