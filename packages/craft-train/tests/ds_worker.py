"""Run under `torchrun` by test_deepspeed.py: DeepSpeed ZeRO-2 training on the tiny VLM.

    torchrun --nproc_per_node N ds_worker.py SETUP_ROOT WORK_DIR

Three runs in one process group: A uninterrupted; B killed after step 3 (checkpoint-2 on
disk) and then resumed. Each rank writes `WORK_DIR/rank<r>.json` with its budgets, losses
and the number of examples it saw.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).parent))

from conftest import TinySetup  # noqa: E402

from craft_train.config import load_config  # noqa: E402
from craft_train.trainer import StepInfo, train  # noqa: E402


class Killed(Exception):
    pass


def main() -> None:
    root, work = Path(sys.argv[1]), Path(sys.argv[2])
    setup = TinySetup(root, root / "vlm", root / "captions.jsonl", root / "qa.jsonl")
    rank = int(os.environ["RANK"])

    def config(out: Path):  # type: ignore[no-untyped-def]
        data = setup.config(
            out,
            optim={"max_steps": 4, "epochs": 10},
            train={"deepspeed": "zero2", "save_steps": 2},
        )
        return load_config(data=data, stage=1)

    budgets: list[str] = []
    losses: list[float] = []

    def record(info: StepInfo) -> None:
        budgets.append(info.budget)
        losses.append(info.loss)

    train(config(work / "A"), on_step=record)

    def kill(info: StepInfo) -> None:
        if info.step == 3:
            raise Killed

    with contextlib.suppress(Killed):
        train(config(work / "B"), on_step=kill)
    resumed = train(config(work / "B"))
    (work / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "budgets": budgets,
                "losses": losses,
                "resumed_from": str(resumed.resumed_from),
                "world": int(os.environ["WORLD_SIZE"]),
            }
        )
    )


if __name__ == "__main__":
    main()
