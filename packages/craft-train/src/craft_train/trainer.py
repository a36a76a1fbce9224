"""The training loop of one stage (accelerate, optionally DeepSpeed ZeRO-2).

    result = train(load_config("stage1.yaml", stage=1))

Per optimizer step: draw the budget from `(seed, step)`, set it on the model, run
`grad_accum` micro-batches (loss only on the caption / answer tokens; the adapter slices the
labels with the compressed sequence), step AdamW and the schedule, log, and every
`save_steps` write a checkpoint. A killed run started again with the same config continues
from its newest checkpoint with the same schedule, data order and budgets.

With `stage: distill` a `craft_train.distill.Distiller` first caches the teacher's responses,
then supplies the examples' encoder and the loss (KL to the uncompressed model).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from torch import nn

from craft_adapters.splice import NonFiniteOutput
from craft_core import CraftCompressor
from craft_train.budget import sample_budget
from craft_train.checkpoint import (
    CONFIG_FILE,
    LOG_FILE,
    TrainState,
    find_latest_checkpoint,
    load_rng_state,
    load_state_file,
    prune_checkpoints,
    save_rng_state,
)
from craft_train.config import (
    ConfigError,
    TrainingConfig,
    check_paths,
    config_drift,
    dump_config,
)
from craft_train.data import (
    Example,
    VideoTextDataset,
    collate,
    epoch_order,
    load_data,
    mixture_summary,
    rank_indices,
)
from craft_train.distributed import make_accelerator
from craft_train.hub_export import export_hub_folder
from craft_train.model import CRAFT_DIR, LORA_DIR, ModelBundle, build_model
from craft_train.report import check_reporters, open_reporter

__all__ = [
    "CheckpointNotSaved",
    "StepInfo",
    "TrainResult",
    "TrainingDiverged",
    "load_examples",
    "train",
]

log = logging.getLogger(__name__)


class TrainingDiverged(RuntimeError):
    """A non-finite loss, gradient norm or weight: the run stops before saving anything."""


class CheckpointNotSaved(RuntimeError):
    """A checkpoint could not be written (e.g. a full disk); the message names the last
    complete checkpoint, which is kept."""


@dataclass
class StepInfo:
    """What one optimizer step did (handed to `on_step` and written to log.jsonl)."""

    step: int
    loss: float
    lr: float
    budget: str
    grad_norm: float | None
    tokens_before: int
    tokens_after: int
    skipped_videos: int
    seconds: float


@dataclass
class TrainResult:
    """The outcome of `train` (on every rank; `losses` are this rank's, one per step run).

    `bundle` holds the trained model in memory (backbone, compressor, processor).
    """

    output_dir: Path
    global_step: int
    total_steps: int
    losses: list[float] = field(default_factory=list)
    skipped_videos: int = 0
    resumed_from: Path | None = None
    bundle: ModelBundle | None = field(default=None, repr=False)


def load_examples(cfg: TrainingConfig) -> list[Example]:
    """Read every manifest and build the mixture (cheap: no video is opened)."""
    if cfg.stage == "distill":
        from craft_train.distill import load_distill_examples

        return load_distill_examples(cfg)
    load = load_data(cfg)
    for note in load.notes:
        log.warning("%s", note)
    if load.problems:  # reported, never dropped silently; `--check` lists every one
        log.warning("%d data rows cannot be used and are left out (first: %s); "
                    "`craft-train ... --check` lists them", len(load.problems), load.problems[0])  # fmt: skip
    return load.examples


def _schedule(cfg: TrainingConfig, optimizer: torch.optim.Optimizer, total_steps: int) -> Any:
    from transformers import (
        get_constant_schedule_with_warmup,
        get_cosine_schedule_with_warmup,
        get_linear_schedule_with_warmup,
    )

    warmup = math.ceil(cfg.optim.warmup_ratio * total_steps)
    if cfg.optim.scheduler == "constant":
        return get_constant_schedule_with_warmup(optimizer, warmup)
    make = (
        get_cosine_schedule_with_warmup
        if cfg.optim.scheduler == "cosine"
        else get_linear_schedule_with_warmup
    )
    return make(optimizer, warmup, total_steps)


def _optimizer(cfg: TrainingConfig, bundle: ModelBundle) -> torch.optim.Optimizer:
    """AdamW: merge-module weights (decayed), its biases/vectors (not), LoRA (own lr)."""
    wd = cfg.optim.weight_decay
    craft = bundle.craft_parameters()
    groups: list[dict[str, Any]] = [
        {"params": [p for p in craft if p.dim() >= 2], "lr": cfg.optim.lr, "weight_decay": wd},
        {"params": [p for p in craft if p.dim() < 2], "lr": cfg.optim.lr, "weight_decay": 0.0},
    ]
    lora = bundle.lora_parameters()
    if lora:
        groups.append({"params": lora, "lr": cfg.model.lora.lr, "weight_decay": wd})
    groups = [g for g in groups if g["params"]]
    return torch.optim.AdamW(groups, betas=cfg.optim.betas, eps=cfg.optim.eps)


def _to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


class _Runner:
    """State shared by the loop, the logger and the checkpoint writer of one run."""

    def __init__(self, cfg: TrainingConfig, accelerator: Any, bundle: ModelBundle) -> None:
        self.cfg = cfg
        self.acc = accelerator
        self.bundle = bundle
        self.output_dir = Path(cfg.train.output_dir)
        self.deepspeed = cfg.train.deepspeed is not None
        self.reporter: Any = None  # train.report_to (rank 0; craft_train.report)

    # -- weights -------------------------------------------------------------------------------

    def craft_state(self) -> dict[str, torch.Tensor]:
        """The merge module's weights in float32 (DeepSpeed's fp32 master copies if any)."""
        compressor = self.bundle.compressor
        state = {}
        for name, tensor in compressor.state_dict(keep_vars=True).items():
            if self.deepspeed and isinstance(tensor, nn.Parameter) and tensor.requires_grad:
                from deepspeed.utils import safe_get_full_fp32_param

                full = safe_get_full_fp32_param(tensor)
                tensor = full if full is not None else tensor
            state[name] = tensor.detach().float().cpu().clone()
        return state

    def save_weights(self, folder: Path) -> None:
        """craft/ (and lora/) into `folder`. Call on EVERY rank: under ZeRO, gathering the
        fp32 master weights is a collective; only the main process writes."""
        self._write_weights(folder, self._finite_state(folder))

    def _finite_state(self, folder: Path) -> dict[str, torch.Tensor]:
        """`craft_state()` (a collective under ZeRO), refused when not finite (every rank)."""
        state = self.craft_state()
        bad = [name for name, tensor in state.items() if not bool(torch.isfinite(tensor).all())]
        if bad:
            raise TrainingDiverged(
                f"merge-module weights {', '.join(bad[:3])} are not finite; nothing saved to "
                f"{folder}"
            )
        return state

    def _write_weights(self, folder: Path, state: dict[str, torch.Tensor]) -> None:
        if not self.acc.is_main_process:
            return
        with torch.random.fork_rng():  # building the copy must not move any RNG
            copy = CraftCompressor(self.bundle.compressor.config)
        copy.load_state_dict(state)
        copy.save_pretrained(folder / CRAFT_DIR)
        if self.bundle.peft_model is not None:
            self.bundle.peft_model.save_pretrained(str(folder / LORA_DIR))

    # -- checkpoints ---------------------------------------------------------------------------

    def save_checkpoint(
        self, state: TrainState, scheduler: Any, optimizer: Any, engine: Any
    ) -> Path:
        """Write `checkpoint-N` (via `checkpoint-N.tmp`). Call on every rank. When a write
        fails on any rank (a full disk: torch.save, safetensors, json and DeepSpeed each raise
        their own error), every rank raises `CheckpointNotSaved` naming the ranks that failed;
        the half-written folder is removed and the last complete checkpoint kept."""
        final = self.output_dir / f"checkpoint-{state.global_step}"
        tmp = self.output_dir / f"checkpoint-{state.global_step}.tmp"
        try:
            failed = self._write_checkpoint(tmp, state, scheduler, optimizer, engine)
        except BaseException:
            if self.acc.is_main_process:
                shutil.rmtree(tmp, ignore_errors=True)  # ours: the half-written folder
            raise
        if failed:
            if self.acc.is_main_process:
                shutil.rmtree(tmp, ignore_errors=True)
            self.acc.wait_for_everyone()  # the folder is gone before any rank reports
            last = find_latest_checkpoint(self.output_dir)
            kept = f"the last complete one, {last}, is kept" if last else "no earlier one exists"
            free = shutil.disk_usage(self.output_dir).free
            raise CheckpointNotSaved(
                f"{final.name} could not be written ({'; '.join(failed)}; {free} bytes free on "
                f"its filesystem); {kept}; free space and run the same command again to resume"
            )
        if self.acc.is_main_process:
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            prune_checkpoints(self.output_dir, self.cfg.train.save_total_limit)
        self.acc.wait_for_everyone()
        return final

    def _write_checkpoint(
        self, tmp: Path, state: TrainState, scheduler: Any, optimizer: Any, engine: Any
    ) -> list[str]:
        """Every part into `tmp`; "rank R: error" of each rank whose writes failed (the same
        list on every rank). The collectives run on every rank whatever failed, so no rank
        waits for one that gave up."""
        acc, main = self.acc, self.acc.is_main_process
        error = _attempt(lambda: _fresh_folder(tmp)) if main else None
        failed = _failed_ranks(acc, error)  # and a barrier: the folder exists before any write
        if failed:
            return failed
        if self.deepspeed:  # a collective: every rank calls it (a failure inside: README)
            folder = str(tmp / "deepspeed")
            error = _attempt(lambda: engine.save_checkpoint(folder, exclude_frozen_parameters=True))
        error = error or _attempt(lambda: save_rng_state(tmp, acc.process_index))
        weights = self._finite_state(tmp)
        if main and error is None:

            def write_main() -> None:
                self._write_weights(tmp, weights)
                if not self.deepspeed:
                    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
                torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
                (tmp / CONFIG_FILE).write_text(dump_config(self.cfg))
                state.save(tmp)  # last: marks the folder complete (renamed once all agree)

            error = _attempt(write_main)
        return _failed_ranks(acc, error)

    def load_checkpoint(
        self, folder: Path, scheduler: Any, optimizer: Any, engine: Any
    ) -> TrainState:
        from safetensors.torch import load_file

        state = TrainState.load(folder)
        if state.world_size != self.acc.num_processes:
            raise ConfigError(
                f"train.resume: {folder} was written by {state.world_size} processes, this run "
                f"has {self.acc.num_processes}; resume with the same number"
            )
        if self.deepspeed:
            path, _ = engine.load_checkpoint(
                str(folder / "deepspeed"),
                load_module_strict=False,
                load_optimizer_states=True,
                load_lr_scheduler_states=False,
            )
            if path is None:
                raise RuntimeError(f"DeepSpeed found no checkpoint in {folder / 'deepspeed'}")
        else:
            weights = load_file(str(folder / CRAFT_DIR / "model.safetensors"))
            self.bundle.compressor.load_state_dict(weights)
            if self.bundle.peft_model is not None:
                lora = load_file(str(folder / LORA_DIR / "adapter_model.safetensors"))
                self.bundle.load_lora_state_dict(lora)
            optimizer.load_state_dict(load_state_file(folder / "optimizer.pt"))
        scheduler.load_state_dict(load_state_file(folder / "scheduler.pt"))
        for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_last_lr()):
            group["lr"] = lr
        load_rng_state(folder, self.acc.process_index)
        return state

    # -- logging -------------------------------------------------------------------------------

    def truncate_log(self, last_step: int) -> None:
        """Drop log rows past `last_step` (written by a run killed after its checkpoint)."""
        path = self.output_dir / LOG_FILE
        if not self.acc.is_main_process or not path.is_file():
            return
        rows = [r for r in path.read_text().splitlines() if r.strip()]
        kept = [r for r in rows if json.loads(r).get("step", 0) <= last_step]
        path.write_text("".join(r + "\n" for r in kept))

    def write_log(self, row: dict[str, Any]) -> None:
        if self.acc.is_main_process:
            with (self.output_dir / LOG_FILE).open("a") as handle:
                handle.write(json.dumps(row) + "\n")
            if self.reporter is not None:
                self.reporter.log(row)


# What the writers raise on a full disk: open()/json -> OSError, torch.save (and DeepSpeed,
# which calls it) -> RuntimeError "[enforce fail at inline_container.cc] unexpected pos",
# safetensors -> SafetensorError.
_WRITE_ERRORS: tuple[type[BaseException], ...] = (OSError, RuntimeError, SafetensorError)


def _attempt(write: Callable[[], object]) -> str | None:
    """None when `write()` succeeds, else its error as one line."""
    try:
        write()
    except _WRITE_ERRORS as error:
        if isinstance(error, TrainingDiverged):
            raise
        return f"{type(error).__name__}: {error}".splitlines()[0]
    return None


def _fresh_folder(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)


def _failed_ranks(acc: Any, error: str | None) -> list[str]:
    """ "rank R: error" for every rank whose `error` is set (a collective)."""
    errors: list[str | None] = [error]
    if acc.num_processes > 1:
        errors = [None] * acc.num_processes
        torch.distributed.all_gather_object(errors, error)
    return [f"rank {rank}: {text}" for rank, text in enumerate(errors) if text is not None]


def _resume_folder(cfg: TrainingConfig) -> Path | None:
    if cfg.train.resume == "never":
        return None
    if cfg.train.resume == "auto":
        return find_latest_checkpoint(cfg.train.output_dir)
    return Path(cfg.train.resume)


def _progress_bar(cfg: TrainingConfig, main_process: bool, total: int, start: int) -> Any:
    """A tqdm bar over the optimizer steps on the main process, or None."""
    if not (cfg.train.progress_bar and main_process):
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, desc=f"stage {cfg.stage}", unit="step")


def train(
    cfg: TrainingConfig,
    *,
    on_step: Callable[[StepInfo], None] | None = None,
    encoder_factory: Callable[[TrainingConfig, Any], Callable[[Example], dict[str, Any]]]
    | None = None,
    examples: list[Example] | None = None,
) -> TrainResult:
    """Run one stage of training to the end (or continue it from its newest checkpoint).

    Args:
        cfg: a validated config.
        on_step: called on every rank after every optimizer step (tests use it to stop a run
            as a kill would).
        encoder_factory: `(cfg, processor) -> encode(example)`; default: decode the video with
            craft-adapters and build the prompt with the processor's chat template.
        examples: the data as `load_examples(cfg)` gives it, when the caller has read it
            already (the CLI: it has warned about the rows left out); default: read here.

    Returns:
        A `TrainResult`; the merge module is in `output_dir/craft` (LoRA in `output_dir/lora`).
    """
    check_paths(cfg)
    check_reporters(cfg)  # installed, logged in: before any model loads
    if examples is None:
        examples = load_examples(cfg)  # manifest errors surface before any model loads
    accelerator = make_accelerator(cfg)
    output_dir = Path(cfg.train.output_dir)
    resumed_from = _resume_folder(cfg)
    if resumed_from is not None:
        _check_same_run(resumed_from, cfg)
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / CONFIG_FILE).write_text(dump_config(cfg))
        log.info("mixture: %d examples %s", len(examples), mixture_summary(examples))
    plan = _plan(cfg, len(examples), accelerator.num_processes)
    loop = _Loop.build(cfg, accelerator, examples, plan, encoder_factory)
    start_step, loop.skipped_base = 0, 0
    if resumed_from is not None:
        start_step, loop.skipped_base = loop.resume(resumed_from)
    progress = _progress_bar(cfg, accelerator.is_main_process, plan.total_steps, start_step)
    result = TrainResult(output_dir, start_step, plan.total_steps, resumed_from=resumed_from)
    if accelerator.is_main_process:
        loop.runner.reporter = open_reporter(cfg, output_dir, start_step)
    try:
        step = loop.run(start_step, result, progress, on_step)
    finally:
        if loop.runner.reporter is not None:
            loop.runner.reporter.close()
        if progress is not None:
            progress.close()
    return _finish(loop, accelerator, output_dir, step, result)


def _finish(
    loop: _Loop, accelerator: Any, output_dir: Path, step: int, result: TrainResult
) -> TrainResult:
    """Save the final weights and state, write the Hub folder, fill in `result`."""
    final = loop.state(step, finished=True)
    loop.runner.save_weights(output_dir)
    if accelerator.is_main_process:
        final.save(output_dir)
        export_hub_folder(output_dir)  # reads the finished train_state: after final.save
    accelerator.wait_for_everyone()
    result.global_step = step
    result.skipped_videos = final.skipped_videos
    result.bundle = loop.bundle
    # No accelerator.end_training(): it destroys the process group, which the caller (a
    # second stage in the same process, a test) may still use.
    return result


@dataclass(frozen=True)
class _Plan:
    """How many optimizer steps the run takes."""

    per_step: int  # examples per optimizer step on one rank
    steps_per_epoch: int
    total_steps: int


def _plan(cfg: TrainingConfig, num_examples: int, world: int) -> _Plan:
    optim = cfg.optim
    per_step = optim.per_device_batch_size * optim.grad_accum
    steps_per_epoch = num_examples // (world * per_step)
    if steps_per_epoch == 0:
        raise ConfigError(
            f"data.manifests: the mixture holds {num_examples} examples, fewer than one "
            f"optimizer step needs ({world} processes x optim.per_device_batch_size "
            f"{optim.per_device_batch_size} x optim.grad_accum {optim.grad_accum})"
        )
    total_steps = steps_per_epoch * optim.epochs
    if optim.max_steps is not None:
        total_steps = min(total_steps, optim.max_steps)
    return _Plan(per_step, steps_per_epoch, total_steps)


@dataclass
class _Loop:
    """Everything the step loop uses: model, optimizer, schedule, data, checkpoints."""

    cfg: TrainingConfig
    accelerator: Any
    plan: _Plan
    examples: list[Example]
    bundle: Any
    dataset: VideoTextDataset
    distiller: Any
    scheduler: Any
    optimizer: Any  # the plain one (checkpoints)
    prepared_optimizer: Any
    model: Any  # the prepared model
    runner: _Runner
    trainable: list[torch.nn.Parameter]
    skipped_base: int = 0  # videos skipped before this process ran
    skipped_local: int = 0  # this rank, this process

    @classmethod
    def build(
        cls,
        cfg: TrainingConfig,
        accelerator: Any,
        examples: list[Example],
        plan: _Plan,
        encoder_factory: Any,
    ) -> _Loop:
        from accelerate.utils import set_seed

        set_seed(cfg.optim.seed)  # LoRA's init and dropout; a resumed run restores RNG states
        bundle = build_model(cfg, accelerator.device)
        distiller = None
        if cfg.stage == "distill":  # the teacher's responses: generated once, cached on disk
            from craft_train.distill import Distiller

            distiller = Distiller.prepare(cfg, accelerator, bundle, examples)
            encoder_factory = encoder_factory or distiller.make_encoder
        if encoder_factory is None:
            from craft_train.inputs import make_encoder

            encoder_factory = make_encoder
        dataset = VideoTextDataset(
            examples,
            encoder_factory(cfg, bundle.processor),
            max_consecutive_failures=cfg.data.max_consecutive_failures,
        )
        optimizer = _optimizer(cfg, bundle)
        scheduler = _schedule(cfg, optimizer, plan.total_steps)
        model, prepared_optimizer = accelerator.prepare(bundle.model, optimizer)
        runner = _Runner(cfg, accelerator, bundle)
        trainable = [p for p in bundle.model.parameters() if p.requires_grad]
        return cls(cfg, accelerator, plan, examples, bundle, dataset, distiller, scheduler,
                   optimizer, prepared_optimizer, model, runner, trainable)  # fmt: skip

    def resume(self, folder: Path) -> tuple[int, int]:
        """(step, videos skipped so far) of the checkpoint in `folder`, loaded."""
        state = self.runner.load_checkpoint(folder, self.scheduler, self.optimizer, self.model)
        plan = self.plan
        if state.total_steps != plan.total_steps or state.steps_per_epoch != plan.steps_per_epoch:
            raise ConfigError(
                f"train.resume: {folder} belongs to a run of {state.total_steps} steps "
                f"({state.steps_per_epoch} per epoch); this config gives {plan.total_steps} "
                f"({plan.steps_per_epoch}). Change train.output_dir or set train.resume=never"
            )
        self.runner.truncate_log(state.global_step)
        log.info("resumed from %s at step %d", folder, state.global_step)
        return state.global_step, state.skipped_videos

    def loader(self, epoch: int, first_micro: int) -> Iterator[dict[str, Any]]:
        """This rank's micro-batches of `epoch`, from micro-batch `first_micro` on."""
        optim, acc = self.cfg.optim, self.accelerator
        order = epoch_order(len(self.examples), optim.seed, epoch)
        mine = rank_indices(order, acc.process_index, acc.num_processes, self.plan.per_step)
        mine = mine[first_micro * optim.per_device_batch_size :]
        return iter(
            torch.utils.data.DataLoader(
                torch.utils.data.Subset(self.dataset, mine),
                batch_size=optim.per_device_batch_size,
                shuffle=False,
                num_workers=self.cfg.data.num_workers,
                collate_fn=partial(collate, pad_token_id=self.bundle.pad_token_id),
                drop_last=True,
                # Its own generator: making the iterator must not draw from the global RNG
                # (LoRA dropout's), or a resumed run would see other dropout masks.
                generator=torch.Generator().manual_seed(optim.seed),
            )
        )

    def skipped_total(self) -> int:  # a collective: every rank calls it at the same step
        return self.skipped_base + _sum_over_ranks(self.accelerator, self.skipped_local)

    def state(self, step: int, finished: bool) -> TrainState:
        return TrainState(
            global_step=step,
            total_steps=self.plan.total_steps,
            steps_per_epoch=self.plan.steps_per_epoch,
            world_size=self.accelerator.num_processes,
            examples=len(self.examples),
            skipped_videos=self.skipped_total(),
            finished=finished,
        )

    def run(self, step: int, result: TrainResult, progress: Any, on_step: Any) -> int:
        """Optimizer steps from `step` to the end; logs, checkpoints. -> the last step."""
        cfg, plan = self.cfg, self.plan
        batches: Iterator[dict[str, Any]] | None = None
        self.model.train()
        while step < plan.total_steps:
            started = time.perf_counter()
            epoch, in_epoch = divmod(step, plan.steps_per_epoch)
            if batches is None or in_epoch == 0:
                batches = self.loader(epoch, in_epoch * cfg.optim.grad_accum)
            budget = sample_budget(cfg.budget, cfg.optim.seed, step)
            self.bundle.set_budget(budget)
            losses, skipped, before, after, grad_norm = self.step(batches, step)
            self.scheduler.step()
            step += 1
            self.skipped_local += skipped
            mean_loss = sum(losses) / len(losses)
            _check_finite(self.accelerator, step, mean_loss, grad_norm, self.trainable)
            result.losses.append(mean_loss)
            info = StepInfo(
                step=step,
                loss=mean_loss,
                lr=self.scheduler.get_last_lr()[0],
                budget=budget.describe(),
                grad_norm=grad_norm,
                tokens_before=before,
                tokens_after=after,
                skipped_videos=self.skipped_local,
                seconds=time.perf_counter() - started,
            )
            last = step == plan.total_steps
            if step % cfg.train.logging_steps == 0 or last:
                _log_step(self.runner, info, self.accelerator, self.scheduler, epoch,
                          self.skipped_total())  # fmt: skip
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{mean_loss:.4f}", budget=info.budget)
            if step % cfg.train.save_steps == 0 or last:
                state = self.state(step, finished=last)
                self.runner.save_checkpoint(state, self.scheduler, self.optimizer, self.model)
            if on_step is not None:
                on_step(info)
        return step

    def step(
        self, batches: Iterator[dict[str, Any]], step: int
    ) -> tuple[list[float], int, int, int, float | None]:
        """One optimizer step over `grad_accum` micro-batches.
        -> (losses, videos skipped, tokens before / after compression, grad norm)."""
        optim, acc = self.cfg.optim, self.accelerator
        losses, skipped, before, after = [], 0, 0, 0
        grad_norm = None
        for micro in range(optim.grad_accum):
            batch = next(batches)
            skipped += len(batch.pop("skipped_videos"))
            batch = _to_device(batch, acc.device)
            with acc.accumulate(self.model):
                try:
                    if self.distiller is not None:  # KL to the teacher on its response
                        main_loss = self.distiller.loss(self.model, batch)
                    else:
                        main_loss = self.model(**batch).loss
                except NonFiniteOutput as error:  # the merge module's weights diverged
                    raise TrainingDiverged(
                        f"step {step + 1}: {error}; training stopped and nothing of this step "
                        "was saved. Lower optim.lr or set optim.max_grad_norm"
                    ) from None
                # Every trainable parameter joins the graph (with a zero gradient when, e.g.,
                # a threshold merged nothing), so DDP / ZeRO always see the same parameters.
                anchor = sum(p.reshape(-1)[0] * 0.0 for p in self.trainable)
                acc.backward(main_loss + anchor)
                if acc.sync_gradients != (micro == optim.grad_accum - 1):
                    raise RuntimeError("gradient accumulation went out of step")
                if acc.sync_gradients and optim.max_grad_norm is not None:
                    norm = acc.clip_grad_norm_(self.trainable, optim.max_grad_norm)
                    grad_norm = float(norm) if norm is not None else None
                self.prepared_optimizer.step()
                self.prepared_optimizer.zero_grad()
            losses.append(float(main_loss.detach()))
            report = getattr(self.bundle.model, "last_compression", None)
            if report is not None:
                before += report.tokens_before
                after += report.tokens_after
        return losses, skipped, before, after, grad_norm


def _check_same_run(folder: Path, cfg: TrainingConfig) -> None:
    """Refuse to resume `folder` with a config that changes what the run computes."""
    import yaml

    for path in (folder / CONFIG_FILE, folder.parent / CONFIG_FILE):
        if path.is_file():
            saved = yaml.safe_load(path.read_text()) or {}
            drift = config_drift(saved, cfg)
            if drift:
                raise ConfigError(
                    f"train.resume: {folder} was trained with another config ({path}); "
                    f"changed: {', '.join(drift[:6])}. Resume with the same values, or start "
                    "afresh with --set train.resume=never or another train.output_dir"
                )
            return


def _check_finite(
    accelerator: Any, step: int, loss: float, grad_norm: float | None, params: list[Any]
) -> None:
    """Stop (on every rank together) when the loss, the gradient norm or a trainable weight
    is not finite: nothing of this step is saved; the last checkpoint stays the good one."""
    weights_ok = all(bool(torch.isfinite(p.detach()).all()) for p in params)
    grad_ok = grad_norm is None or math.isfinite(grad_norm)
    bad = int(not (math.isfinite(loss) and grad_ok and weights_ok))
    if _sum_over_ranks(accelerator, bad):
        what = "loss" if not math.isfinite(loss) else "gradient norm" if not grad_ok else "weights"
        raise TrainingDiverged(
            f"step {step}: the {what} is not finite (loss {loss}, grad norm {grad_norm}); "
            "training stopped and nothing of this step was saved. Lower optim.lr, set "
            "optim.max_grad_norm, or check the data; the newest checkpoint-N is the last good state"
        )


def _sum_over_ranks(accelerator: Any, value: int) -> int:
    if accelerator.num_processes == 1:
        return value
    tensor = torch.tensor([value], device=accelerator.device, dtype=torch.long)
    return int(accelerator.reduce(tensor, reduction="sum").item())


def _log_step(
    runner: _Runner, info: StepInfo, accelerator: Any, scheduler: Any, epoch: int, skipped: int
) -> None:
    """Loss averaged over ranks; one JSON row (main process) and a log line."""
    loss = info.loss
    if accelerator.num_processes > 1:
        tensor = torch.tensor([info.loss], device=accelerator.device)
        loss = float(accelerator.reduce(tensor, reduction="mean").item())
    row = {
        "step": info.step,
        "epoch": epoch,
        "loss": loss,
        "lr": info.lr,
        "lrs": scheduler.get_last_lr(),
        "grad_norm": info.grad_norm,
        "budget": info.budget,
        "tokens_before": info.tokens_before,
        "tokens_after": info.tokens_after,
        "skipped_videos": skipped,
        "seconds": round(info.seconds, 4),
        "rank0_time": time.time(),
    }
    runner.write_log(row)
    if accelerator.is_main_process:
        log.info(
            "step %d loss %.4f lr %.3g %s tokens %d->%d",
            info.step,
            loss,
            info.lr,
            info.budget,
            info.tokens_before,
            info.tokens_after,
        )
