"""Train the world backbone from scratch on the CPU, reproducibly, resumably.

    python -m craft_world.train_backbone --work /tmp/world --out packages/craft-world/src/craft_world/checkpoints/backbone

1. writes the training clips (split "train", `--clips` of them) as mp4 under `--work`,
   decodes them with craft-adapters' reader and runs the processor once (pixel values kept
   in float16),
2. trains every weight of a freshly initialised `backbone.world_config()` model with AdamW
   (warmup, cosine) on a seeded mixture: existence questions (1/2), count questions (1/4),
   captions (1/4); cross-entropy on the answer tokens only, plus an auxiliary loss that
   makes the vision tower say which colours each video token shows (a linear probe on the
   projector's output, `token_colours`; the probe is discarded). Four runs without it
   (lr 5e-4 to 2e-3, batch 4 to 16) still answered with the prior after 700 to 1,200
   steps; whether the probe is needed, or they only needed longer, is not established,
3. checkpoints `--work/state.pt` every `--save-every` steps (a killed run resumes from it:
   batches are a pure function of `(seed, step)`, so the resumed run is the same run) and
   logs held-out accuracy to `--work/log.jsonl`,
4. saves the model (`save_pretrained`) and its processor in `--out`.

Bit for bit: one torch thread, fixed seeds, no dropout; the same machine and library
versions give the same weights.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from craft_world.backbone import new_backbone, world_processor
from craft_world.clips import (
    CAPTION_PROMPT,
    COUNT_OPTIONS,
    FRAMES,
    PALETTE,
    SIZE,
    SQUARE,
    VIDEO_FOLDER,
    YES_NO,
    Scene,
    make_clips,
    mvbench_prompt,
    questions_for,
    sample_scene,
)

__all__ = ["ClipBank", "main", "train_backbone"]


class ClipBank:
    """Decoded, processed clips of one split: `pixels[i]` is float16 `[144, 1176]`."""

    def __init__(self, root: Path, n: int, seed: int, split: str, processor: Any) -> None:
        from craft_adapters import build_inputs, read_video

        make_clips(root, n, seed, split=split)
        cache = root / f"pixels-{n}.pt"
        self.scenes = [sample_scene(seed, split, i) for i in range(n)]
        self.questions = [questions_for(s, seed, split, i) for i, s in enumerate(self.scenes)]
        if cache.is_file():
            saved = torch.load(cache, weights_only=True)
            self.pixels, self.grid, self.fps = saved["pixels"], saved["grid"], 2.0
            return
        pixels, grids = [], []
        for i in range(n):
            video = read_video(root / "video" / VIDEO_FOLDER / f"{split}_{i:06d}.mp4", fps=2.0)
            inputs = build_inputs(processor, video.frames, video.fps, "x")
            pixels.append(inputs["pixel_values_videos"].to(torch.float16))
            grids.append(inputs["video_grid_thw"])
        self.pixels = torch.stack(pixels)  # [n, 144, 1176]
        self.grid = grids[0]  # [1, 3], the same for every clip
        self.fps = float(video.fps)
        torch.save({"pixels": self.pixels, "grid": self.grid}, cache)


def token_colours(scene: Scene) -> torch.Tensor:
    """Which colours each of the clip's 144 video tokens shows: float `[144, 6]` (0/1).

    Token order is Qwen2.5-VL's (temporal pair, patch row, patch column); a token shows a
    colour when the square covers any pixel of its 14 x 14 patch in either frame of its pair.
    """
    names = list(PALETTE)
    out = torch.zeros(FRAMES // 2, SIZE // 14, SIZE // 14, len(names))
    for colour, (a, b), (y0, x0), (y1, x1) in zip(
        scene.colours, scene.spans, scene.starts, scene.ends
    ):
        for t in range(a, b):
            y = round(y0 + (y1 - y0) * t / (FRAMES - 1))
            x = round(x0 + (x1 - x0) * t / (FRAMES - 1))
            rows = slice(y // 14, (y + SQUARE - 1) // 14 + 1)
            cols = slice(x // 14, (x + SQUARE - 1) // 14 + 1)
            out[t // 2, rows, cols, names.index(colour)] = 1.0
    return out.reshape(-1, len(names))


class PromptCache:
    """Token ids of `prompt` (+ a dummy video of the world's grid) and of each target."""

    def __init__(self, processor: Any, frames: np.ndarray, fps: float) -> None:
        self.processor, self.frames, self.fps = processor, frames, fps
        self.tok = processor.tokenizer
        self._ids: dict[str, torch.Tensor] = {}
        self._types: dict[str, torch.Tensor] = {}

    def prompt(self, text: str) -> torch.Tensor:
        from craft_adapters import build_inputs

        if text not in self._ids:
            inputs = build_inputs(self.processor, self.frames, self.fps, text)
            self._ids[text] = inputs["input_ids"][0]
            self._types[text] = inputs["mm_token_type_ids"][0]
        return self._ids[text]

    def types(self, text: str) -> torch.Tensor:
        """`mm_token_type_ids` of the prompt (the 3D rotary positions of the video need them)."""
        self.prompt(text)
        return self._types[text]

    def target(self, text: str) -> torch.Tensor:
        key = "\0" + text
        if key not in self._ids:
            ids = self.tok(text + "<|im_end|>\n", add_special_tokens=False)["input_ids"]
            self._ids[key] = torch.tensor(ids)
        return self._ids[key]


def sample_example(bank: ClipBank, rng: np.random.Generator) -> tuple[int, str, str]:
    """`(clip, prompt, target)`: existence 1/2 (asked colour present 1/2), count 1/4, caption 1/4."""
    i = int(rng.integers(len(bank.scenes)))
    scene = bank.scenes[i]
    kind = rng.random()
    if kind < 0.5:
        present = rng.random() < 0.5
        pool = list(scene.colours) if present else [c for c in PALETTE if c not in scene.colours]
        colour = str(rng.choice(pool))
        prompt = mvbench_prompt(f"Is there a {colour} square?", YES_NO)
        target = "A" if present else "B"
    elif kind < 0.75:
        prompt = mvbench_prompt("How many squares are there?", COUNT_OPTIONS)
        target = "ABC"[len(scene.colours) - 1]
    else:
        return i, CAPTION_PROMPT, scene.caption
    if rng.random() < 0.5:  # craft-train strips its prompts: learn both forms
        prompt = prompt.strip()
    return i, prompt, target


def make_batch(
    bank: ClipBank, cache: PromptCache, examples: list[tuple[int, str, str]], pad: int
) -> dict[str, torch.Tensor]:
    """Right-padded inputs with labels on the target tokens only."""
    seqs, labels, types = [], [], []
    for _, prompt, target in examples:
        p, t = cache.prompt(prompt), cache.target(target)
        seqs.append(torch.cat([p, t]))
        labels.append(torch.cat([torch.full_like(p, -100), t]))
        types.append(torch.cat([cache.types(prompt), torch.zeros_like(t)]))
    length = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), length), pad, dtype=torch.long)
    lab = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    mm = torch.zeros_like(ids)
    for row, (s, y, m) in enumerate(zip(seqs, labels, types)):
        ids[row, : len(s)], lab[row, : len(s)], mask[row, : len(s)] = s, y, 1
        mm[row, : len(s)] = m
    clips = [i for i, _, _ in examples]
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "mm_token_type_ids": mm,
        "labels": lab,
        "pixel_values_videos": bank.pixels[clips].flatten(0, 1).float(),
        "video_grid_thw": bank.grid.repeat(len(clips), 1),
        "second_per_grid_ts": torch.ones(len(clips)),
    }


@torch.no_grad()
def heldout_accuracy(model: Any, bank: ClipBank, cache: PromptCache, pad: int) -> dict[str, float]:
    """Accuracy per task on `bank`'s MVBench questions: argmax over the option letters."""
    model.eval()
    hits: dict[str, list[bool]] = {}
    letters = [cache.tok.convert_tokens_to_ids(c) for c in "ABC"]
    for i, questions in enumerate(bank.questions):
        for q in questions:
            prompt = mvbench_prompt(q.question, q.candidates)
            batch = make_batch(bank, cache, [(i, prompt, "A")], pad)
            n = len(cache.prompt(prompt))
            batch.pop("labels")
            logits = model(**batch).logits[0, n - 1, letters[: len(q.candidates)]]
            hits.setdefault(q.task, []).append(int(logits.argmax()) == q.candidates.index(q.answer))
    model.train()
    return {k: float(np.mean(v)) for k, v in hits.items()}


def _lr(step: int, steps: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def train_backbone(
    work: Path,
    out: Path,
    *,
    seed: int = 0,
    clips: int = 4000,
    steps: int = 5000,
    batch: int = 4,
    lr: float = 1e-3,
    save_every: int = 100,
    eval_every: int = 100,
    eval_clips: int = 50,
    stop_at: int | None = None,
    aux_weight: float = 1.0,
) -> dict[str, float]:
    """Train (or resume) the backbone; save it with its processor in `out`; return accuracy.

    `stop_at`: return after this step without saving the model (what a kill leaves behind:
    the last `state.pt`), for testing the resume.
    """
    torch.set_num_threads(1)
    work.mkdir(parents=True, exist_ok=True)
    processor = world_processor()
    pad = int(processor.tokenizer.pad_token_id)
    t0 = time.perf_counter()
    bank = ClipBank(work / "train", clips, seed, "train", processor)
    test = ClipBank(work / "test", eval_clips, seed, "test", processor)
    print(f"clips ready in {time.perf_counter() - t0:.0f} s", flush=True)
    from craft_adapters import read_video

    sample = read_video(work / "test" / "video" / VIDEO_FOLDER / "test_000000.mp4", fps=2.0)
    cache = PromptCache(processor, sample.frames, sample.fps)

    model = new_backbone(seed)
    model.train()
    labels = torch.stack([token_colours(s) for s in bank.scenes])  # [n, 144, 6]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        probe = torch.nn.Linear(int(model.config.get_text_config().hidden_size), len(PALETTE))
    captured: list[torch.Tensor] = []
    model.model.visual.register_forward_hook(
        lambda mod, args, out: captured.append(out.pooler_output)
    )
    params = [*model.parameters(), *probe.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    state_path, log_path = work / "state.pt", work / "log.jsonl"
    step = 0
    if state_path.is_file():
        state = torch.load(state_path, weights_only=False)
        model.load_state_dict(state["model"])
        probe.load_state_dict(state["probe"])
        opt.load_state_dict(state["optimizer"])
        step = int(state["step"])
        print(f"resumed at step {step}", flush=True)
    warmup = max(1, steps // 20)
    t0 = time.perf_counter()
    while step < steps:
        rng = np.random.default_rng([seed, 7, step])
        examples = [sample_example(bank, rng) for _ in range(batch)]
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps, lr, warmup)
        captured.clear()
        loss = model(**make_batch(bank, cache, examples, pad)).loss
        chosen = [i for i, _, _ in examples]
        aux = torch.nn.functional.binary_cross_entropy_with_logits(
            probe(captured[0]), labels[chosen].flatten(0, 1)
        )
        (loss + aux_weight * aux).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        row: dict[str, Any] = {
            "step": step,
            "loss": round(float(loss), 5),
            "aux": round(float(aux), 5),
        }
        if step % eval_every == 0 or step == steps:
            row["heldout"] = heldout_accuracy(model, test, cache, pad)
        if step % save_every == 0 or step == steps:
            tmp = state_path.with_suffix(".tmp")
            state = {
                "model": model.state_dict(),
                "probe": probe.state_dict(),
                "optimizer": opt.state_dict(),
                "step": step,
            }
            torch.save(state, tmp)
            tmp.replace(state_path)
        if step % 10 == 0 or "heldout" in row:
            row["s"] = round(time.perf_counter() - t0, 1)
            with log_path.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
        if stop_at is not None and step >= stop_at:
            return {}
    acc = heldout_accuracy(model, test, cache, pad)
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    (out / "world_recipe.json").write_text(
        json.dumps(
            {
                "seed": seed,
                "clips": clips,
                "steps": steps,
                "batch": batch,
                "lr": lr,
                "heldout_accuracy": acc,
                "eval_clips": eval_clips,
                "torch": torch.__version__,
            },
            indent=1,
        )
    )
    return acc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m craft_world.train_backbone", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--work", required=True, help="folder of clips, state.pt, log.jsonl")
    parser.add_argument("--out", required=True, help="folder the trained model is saved to")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clips", type=int, default=4000)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args(argv)
    for name in ("clips", "steps", "batch"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be positive")
    if args.lr <= 0:
        parser.error("--lr must be positive")
    acc = train_backbone(
        Path(args.work),
        Path(args.out),
        seed=args.seed,
        clips=args.clips,
        steps=args.steps,
        batch=args.batch,
        lr=args.lr,
    )
    print(f"held-out accuracy {acc}; saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
