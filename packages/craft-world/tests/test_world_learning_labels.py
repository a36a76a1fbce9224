"""The world's merge module learns from LABELS (opt-in; the learning test in CI is
`test_world_learning.py`, first-token distillation): craft-train's stage 2
as the world recipe runs it (`craft_world.recipe.STAGE2`: labels of the corners family, a
fixed 16x, lr 3e-4 constant after a 2% warm-up), shortened, from the untrained module on the
shipped frozen backbone, lowers the held-out first-token KL to the uncompressed model at 8x
and 16x by >= 3 paired SE; the same run on frozen random targets (each clip's answer redrawn
once, independent of the clip: nothing to learn) must not, and the trained run must beat it
by >= 3 paired SE. Both runs are the `craft-train stage2` command a user types, in two
processes side by side (one CPU core each); each step's 16 questions are one micro-batch, so
their videos go through the compressor in ONE `compress_many` call (craft-core 1.1); the
held-out KLs are computed in batches of clips, in two processes.

Measured (one run each, 2 cores shared with other jobs, load ~9; craft-world's
docs/learning.md): the batched held-out KLs equal the per-clip ones bit for bit and take
1/6.2 of their time; a step of 16 questions as one micro-batch took 2.4 s against 11.3 s as
16 micro-batches (4.7x; the two runs' KL drops agree to 1e-7). Where a batched step goes:
decoding the 16 mp4 files 21%, the rest of the inputs 13%, compress_many 22%, the vision
tower and LM forward 19%, backward 24%.

NOT YET SIZED, so still opt-in (`CRAFT_WORLD_LEARNING=1`): the size below (the recipe's
300 steps on 1,000 clips, 300 held-out) was not yet run to the end on several seeds (runs
of 300 steps took 20-25 s a step with three side by side on the loaded machine), nor seen
to fail with a planted fault (seed 0 alone, this size: 5.0 / 4.3 SE at 8x / 16x, control
0.1 / 0.0 SE; 100 steps at lr 1e-3: 1.2 / 1.3 SE, no learning). The recipe's full stage 2
(300 steps, 3,000 clips, 600 held-out clips: the shipped module, bit for bit) is
craft-train's `tests/test_world_learning.py` (opt-in, the same variable).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import random
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

torch.set_num_threads(1)

pytestmark = pytest.mark.skipif(
    os.environ.get("CRAFT_WORLD_LEARNING") != "1",
    reason="not yet sized to 3 minutes on 2 cores (issue 54, part 3); CRAFT_WORLD_LEARNING=1 runs it",
)

TRAIN_CLIPS, HELDOUT = 1000, 300
STEPS, BATCH = 300, 16  # optimizer steps; questions a step (one micro-batch)
RATIOS = (8.0, 16.0)  # measured at; trained at STAGE2's fixed 16x
EVAL_BATCH = 32  # held-out clips a forward


def _config(root: Path, manifest: Path, out: Path, fresh: Path, seed: int = 0) -> Path:
    from craft_world.recipe import STAGE2, craft_train_config

    optim = {**STAGE2["optim"], "max_steps": STEPS, "per_device_batch_size": BATCH,
             "grad_accum": 1}  # fmt: skip
    cfg = craft_train_config(manifest, out, stage=2, init_from=fresh, seed=seed,
                             optim=optim, budget=STAGE2["budget"])  # fmt: skip
    cfg["train"]["save_steps"] = STEPS
    path = root / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _random_targets(manifest: Path, out: Path, seed: int = 1) -> Path:
    """The manifest with every answer redrawn at random, once: targets that carry nothing
    about the clip."""
    rng = random.Random(seed)
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    for row in rows:
        row["answer"] = rng.choice(["A", "B"])
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def _make_clips(args: tuple[Path, int, str]) -> Path:
    from craft_world import make_clips

    folder, n, split = args
    return make_clips(folder, n, seed=0, split=split, family="corners")


def _first_token_kl(
    modules: dict[str, Path], heldout: Path, part: int = 0, parts: int = 1
) -> dict[tuple[str, float], list[float]]:
    """KL(uncompressed || compressed) of the first answer token per held-out clip (clips `i`
    with `i % parts == part`), for each module (name -> a run folder holding `craft/`) at 8x
    and 16x. Clips go EVAL_BATCH at a time through the model (prompts of one length share a
    batch: no padding, and the answer's first token sits `tail` positions from the end in
    every row); the uncompressed model runs once per batch. Every list is in one order."""
    from craft_core import CraftCompressor, TokenBudget
    from craft_train.config import load_config
    from craft_train.data import VideoTextDataset, collate
    from craft_train.inputs import make_encoder
    from craft_train.model import build_model
    from craft_train.trainer import load_examples
    from craft_world.recipe import STAGE2, craft_train_config

    first = next(iter(modules.values()))
    cfg = load_config(data=craft_train_config(heldout, heldout.parent / "unused", stage=2,
                                              init_from=first, **STAGE2))  # fmt: skip
    bundle = build_model(cfg)
    states = {
        n: CraftCompressor.from_pretrained(d / "craft").state_dict() for n, d in modules.items()
    }
    data = VideoTextDataset(load_examples(cfg), make_encoder(cfg, bundle.processor))
    by_length: dict[int, list[dict[str, Any]]] = {}
    for i in range(part, len(data), parts):
        item = data[i]
        by_length.setdefault(int(item["input_ids"].shape[-1]), []).append(item)
    kls: dict[tuple[str, float], list[float]] = {(n, r): [] for n in modules for r in RATIOS}
    with torch.no_grad():
        for _, items in sorted(by_length.items()):
            for start in range(0, len(items), EVAL_BATCH):
                batch = collate(items[start : start + EVAL_BATCH], bundle.pad_token_id)
                batch.pop("skipped_videos")
                labels = batch.pop("labels")
                # the answer's first token is predicted `tail` positions from the end, in the
                # compressed sequence as in the full one (only video tokens are removed)
                tails = {labels.shape[1] - int((row != -100).nonzero()[0]) + 1 for row in labels}
                assert len(tails) == 1, tails
                tail = tails.pop()
                full = bundle.backbone(**batch).logits[:, -tail].double().log_softmax(-1)
                for name, state in states.items():
                    bundle.compressor.load_state_dict(state)
                    for ratio in RATIOS:
                        bundle.set_budget(TokenBudget(ratio=ratio))
                        short = bundle.model(**batch).logits[:, -tail].double().log_softmax(-1)
                        kl = (full.exp() * (full - short)).sum(-1)
                        kls[name, ratio].extend(kl.tolist())
    return kls


def _paired(before: list[float], after: list[float]) -> tuple[float, float]:
    """Mean KL drop (before - after) and its standard error over the same clips."""
    d = [b - a for b, a in zip(before, after, strict=True)]
    mean = sum(d) / len(d)
    var = sum((x - mean) ** 2 for x in d) / (len(d) - 1)
    return mean, math.sqrt(var / len(d))


def _pool() -> ProcessPoolExecutor:
    return ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork"))


def _in_two_processes(
    modules: dict[str, Path], heldout: Path
) -> dict[tuple[str, float], list[float]]:
    """`_first_token_kl` of the even and the odd clips in two forked processes (one core
    each), joined back into one list per key (the pairing over clips only needs the same
    order in every list)."""
    with _pool() as pool:
        halves = list(pool.map(_first_token_kl, [modules] * 2, [heldout] * 2, [0, 1], [2, 2]))
    return {key: halves[0][key] + halves[1][key] for key in halves[0]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from craft_world.recipe import save_untrained_module

    root = tmp_path_factory.mktemp("world-learning")
    with _pool() as pool:  # the training and the held-out clips, one process each
        train, test = pool.map(
            _make_clips, [(root / "train", TRAIN_CLIPS, "craft"), (root / "test", HELDOUT, "test")]
        )
    fresh = save_untrained_module(root / "fresh")
    manifests = {"trained": train / "qa.jsonl",
                 "control": _random_targets(train / "qa.jsonl", train / "qa-random.jsonl")}  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": ""}
    # output to files, not pipes: a full pipe would stall a run that the other one waits on
    logs = {name: (root / f"{name}.log").open("w") for name in manifests}
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "craft_train.cli", "stage2", "--config",
             str(_config(root, manifest, root / name, fresh))],
            env=env, stdout=logs[name], stderr=subprocess.STDOUT,
        )
        for name, manifest in manifests.items()
    }  # fmt: skip
    for name, proc in procs.items():
        proc.wait(timeout=1800)
        logs[name].close()
        output = (root / f"{name}.log").read_text()
        assert proc.returncode == 0, f"{name}: {output[-3000:]}"
    return {"root": root, "heldout": test / "qa.jsonl", "fresh": fresh}


def test_stage2_lowers_heldout_kl_and_random_targets_do_not(runs: dict[str, Any]) -> None:
    root = runs["root"]
    modules = {"untrained": runs["fresh"], "trained": root / "trained", "control": root / "control"}
    kls = _in_two_processes(modules, runs["heldout"])
    for ratio in RATIOS:
        before = kls["untrained", ratio]
        assert len(before) == HELDOUT
        drop, se = _paired(before, kls["trained", ratio])
        control_drop, control_se = _paired(before, kls["control", ratio])
        beats, beats_se = _paired(kls["control", ratio], kls["trained", ratio])
        print(f"KL at {ratio:g}x on {len(before)} held-out clips: untrained "
              f"{sum(before) / len(before):.3f}, trained drop {drop:+.3f} +- {se:.3f} "
              f"({drop / se:.1f} SE), control drop {control_drop:+.3f} +- {control_se:.3f} "
              f"({control_drop / control_se:.1f} SE), trained vs control {beats:+.3f} +- "
              f"{beats_se:.3f} ({beats / beats_se:.1f} SE)", flush=True)  # fmt: skip
        assert drop >= 3 * se, (ratio, drop, se)
        assert control_drop < 3 * control_se, (ratio, control_drop, control_se)
        assert beats >= 3 * beats_se, (ratio, beats, beats_se)
