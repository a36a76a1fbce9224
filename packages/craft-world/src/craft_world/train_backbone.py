"""Train the world backbone from scratch on the CPU, reproducibly, resumably.

    python -m craft_world.train_backbone --work /tmp/world \
        --out packages/craft-world/src/craft_world/checkpoints/backbone

The recipe (every default below is the shipped backbone's; about 45 minutes on one thread):

1. every training example is a FRESH clip (split "train", a new scene index per example,
   rendered in memory, no fixed clip set): four runs on a fixed set of 4,000 clips stayed
   at chance or reached 88%;
2. phase A, a size curriculum: for the first 30% of its steps the clips hold 1-2 big squares
   whose sides shrink from 14-19 px to the final 10-15 px; then the final clips (1-3 squares);
   phase B starts from phase A's weights with a fresh optimiser and schedule on the final
   clips. Both phases: existence questions (2/5), count questions (1/5), captions (2/5);
   cross-entropy on the answer tokens only, plus an auxiliary loss that makes the vision
   tower say which colours each video token shows (a linear probe on the projector's output,
   `token_colours`, discarded after training);
3. phase P (`--steps-p`, `craft_world.tower_probe`): the vision tower alone learns to report
   all 24 colour x corner features of the tiles, evenly, through a probe of its own;
4. phase C (`--steps-c`): the language model (the tower frozen, `--freeze-vision-c`) learns
   the corners family's question (`--family-c`, a share `--crowd-share` of the examples)
   beside the squares' (issue 44: a tower that learned the question itself would make the
   answer's token an outlier that any diversity selection keeps; docs/crowd.md), and with
   `--caption-share-c` a share of those tile examples is the clip's caption instead (the
   quiz family's backbone, issue 54: docs/varying-question.md);
5. batch 8, AdamW (lr 1e-3, betas 0.9/0.98, weight decay 0.01), gradient clip 1.0, per
   phase 5% linear warmup then cosine to 0 (phase P: 50 warm-up steps);
6. checkpoints `--work/state.pt` every `--save-every` steps (a killed run resumes from it:
   batches are a pure function of `(seed, phase, step)`, so the resumed run is the same run),
   logs held-out accuracy (mp4 clips of split "test", read as the evaluation reads them) to
   `--work/log.jsonl`; `--start-from` a saved backbone of phases A and B skips them;
7. saves the model (`save_pretrained`), its processor, `world_recipe.json` (the recipe and
   its held-out accuracy over `--final-clips` clips, 2 questions each) and the log in `--out`.

Bit for bit: one torch thread, fixed seeds, no dropout; the same machine and library
versions give the same weights.
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from craft_world.backbone import new_backbone, world_processor
from craft_world.clips import (
    CAPTION_PROMPT,
    COUNT_OPTIONS,
    FPS,
    FRAMES,
    MAX_SQUARES,
    PALETTE,
    SIZE,
    SQUARE_SIDES,
    VIDEO_FOLDER,
    YES_NO,
    Scene,
    mvbench_prompt,
    questions_for,
    render,
    sample_scene,
    write_mp4,
)
from craft_world.crowd import (
    TILE_FAMILIES,
    TILES_PER_PAIR,
    CrowdScene,
    crowd_question,
    crowd_token_colours,
    quiz_feature_set,
    render_crowd,
    sample_quiz,
    sample_tiles,
    tile_caption,
)
from craft_world.files import make_clips
from craft_world.tower_probe import (
    asked_feature,
    corner_labels,
    new_corner_probe,
    probe_lr,
    probe_step,
)

__all__ = ["Recipe", "TestBank", "main", "token_colours", "train_backbone"]


@dataclass(frozen=True)
class Recipe:
    """The backbone recipe: the weights are a pure function of these fields."""

    seed: int = 0
    steps_a: int = 2500
    steps_b: int = 3500
    batch: int = 8
    lr: float = 1e-3
    curriculum: float = 0.3
    big_sides: tuple[int, int] = (14, 19)
    aux_weight: float = 1.0
    steps_c: int = 4000
    crowd_share: float = 0.75
    family_c: str = "corners"
    freeze_vision_c: bool = True
    steps_p: int = 600
    caption_share_c: float = 0.0
    quiz_features: str = ""
    quiz_shown_in: int = 1
    quiz_tiles: int = 10
    attn_aux_c: float = 0.0
    attn_aux_layer: int = 2
    attn_aux_corner_heads: bool = False
    mp4_c: bool = False

    def __post_init__(self) -> None:
        for name in ("steps_a", "batch"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if min(self.steps_b, self.steps_c, self.steps_p) < 0 or self.lr <= 0:
            raise ValueError(f"need steps_b, steps_c, steps_p >= 0 and lr > 0: {self}")
        if not 0 <= self.curriculum <= 1:
            raise ValueError(f"curriculum must be in [0, 1], got {self.curriculum}")
        for name in ("crowd_share", "caption_share_c"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.family_c not in TILE_FAMILIES:
            raise ValueError(
                f"family_c must be one of {tuple(TILE_FAMILIES)}, got {self.family_c!r}"
            )
        if quiz_feature_set(self.quiz_features) is not None and self.family_c != "quiz":
            raise ValueError(f"quiz_features needs family_c 'quiz', got {self.family_c!r}")
        if not 1 <= self.quiz_shown_in <= 40:
            raise ValueError(f"quiz_shown_in must be in [1, 40], got {self.quiz_shown_in}")
        if not 1 <= self.quiz_tiles <= TILES_PER_PAIR:
            raise ValueError(f"quiz_tiles must be in [1, {TILES_PER_PAIR}], got {self.quiz_tiles}")
        if self.quiz_shown_in > 4 * self.quiz_tiles:
            raise ValueError(f"quiz_shown_in > 4 x quiz_tiles: {self.quiz_shown_in}")
        if self.attn_aux_c < 0 or not 0 <= self.attn_aux_layer < 4:
            raise ValueError(f"need attn_aux_c >= 0 and attn_aux_layer in 0-3: {self}")
        if self.attn_aux_c and self.family_c == "crowd":
            raise ValueError("attn_aux_c needs a family_c that asks a corner (corners, quiz)")
        if (self.quiz_shown_in > 1 or self.quiz_tiles < TILES_PER_PAIR) and self.family_c != "quiz":
            raise ValueError(
                f"quiz_shown_in, quiz_tiles need family_c 'quiz', not {self.family_c!r}"
            )

    @property
    def quiz_curriculum(self) -> bool:
        """Phase C's quiz clips are a curriculum's (a feature subset, more needles or fewer
        tiles), not the family's own draws."""
        return (
            quiz_feature_set(self.quiz_features) is not None
            or self.quiz_shown_in > 1
            or self.quiz_tiles < TILES_PER_PAIR
        )

    def steps(self, phase: int) -> int:
        """Steps of `phase` (`PHASES`): A and B the squares, P the tower alone (phase P,
        `craft_world.tower_probe`), C the squares and the tile family `family_c`."""
        return (self.steps_a, self.steps_b, self.steps_c, self.steps_p)[phase]


PHASES = "ABCP"
"""Phase numbers 0-3 name A, B, C, P: they seed each phase's batches, so C's batches are the
same with or without a phase P. The phases RUN in the order `ORDER`."""
ORDER = (0, 1, 3, 2)
"""A, B, then P (the tower alone), then C (on the tower P left)."""
_AFTER_AB = (
    "steps_c",
    "crowd_share",
    "family_c",
    "freeze_vision_c",
    "steps_p",
    "caption_share_c",
    "quiz_features",
    "quiz_shown_in",
    "quiz_tiles",
    "attn_aux_c",
    "attn_aux_layer",
    "attn_aux_corner_heads",
    "mp4_c",
)
"""Recipe fields of the phases after A and B (a run may start from an A+B backbone)."""


class TestBank:
    """Held-out clips of `family` read from their mp4 files: `pixels[i]` is float16
    `[144, 1176]`, `questions[i]` clip i's questions."""

    def __init__(
        self, root: Path, n: int, seed: int, processor: Any, family: str = "squares"
    ) -> None:
        from craft_adapters import build_inputs, read_video

        make_clips(root, n, seed, split="test", family=family)
        if family in TILE_FAMILIES:
            tiles = (sample_tiles(family, seed, "test", i) for i in range(n))
            self.questions = [[crowd_question(t)] for t in tiles]
        else:
            scenes = [sample_scene(seed, "test", i) for i in range(n)]
            self.questions = [questions_for(s, seed, "test", i) for i, s in enumerate(scenes)]
        prefix = f"{family}_" if family in TILE_FAMILIES else ""
        pixels = []
        for i in range(n):
            video = read_video(root / "video" / VIDEO_FOLDER / f"{prefix}test_{i:06d}.mp4", fps=2.0)
            pixels.append(
                build_inputs(processor, video.frames, video.fps, "x")["pixel_values_videos"]
            )
        self.pixels = torch.stack(pixels)  # [n, 144, 1176]


def token_colours(scene: Scene) -> torch.Tensor:
    """Which colours each of the clip's 144 video tokens shows: float `[144, 6]` (0/1).

    Token order is Qwen2.5-VL's (temporal pair, patch row, patch column); a token shows a
    colour when the square covers any pixel of its 14 x 14 patch in either frame of its pair.
    """
    names = list(PALETTE)
    out = torch.zeros(FRAMES // 2, SIZE // 14, SIZE // 14, len(names))
    for k, colour in enumerate(scene.colours):
        for t in range(FRAMES):
            at = scene.position(k, t)
            if at is None:
                continue
            side = scene.sides[k]
            rows = slice(at[0] // 14, (at[0] + side - 1) // 14 + 1)
            cols = slice(at[1] // 14, (at[1] + side - 1) // 14 + 1)
            out[t // 2, rows, cols, names.index(colour)] = 1.0
    return out.reshape(-1, len(names))


class PromptCache:
    """Token ids of `prompt` (+ a dummy video of the world's grid) and of each target."""

    def __init__(self, processor: Any) -> None:
        self.processor, self.tok = processor, processor.tokenizer
        self.frames = np.zeros((FRAMES, SIZE, SIZE, 3), dtype=np.uint8)
        self._ids: dict[str, torch.Tensor] = {}
        self._types: dict[str, torch.Tensor] = {}

    def prompt(self, text: str) -> torch.Tensor:
        from craft_adapters import build_inputs

        if text not in self._ids:
            inputs = build_inputs(self.processor, self.frames, 2.0, text)
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

    def pixels(self, frames: np.ndarray) -> torch.Tensor:
        """The processor's `pixel_values_videos` of uint8 frames `[8, 84, 84, 3]`: `[144, 1176]`."""
        from craft_adapters import build_inputs

        return build_inputs(self.processor, frames, 2.0, "x")["pixel_values_videos"]


def through_mp4(frames: np.ndarray) -> np.ndarray:
    """`frames` uint8 `[8, 84, 84, 3]` as the evaluation sees them: written to an mp4 the way
    `make_clips` writes a clip (`write_mp4`), then read back the way `TestBank` and the
    evaluation read it (`read_video` at 2 fps); uint8 `[8, 84, 84, 3]`. The encoding moves
    a 6 px dot's colour (yuv420p halves the chroma): bb7 of docs/varying-question.md answered
    88.0% of 200 quiz clips in memory and 69.5% of the same clips through it."""
    import tempfile

    from craft_adapters import read_video

    with tempfile.TemporaryDirectory(prefix="craft-world-mp4-") as folder:
        path = Path(folder) / "clip.mp4"
        write_mp4(path, frames)
        return np.asarray(read_video(path, fps=float(FPS)).frames)


def training_scene(recipe: Recipe, phase: int, step: int, j: int) -> Scene:
    """Example `j` of `step` in `phase` (0 = A, 1 = B): a fresh scene, curriculum applied."""
    index = (phase * 10**8 + step) * recipe.batch + j  # disjoint across phases and steps
    ramp = recipe.curriculum * recipe.steps_a
    if phase == 0 and step < ramp:
        f = step / ramp  # 0 -> 1: big sides shrink to the final ones
        lo, hi = (round(b + (s - b) * f) for b, s in zip(recipe.big_sides, SQUARE_SIDES))
        return sample_scene(recipe.seed, "train", index, sides=(lo, hi), max_squares=2)
    return sample_scene(recipe.seed, "train", index, max_squares=MAX_SQUARES)


def sample_example(scene: Scene, rng: np.random.Generator) -> tuple[str, str]:
    """`(prompt, target)`: existence 2/5 (asked colour present 1/2), count 1/5, caption 2/5."""
    kind = rng.random()
    if kind < 0.4:
        present = rng.random() < 0.5
        pool = list(scene.colours) if present else [c for c in PALETTE if c not in scene.colours]
        prompt = mvbench_prompt(f"Is there a {rng.choice(pool)} square?", YES_NO)
        target = "A" if present else "B"
    elif kind < 0.6:
        prompt = mvbench_prompt("How many squares are there?", COUNT_OPTIONS)
        target = "ABC"[len(scene.colours) - 1]
    else:
        return CAPTION_PROMPT, scene.caption
    if rng.random() < 0.5:  # craft-train strips its prompts: learn both forms
        prompt = prompt.strip()
    return prompt, target


def training_example(
    recipe: Recipe,
    phase: int,
    step: int,
    j: int,
    rng: np.random.Generator,
    scenes: list[CrowdScene | None] | None = None,
) -> tuple[np.ndarray, torch.Tensor, tuple[str, str]]:
    """Example `j` of `step` in `phase`: frames `[8, 84, 84, 3]`, the colour labels of its
    tokens `[144, 6]` and `(prompt, target)`. In phase C (2) a share `crowd_share` of the
    examples are questions of the tile family `family_c`, the rest the first family's (as in
    phase B); of those, a share `caption_share_c` are the clip's caption (`tile_caption`)
    asked with the describe prompt (no draw when 0: the shipped recipe's batches). With
    `quiz_features` (a curriculum's stage) the quiz asks only those features, and with
    `quiz_shown_in` > 1 a "yes" clip shows the asked feature in `quiz_shown_in_at(step)`
    tiles (a needle curriculum: many at first, down to one), and with `quiz_tiles` < 10 a
    clip holds `quiz_tiles_at(step)` tiles a temporal pair (a clutter curriculum: few at
    first, up to the family's 10). `scenes`, when given, gets the example's tile scene
    appended when it is a tile question (None otherwise: `attn_aux_c` needs them)."""
    if scenes is not None:
        scenes.append(None)
    if phase == 2 and rng.random() < recipe.crowd_share:
        index = (phase * 10**8 + step) * recipe.batch + j
        if recipe.quiz_curriculum:
            per_pair = quiz_tiles_at(recipe, step)
            shown = min(quiz_shown_in_at(recipe, step), 4 * per_pair)
            subset = quiz_feature_set(recipe.quiz_features)
            crowd = sample_quiz(
                recipe.seed, "train", index, features=subset, shown_in=shown, per_pair=per_pair
            )
        else:
            crowd = sample_tiles(recipe.family_c, recipe.seed, "train", index)
        if recipe.caption_share_c and rng.random() < recipe.caption_share_c:
            caption = (CAPTION_PROMPT, tile_caption(crowd))
            return render_crowd(crowd), crowd_token_colours(crowd), caption
        if scenes is not None:
            scenes[-1] = crowd
        q = crowd_question(crowd)
        prompt = mvbench_prompt(q.question, q.candidates)
        if rng.random() < 0.5:
            prompt = prompt.strip()
        target = "AB"[q.candidates.index(q.answer)]
        return render_crowd(crowd), crowd_token_colours(crowd), (prompt, target)
    scene = training_scene(recipe, phase, step, j)
    return render(scene), token_colours(scene), sample_example(scene, rng)


def quiz_shown_in_at(recipe: Recipe, step: int) -> int:
    """Tiles a "yes" quiz clip of phase C's step `step` shows the asked feature in:
    `quiz_shown_in` at step 0, linearly down to 1 at half the phase, then 1."""
    half = max(1, recipe.steps_c // 2)
    return max(1, round(recipe.quiz_shown_in - (recipe.quiz_shown_in - 1) * step / half))


def quiz_tiles_at(recipe: Recipe, step: int) -> int:
    """Tiles a temporal pair of a quiz clip of phase C's step `step`: `quiz_tiles` at step
    0, linearly up to the family's 10 at half the phase, then 10."""
    half = max(1, recipe.steps_c // 2)
    grown = recipe.quiz_tiles + (TILES_PER_PAIR - recipe.quiz_tiles) * step / half
    return min(TILES_PER_PAIR, round(grown))


def make_batch(
    cache: PromptCache, pixels: torch.Tensor, examples: list[tuple[str, str]], pad: int
) -> dict[str, torch.Tensor]:
    """Right-padded inputs with labels on the target tokens only; `pixels` `[B, 144, 1176]`."""
    seqs, labels, types = [], [], []
    for prompt, target in examples:
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
        ids[row, : len(s)], lab[row, : len(s)], mask[row, : len(s)], mm[row, : len(s)] = s, y, 1, m
    n = len(examples)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "mm_token_type_ids": mm,
        "labels": lab,
        "pixel_values_videos": pixels.flatten(0, 1).float(),
        "video_grid_thw": torch.tensor([[FRAMES // 2, SIZE // 14, SIZE // 14]]).repeat(n, 1),
        "second_per_grid_ts": torch.ones(n),
    }


@torch.no_grad()
def heldout_accuracy(
    model: Any, bank: TestBank, cache: PromptCache, pad: int, clips: int | None = None
) -> dict[str, float]:
    """Accuracy per task on the first `clips` clips' questions: argmax over the option letters."""
    model.eval()
    hits: dict[str, list[bool]] = {}
    letters = [cache.tok.convert_tokens_to_ids(c) for c in "ABC"]
    for i, questions in enumerate(bank.questions[:clips]):
        for q in questions:
            prompt = mvbench_prompt(q.question, q.candidates)
            batch = make_batch(cache, bank.pixels[i : i + 1], [(prompt, "A")], pad)
            batch.pop("labels")
            n = len(cache.prompt(prompt))
            logits = model(**batch).logits[0, n - 1, letters[: len(q.candidates)]]
            hits.setdefault(q.task, []).append(int(logits.argmax()) == q.candidates.index(q.answer))
    model.train()
    out = {k: float(np.mean(v)) for k, v in hits.items()}
    out["all"] = float(np.mean([h for v in hits.values() for h in v]))
    return out


def _banks_accuracy(
    model: Any, banks: dict[str, TestBank], cache: PromptCache, pad: int, clips: int
) -> dict[str, float]:
    """`heldout_accuracy` of the first family; a tile family's beside it where tested."""
    acc = heldout_accuracy(model, banks["squares"], cache, pad, clips)
    for family in TILE_FAMILIES:
        if family in banks:
            acc[family] = heldout_accuracy(model, banks[family], cache, pad, clips)["all"]
    return acc


def _check_phase_ab(folder: Path, recipe: Recipe) -> None:
    """ValueError unless `folder` holds a backbone that phases A and B of `recipe` made (its
    `world_recipe.json` agrees on every field but those of the later phases)."""
    if not (folder / "world_recipe.json").is_file():
        raise ValueError(f"start_from: {folder} holds no world_recipe.json (not a saved backbone)")
    made = json.loads((folder / "world_recipe.json").read_text())
    ours = asdict(recipe)
    differ = [
        k
        for k in ours
        if k not in _AFTER_AB
        and made.get(k) != ours[k]
        and not (isinstance(ours[k], tuple) and made.get(k) == list(ours[k]))
    ]
    if differ:
        raise ValueError(f"{folder} was not made by phases A and B of this recipe: {differ}")


def _start_after_ab(folder: Path, recipe: Recipe, model: Any) -> int:
    """Load into `model` the weights of the backbone of phases A and B in `folder`
    (`_check_phase_ab`); returns the phase after B (P)."""
    from transformers import AutoModelForImageTextToText

    _check_phase_ab(folder, recipe)
    trained = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    model.load_state_dict(trained.state_dict())
    print(f"phases P and C start from {folder}", flush=True)
    return ORDER[2]


def _reached(phase: int, step: int, stop_at: tuple[int, int]) -> bool:
    """Whether step `step` of `phase` is at or past `stop_at` (phase, step), in run order."""
    return (ORDER.index(phase), step) >= (ORDER.index(stop_at[0]), stop_at[1])


def _next_phase(phase: int) -> int | None:
    """The phase that runs after `phase` (`ORDER`); None after the last."""
    at = ORDER.index(phase) + 1
    return ORDER[at] if at < len(ORDER) else None


def _lr(step: int, steps: int, lr: float) -> float:
    warmup = max(1, steps // 20)
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def _optimizer(params: list[torch.nn.Parameter], lr: float) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=0.01)


def train_backbone(
    work: Path,
    out: Path,
    recipe: Recipe = Recipe(),
    *,
    save_every: int = 100,
    eval_every: int = 250,
    eval_clips: int = 50,
    final_clips: int = 300,
    stop_at: tuple[int, int] | None = None,
    start_from: Path | None = None,
) -> dict[str, float]:
    """Train (or resume) the backbone; save it with its processor in `out`; return accuracy.

    `eval_clips` clips are scored every `eval_every` steps, `final_clips` at the end.
    `stop_at=(phase, step)`: return there without saving the model (what a kill leaves
    behind: the last `state.pt`), for testing the resume. `start_from`: a backbone folder
    saved by phases A and B of this recipe (its `world_recipe.json` says so): without a
    `state.pt`, phases P and C start from its weights instead of retraining A and B.
    """
    torch.set_num_threads(1)
    if start_from is not None:
        _check_phase_ab(start_from, recipe)  # before anything is written
    processor, pad, banks, cache = _setup(work, recipe, max(eval_clips, final_clips))
    model, probes, captured = _model_and_probes(recipe.seed)
    state_path, log_path = work / "state.pt", work / "log.jsonl"
    phase, step, opt_state = _resume(state_path, recipe, model, probes)
    if (phase, step) == (0, 0) and start_from is not None:
        phase = _start_after_ab(start_from, recipe, model)
    opt = _enter_phase(model, probes, recipe, phase)
    if opt_state is not None:
        opt.load_state_dict(opt_state)
    t0 = time.perf_counter()
    while True:
        steps = recipe.steps(phase)
        if step >= steps:  # phase done: the next starts from its weights, fresh optimiser
            following = _next_phase(phase)
            if following is None:
                break
            phase, step = following, 0
            opt = _enter_phase(model, probes, recipe, phase)
            continue
        row = _step(model, probes, captured, opt, cache, pad, recipe, phase, step)
        step += 1
        if phase != ORDER[2] and (step % eval_every == 0 or step == steps):
            row["heldout"] = _banks_accuracy(model, banks, cache, pad, eval_clips)
        if step % save_every == 0 or step == steps:
            _save_state(state_path, recipe, (model, probes, opt), phase, step)
        if step % 20 == 0 or step == steps or "heldout" in row:
            _log(log_path, {**row, "s": round(time.perf_counter() - t0, 1)})
        if stop_at is not None and _reached(phase, step, stop_at):
            return {}
    acc = _banks_accuracy(model, banks, cache, pad, final_clips)
    _save_backbone(out, model, processor, log_path, recipe, acc, final_clips, start_from)
    return acc


def _step(
    model: Any,
    probes: torch.nn.ModuleDict,
    captured: list[torch.Tensor],
    opt: torch.optim.Optimizer,
    cache: PromptCache,
    pad: int,
    recipe: Recipe,
    phase: int,
    step: int,
) -> dict[str, Any]:
    """Train step `step` of `phase` at its scheduled learning rate; its log row."""
    steps = recipe.steps(phase)
    if phase == ORDER[2]:  # P: the tower alone, through the corner probe
        for group in opt.param_groups:
            group["lr"] = probe_lr(step, steps, recipe.lr)
        loss, exact = probe_step(
            model.model.visual, probes["corner"], opt, cache.pixels, recipe.seed, recipe.batch, step
        )
        captured.clear()  # the colour hook saw the tower's output: drop it and its graph
        return {"phase": "P", "step": step + 1, "loss": round(loss, 5), "exact": round(exact, 4)}
    for group in opt.param_groups:
        group["lr"] = _lr(step, steps, recipe.lr)
    loss, aux, attn = _train_step(
        (model, probes["colour"], captured, opt), cache, pad, recipe, phase, step
    )
    row = {"phase": PHASES[phase], "step": step + 1, "loss": round(loss, 5)}
    if phase == 2 and recipe.attn_aux_c > 0:
        row["attn"] = round(attn, 5)
    return {**row, "aux": round(aux, 5)}


def _setup(
    work: Path, recipe: Recipe, clips: int
) -> tuple[Any, int, dict[str, TestBank], PromptCache]:
    """`work` created; the world's processor, its pad id, the held-out banks of `clips` clips
    and the prompt cache."""
    work.mkdir(parents=True, exist_ok=True)
    processor = world_processor()
    banks = _test_banks(work, recipe, processor, clips)
    return processor, int(processor.tokenizer.pad_token_id), banks, PromptCache(processor)


def _enter_phase(
    model: Any, probes: torch.nn.ModuleDict, recipe: Recipe, phase: int
) -> torch.optim.AdamW:
    """What trains in `phase`, and its fresh optimiser. A, B, C: the model and the colour
    probe, except the vision tower in C when `freeze_vision_c` (it keeps the features B or P
    gave it: a tower trained on the tile question makes the asked feature an outlier of the
    token set, which any diversity selection then keeps; measured: DivPrune 96.8% at 8x vs
    97.7% uncompressed). P: the vision tower and the corner probe only."""
    visual = model.model.visual
    if phase == ORDER[2]:
        model.requires_grad_(False)
        visual.requires_grad_(True)
        return _optimizer([*visual.parameters(), *probes["corner"].parameters()], recipe.lr)
    model.requires_grad_(True)
    visual.requires_grad_(not (phase == 2 and recipe.freeze_vision_c))
    if phase == 2 and recipe.attn_aux_c > 0:  # the attention loss reads the weights
        model.set_attn_implementation({"text_config": "eager"})
    return _optimizer([*model.parameters(), *probes["colour"].parameters()], recipe.lr)


def _test_banks(work: Path, recipe: Recipe, processor: Any, clips: int) -> dict[str, TestBank]:
    """The held-out banks of `clips` clips: the squares, and `family_c` when phase C trains."""
    banks = {"squares": TestBank(work / "test", clips, recipe.seed, processor)}
    if recipe.steps_c:
        family = recipe.family_c
        banks[family] = TestBank(work / f"test-{family}", clips, recipe.seed, processor, family)
    return banks


def _log(log_path: Path, row: dict[str, Any]) -> None:
    """One row of the training log: appended to `log_path` and printed."""
    with log_path.open("a") as handle:
        handle.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def _model_and_probes(seed: int) -> tuple[Any, torch.nn.ModuleDict, list[torch.Tensor]]:
    """A fresh backbone in training mode; its probes on the projector's output, "colour"
    (hidden size -> 6 colours, phases A-C) and "corner" (-> 24 colour x corner features,
    phase P); and the list the vision tower's output is captured into (`pooler_output`
    [B * 144, hidden] per forward)."""
    model = new_backbone(seed)
    model.train()
    hidden = int(model.config.get_text_config().hidden_size)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        colour = torch.nn.Linear(hidden, len(PALETTE))
    probes = torch.nn.ModuleDict({"colour": colour, "corner": new_corner_probe(hidden, seed)})
    captured: list[torch.Tensor] = []
    model.model.visual.register_forward_hook(
        lambda mod, args, out: captured.append(out.pooler_output)
    )
    return model, probes, captured


def _train_step(
    parts: tuple[Any, torch.nn.Module, list[torch.Tensor], torch.optim.Optimizer],
    cache: PromptCache,
    pad: int,
    recipe: Recipe,
    phase: int,
    step: int,
) -> tuple[float, float, float]:
    """One optimiser step on batch `step` of `phase` (a pure function of them and the seed):
    answer cross-entropy plus the colour probe's loss (plus, with `attn_aux_c` in phase C,
    the attention loss). `parts`: model, probe, the captured vision outputs and the
    optimiser (its parameters are the trained ones). Returns (loss, aux loss, attention loss:
    NaN when none)."""
    model, probe, captured, opt = parts
    params = [p for group in opt.param_groups for p in group["params"]]
    rng = np.random.default_rng([recipe.seed, 7, phase, step])
    attend = phase == 2 and recipe.attn_aux_c > 0
    attn_loss = float("nan")  # the attention loss (`_attention_aux`), for the log
    scenes: list[CrowdScene | None] | None = [] if attend else None
    drawn = [training_example(recipe, phase, step, j, rng, scenes) for j in range(recipe.batch)]
    encode = phase == 2 and recipe.mp4_c  # phase C on the frames the evaluation decodes
    pixels = torch.stack([cache.pixels(through_mp4(f) if encode else f) for f, _, _ in drawn])
    captured.clear()
    batch = make_batch(cache, pixels, [ex for _, _, ex in drawn], pad)
    out = model(**batch, output_attentions=True) if attend else model(**batch)
    loss = out.loss
    labels = torch.cat([colours for _, colours, _ in drawn])  # [B * 144, 6]
    aux = torch.nn.functional.binary_cross_entropy_with_logits(probe(captured[0]), labels)
    total = loss + recipe.aux_weight * aux
    if attend and scenes is not None:
        prompts = [ex[0] for _, _, ex in drawn]
        attn = _attention_aux(
            out.attentions[recipe.attn_aux_layer],
            batch,
            cache,
            prompts,
            scenes,
            recipe.attn_aux_corner_heads,
        )
        if attn is not None:
            total = total + recipe.attn_aux_c * attn
            attn_loss = attn.item()
    total.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item(), aux.item(), attn_loss


def _attention_aux(
    attentions: torch.Tensor,
    batch: dict[str, torch.Tensor],
    cache: PromptCache,
    prompts: list[str],
    scenes: list[CrowdScene | None],
    corner_heads: bool = False,
) -> torch.Tensor | None:
    """The attention loss of `Recipe.attn_aux_c` (None without a tile question in the
    batch): at the last prompt position (the one that predicts the answer's letter), head 0
    of the layer `attentions` `[B, heads, L, L]` puts its mass on the video tokens that show
    the asked feature in a "yes" clip (-log of that mass), and off the video in a "no" clip
    (-log of the mass left elsewhere). A teacher for the question's query: which tokens it
    must find (issue 54; the answer alone left the language model at chance). With
    `corner_heads`, head k (k = the asked corner, 0-3) is taught instead of head 0: its query
    then needs only the asked colour (as the squares' "Is there a red square?"), and the
    corner picks the head the answer reads."""
    video = cache.tok.convert_tokens_to_ids("<|video_pad|>")
    terms = []
    for row, scene in enumerate(scenes):
        if scene is None or scene.corner is None:
            continue
        at = len(cache.prompt(prompts[row])) - 1
        head = scene.corner if corner_heads else 0
        on_video = attentions[row, head, at][batch["input_ids"][row] == video]  # [144]
        if scene.present:
            shows = corner_labels(scene)[:, asked_feature(scene)] > 0
            terms.append(-torch.log(on_video[shows].sum() + 1e-6))
        else:
            terms.append(-torch.log((1 - on_video.sum()).clamp_min(0) + 1e-6))
    return torch.stack(terms).mean() if terms else None


def _resume(
    path: Path, recipe: Recipe, model: Any, probes: torch.nn.Module
) -> tuple[int, int, dict[str, Any] | None]:
    """(phase, step, optimiser state) of the state saved at `path`, the weights loaded into
    the modules; (0, 0, None) without one. A state of another recipe is refused, and so is a
    file holding anything but tensors and plain values: unpickling other objects can run
    code (`weights_only=True`)."""
    if not path.is_file():
        return 0, 0, None
    try:
        state = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(
            f"{path} holds Python objects other than tensors and plain values, which could run "
            "code when loaded; refused. train_backbone never writes such a file: delete it to "
            "start afresh, or resume only from a state you trust"
        ) from err
    if state["recipe"] != asdict(recipe):
        raise ValueError(f"{path} is of another recipe: {state['recipe']}")
    model.load_state_dict(state["model"])
    probes.load_state_dict(state["probes"])
    phase, step = int(state["phase"]), int(state["step"])
    print(f"resumed at phase {PHASES[phase]} step {step}", flush=True)
    return phase, step, state["optimizer"]


def _save_state(
    path: Path, recipe: Recipe, parts: tuple[Any, torch.nn.Module, Any], phase: int, step: int
) -> None:
    """Write the resume state (`parts`: model, probes, the phase's optimiser) atomically: a
    kill mid-write leaves the previous one."""
    model, probes, opt = parts
    state = {"model": model.state_dict(), "probes": probes.state_dict()}
    state |= {"optimizer": opt.state_dict(), "phase": phase, "step": step}
    tmp = path.with_suffix(".tmp")
    torch.save({"recipe": asdict(recipe), **state}, tmp)
    tmp.replace(path)


def _save_backbone(
    out: Path,
    model: Any,
    processor: Any,
    log_path: Path,
    recipe: Recipe,
    acc: dict[str, float],
    final_clips: int,
    start_from: Path | None = None,
) -> None:
    """The trained model, its processor, the training log and `world_recipe.json` in `out`
    (with `started_from`: the `world_recipe.json` of `start_from`, the backbone phase P
    started from, so a chain of phase-C runs says what it was made of)."""
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    if log_path.is_file():
        (out / "train_log.jsonl").write_text(log_path.read_text())
    record = {
        **asdict(recipe),
        "fresh_clips_per_step": True,
        "heldout_accuracy": acc,
        "heldout_questions": 2 * final_clips,
        "torch": torch.__version__,
    }
    if start_from is not None:
        record["started_from"] = json.loads((start_from / "world_recipe.json").read_text())
    (out / "world_recipe.json").write_text(json.dumps(record, indent=1))


def _parser() -> argparse.ArgumentParser:
    """The command line: every recipe field, its default the shipped recipe's."""
    parser = argparse.ArgumentParser(
        prog="python -m craft_world.train_backbone", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--work", required=True, help="folder of test clips, state.pt, log.jsonl")
    parser.add_argument("--out", required=True, help="folder the trained model is saved to")
    defaults = Recipe()
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--steps-a", type=int, default=defaults.steps_a, help="phase A steps")
    parser.add_argument("--steps-b", type=int, default=defaults.steps_b, help="phase B steps")
    parser.add_argument("--steps-c", type=int, default=defaults.steps_c, help="phase C steps")
    parser.add_argument(
        "--steps-p",
        type=int,
        default=defaults.steps_p,
        help="phase P steps (the vision tower alone, before C; craft_world.tower_probe)",
    )
    parser.add_argument(
        "--crowd-share",
        type=float,
        default=defaults.crowd_share,
        help="phase C's share of tile-family examples",
    )
    parser.add_argument(
        "--caption-share-c",
        type=float,
        default=defaults.caption_share_c,
        help="share of phase C's tile-family examples that are the clip's caption",
    )
    _add_quiz_options(parser, defaults)
    parser.add_argument(
        "--family-c",
        choices=tuple(TILE_FAMILIES),
        default=defaults.family_c,
        help="phase C's tile family (craft_world.crowd)",
    )
    parser.add_argument(
        "--freeze-vision-c",
        action=argparse.BooleanOptionalAction,
        default=defaults.freeze_vision_c,
        help="phase C trains the language model only (the vision tower frozen)",
    )
    parser.add_argument(
        "--start-from",
        default=None,
        help="a backbone of phases A+B of this recipe: start at P (or C)",
    )
    parser.add_argument("--batch", type=int, default=defaults.batch)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--final-clips", type=int, default=300, help="held-out clips at the end")
    return parser


def _add_quiz_options(parser: argparse.ArgumentParser, defaults: Recipe) -> None:
    """Phase C's options for the quiz family: its curricula and the attention teacher."""
    parser.add_argument(
        "--quiz-features",
        default=defaults.quiz_features,
        help="phase C on the quiz asks only these features: comma-separated colour:corner, "
        "* for any ('*:top-left', 'red:*'); '' all 24 (craft_world.crowd.quiz_feature_set)",
    )
    parser.add_argument(
        "--quiz-shown-in",
        type=int,
        default=defaults.quiz_shown_in,
        help="phase C on the quiz: a 'yes' clip shows the asked feature in this many tiles "
        "at first, linearly down to 1 at half the phase (1: the family's clips)",
    )
    parser.add_argument(
        "--quiz-tiles",
        type=int,
        default=defaults.quiz_tiles,
        help="phase C on the quiz: tiles a temporal pair at first, linearly up to 10 at half "
        "the phase (10: the family's clips)",
    )
    parser.add_argument(
        "--attn-aux-c",
        type=float,
        default=defaults.attn_aux_c,
        help="phase C: weight of the attention loss (head 0 of --attn-aux-layer at the answer "
        "position on the asked feature's tokens; 0: none)",
    )
    parser.add_argument("--attn-aux-layer", type=int, default=defaults.attn_aux_layer)
    parser.add_argument(
        "--attn-aux-corner-heads",
        action=argparse.BooleanOptionalAction,
        default=defaults.attn_aux_corner_heads,
        help="the attention loss teaches head k (k: the asked corner) instead of head 0",
    )
    parser.add_argument(
        "--mp4-c",
        action=argparse.BooleanOptionalAction,
        default=defaults.mp4_c,
        help="phase C trains on its frames written to mp4 and decoded, as the evaluation "
        "reads them (through_mp4; off: rendered in memory, the shipped recipe)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        recipe = Recipe(
            seed=args.seed,
            steps_a=args.steps_a,
            steps_b=args.steps_b,
            steps_c=args.steps_c,
            steps_p=args.steps_p,
            crowd_share=args.crowd_share,
            family_c=args.family_c,
            caption_share_c=args.caption_share_c,
            quiz_features=args.quiz_features,
            quiz_shown_in=args.quiz_shown_in,
            quiz_tiles=args.quiz_tiles,
            attn_aux_c=args.attn_aux_c,
            attn_aux_layer=args.attn_aux_layer,
            attn_aux_corner_heads=args.attn_aux_corner_heads,
            mp4_c=args.mp4_c,
            freeze_vision_c=args.freeze_vision_c,
            batch=args.batch,
            lr=args.lr,
        )
        if args.final_clips <= 0:
            raise ValueError(f"final_clips must be positive, got {args.final_clips}")
        start = None if args.start_from is None else Path(args.start_from)
        acc = train_backbone(
            Path(args.work), Path(args.out), recipe, final_clips=args.final_clips, start_from=start
        )
    except ValueError as err:
        parser.error(str(err))
    print(f"held-out accuracy {acc}; saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
