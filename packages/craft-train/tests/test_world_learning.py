"""Learning test in the miniature world (craft-world's trained backbone): `craft-train
distill` for a short run lowers the held-out first-token KL to the uncompressed model,
item by item, by >= 3 paired standard errors from its own untrained start; the same run
distilled from a RANDOM teacher (a freshly initialised world backbone: same tokenizer, same
architecture, knows nothing) does not. The control rules out that any training of the
module, whatever its target, makes the compressed model's answers closer (the gate moving
off 0.5, say).

It runs at 32x, where the fusion matters most in this world (at 8x the full 600-step recipe
moves KL by less than 1 SE, see craft-world's README), and it is xfail: MEASURED, the short
run does not reach 3 SE (see the marker's reason). It still runs in CI and prints both
effects with their standard errors.

    uv run pytest packages/craft-train/tests/test_world_learning.py -q -s   # prints both effects
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from craft_core import CraftCompressor
from craft_train.config import load_config
from craft_train.model import build_model
from craft_train.trainer import train

pytest.importorskip("craft_world")

TRAIN_CLIPS = 60  # split "craft": x 3 prompts (describe + 2 questions)
TEST_CLIPS = 150  # split "test": x 2 questions, held out
STEPS = 100  # x 4 examples
LR = 4e-3
RATIO = 32.0


@pytest.mark.slow
@pytest.mark.xfail(
    strict=False,
    reason="measured (issue 17, craft-world 0.2 backbone, 32x): 100 steps lowered held-out KL "
    "by 0.140 +- 0.092 (1.5 SE, 300 items; random-teacher control -0.032 +- 0.093); 200 steps "
    "by 0.050 +- 0.080 (0.6 SE, 500 items; control -0.203 +- 0.075). The full 600-step recipe "
    "vs untrained on 600 items: 8x +0.021 +- 0.036, 32x +0.144 +- 0.074. Not 3 SE.",
)
def test_distillation_in_the_world_lowers_heldout_kl_and_a_random_teacher_does_not(
    tmp_path: Path,
) -> None:
    import craft_world
    from craft_world.backbone import new_backbone, world_processor
    from craft_world.measure import answer_logprobs, evaluate, load_items, paired
    from craft_world.recipe import craft_train_config, distill_manifest

    torch.set_num_threads(1)  # a shared CI machine: oversubscribed threads only slow it down
    started = time.perf_counter()
    model, processor = craft_world.load_backbone()
    random_teacher = tmp_path / "random-teacher"
    new_backbone(seed=12345).save_pretrained(random_teacher)
    world_processor().save_pretrained(random_teacher)
    manifest = distill_manifest(
        craft_world.make_clips(tmp_path / "train", TRAIN_CLIPS, split="craft")
    )
    items = load_items(craft_world.make_clips(tmp_path / "test", TEST_CLIPS), task=None)
    reference = answer_logprobs(model, processor, items)

    kl = {}
    for name, teacher in (("distilled", None), ("random teacher", str(random_teacher))):
        data = craft_train_config(
            manifest,
            tmp_path / name,
            stage="distill",
            budget={"p_threshold": 0.0, "ratios": [RATIO]},
            optim={"lr": LR, "max_steps": STEPS, "grad_accum": 4},
            distill={"max_new_tokens": 16, "teacher": teacher},
        )
        cfg = load_config(data=data, stage="distill")
        if not kl:
            untrained = build_model(cfg).compressor.eval()  # both runs' seeded start
            kl["untrained"] = evaluate(model, processor, items, reference, untrained, RATIO).kl
        train(cfg)
        module = CraftCompressor.from_pretrained(tmp_path / name / "craft").eval()
        kl[name] = evaluate(model, processor, items, reference, module, RATIO).kl

    drop, se = paired(kl["untrained"], kl["distilled"])
    control, control_se = paired(kl["untrained"], kl["random teacher"])
    print(
        f"\nheld-out KL at {RATIO:g}x over {len(items)} items: untrained {float(kl['untrained'].mean()):.4f}; "
        f"distilled drop {drop:+.4f} +- {se:.4f} ({drop / se:+.1f} SE); random-teacher control "
        f"drop {control:+.4f} +- {control_se:.4f} ({control / control_se:+.1f} SE); "
        f"{time.perf_counter() - started:.0f} s"
    )
    assert drop > 3 * se
    assert control < 3 * control_se
