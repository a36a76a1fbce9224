"""Learning in craft-world's corners family (issue 44): `craft-train stage2` as the world
recipe runs it (`craft_world.recipe.STAGE2`: 300 steps x 16 questions at a fixed 16x, 3,000
clips of split "craft"), from the untrained merge module on the shipped frozen backbone,
lowers the held-out first-token KL to the uncompressed model (600 clips of split "test") at
8x and 16x by >= 3 paired SE; the same run on frozen random targets (each clip's answer
redrawn once, independent of the clip) must not: it is the planted fault the first
assertion has to catch. Both runs are the `craft-train` command a user types, in two
processes side by side (one CPU core each); the held-out KLs are computed in two processes
too.

Measured (2 quiet cores, 9 min 50 s in all): KL drop 1.327 +- 0.143 at 8x and 1.987 +-
0.186 at 16x (9.3 and 10.7 SE); random targets -0.133 +- 0.115 and -0.191 +- 0.156. Its
trained run is the world's shipped module, bit for bit.

Not in CI: it takes about 10 minutes on 2 cores, and no shorter run learns reliably
(measured, the same loop in one process, 300 held-out clips, KL drop in paired SE at 8x /
16x): the recipe's learning rate reached 0.0 / -2.2 SE after 200 steps with data-order seed
1 (4.0 / 2.8 with seed 0), 3.1 / 2.3 after 300; lr 1e-3 reached 2.1 to 3.8 / 0.7 to 2.2
after 250 steps (seeds 0, 1); distilling the first token (lr 3e-4, 16 a step) 2.1 / 1.8
after 150 steps; 4 questions a step 1.4 / 0.1 after 300. A step of 16 questions takes about
1.4 s on one core, so a run of 3 minutes holds about 120 steps. `CRAFT_WORLD_LEARNING=1`
runs it.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

torch.set_num_threads(1)

pytestmark = pytest.mark.skipif(
    os.environ.get("CRAFT_WORLD_LEARNING") != "1",
    reason="about 10 minutes on 2 cores; CRAFT_WORLD_LEARNING=1 runs it",
)

TRAIN_CLIPS, HELDOUT = 3000, 600
RATIOS = (8.0, 16.0)  # measured at; trained at STAGE2's fixed 16x


def _config(root: Path, manifest: Path, out: Path, fresh: Path) -> Path:
    from craft_world.recipe import STAGE2, craft_train_config

    cfg = craft_train_config(manifest, out, stage=2, init_from=fresh, **STAGE2)
    cfg["train"]["save_steps"] = STAGE2["optim"]["max_steps"]
    path = root / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _random_targets(manifest: Path, out: Path) -> Path:
    """The manifest with every answer redrawn at random, once (seed 1): targets that carry
    nothing about the clip."""
    rng = random.Random(1)
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    for row in rows:
        row["answer"] = rng.choice(["A", "B"])
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def _first_token_kl(
    modules: dict[str, Path], heldout: Path, part: int = 0, parts: int = 1
) -> dict[tuple[str, float], list[float]]:
    """KL(uncompressed || compressed) of the first answer token per held-out clip (clips `i`
    with `i % parts == part`, in order), for each module (name -> a run folder holding
    `craft/`) at 8x and 16x; the uncompressed model runs once per clip."""
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
    kls: dict[tuple[str, float], list[float]] = {(n, r): [] for n in modules for r in RATIOS}
    with torch.no_grad():
        for i in range(part, len(data), parts):
            batch = collate([data[i]], pad_token_id=bundle.pad_token_id)
            batch.pop("skipped_videos")
            labels = batch.pop("labels")[0]
            # the answer's first token is predicted `tail` positions from the end, in the
            # compressed sequence as in the full one (only video tokens are removed)
            tail = labels.numel() - int((labels != -100).nonzero()[0]) + 1
            full = bundle.backbone(**batch).logits[0, -tail].double().log_softmax(-1)
            for name, state in states.items():
                bundle.compressor.load_state_dict(state)
                for ratio in RATIOS:
                    bundle.set_budget(TokenBudget(ratio=ratio))
                    short = bundle.model(**batch).logits[0, -tail].double().log_softmax(-1)
                    kls[name, ratio].append(float((full.exp() * (full - short)).sum()))
    return kls


def _paired(before: list[float], after: list[float]) -> tuple[float, float]:
    """Mean KL drop (before - after) and its standard error over the same clips."""
    d = [b - a for b, a in zip(before, after)]
    mean = sum(d) / len(d)
    var = sum((x - mean) ** 2 for x in d) / (len(d) - 1)
    return mean, math.sqrt(var / len(d))


def _in_two_processes(
    modules: dict[str, Path], heldout: Path
) -> dict[tuple[str, float], list[float]]:
    """`_first_token_kl` of the even and the odd clips in two forked processes (one core
    each), joined back into one list per key (the pairing over clips only needs the same
    order in every list)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        halves = list(pool.map(_first_token_kl, [modules] * 2, [heldout] * 2, [0, 1], [2, 2]))
    return {key: halves[0][key] + halves[1][key] for key in halves[0]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from craft_world import make_clips
    from craft_world.recipe import save_untrained_module

    root = tmp_path_factory.mktemp("world-learning")
    train = make_clips(root / "train", TRAIN_CLIPS, seed=0, split="craft", family="corners")
    test = make_clips(root / "test", HELDOUT, seed=0, split="test", family="corners")
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
        drop, se = _paired(before, kls["trained", ratio])
        control_drop, control_se = _paired(before, kls["control", ratio])
        print(f"KL at {ratio:g}x on {len(before)} held-out clips: untrained "
              f"{sum(before) / len(before):.3f}, trained drop {drop:+.3f} +- {se:.3f}, "
              f"control drop {control_drop:+.3f} +- {control_se:.3f}", flush=True)  # fmt: skip
        assert drop >= 3 * se, (ratio, drop, se)
        assert control_drop < 3 * control_se, (ratio, control_drop, control_se)
