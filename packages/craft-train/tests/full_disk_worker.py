"""Run under `torchrun` by test_full_disk.py: a two-process DeepSpeed ZeRO-2 run on the CPU
(gloo; the one multi-process path without GPUs) whose output folder is a small tmpfs (mounted
by the test). After `checkpoint-1`, rank 0 fills the disk, leaving one page less than
`checkpoint-2` needs, so the write of exactly one rank fails.

    torchrun --nproc_per_node 2 full_disk_worker.py SETUP_ROOT OUT_DIR REPORT_DIR

Each rank writes `REPORT_DIR/rank<r>.json`: the `CheckpointNotSaved` message it raised (and
exits 0 then: torchrun would kill the other rank as soon as one exits with an error).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).parent))

from conftest import TinySetup  # noqa: E402

from craft_testkit.filesystem import PAGE, fill_filesystem  # noqa: E402
from craft_train.config import load_config  # noqa: E402
from craft_train.trainer import CheckpointNotSaved, StepInfo, train  # noqa: E402


def _pages(folder: Path) -> int:
    return sum(-(-p.stat().st_size // PAGE) for p in folder.rglob("*") if p.is_file())


def main() -> int:
    root, out, report = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    setup = TinySetup(root, root / "vlm", root / "captions.jsonl", root / "qa.jsonl")
    rank = int(os.environ["RANK"])
    data = setup.config(
        out, optim={"max_steps": 3, "epochs": 10}, train={"deepspeed": "zero2", "save_steps": 1}
    )

    def fill(info: StepInfo) -> None:
        if info.step == 1 and rank == 0:  # checkpoint-2 is as large as checkpoint-1
            fill_filesystem(out.parent, (_pages(out / "checkpoint-1") - 1) * PAGE)

    try:
        train(load_config(data=data), on_step=fill)
    except CheckpointNotSaved as err:
        (report / f"rank{rank}.json").write_text(json.dumps({"error": str(err)}))
        return 0
    (report / f"rank{rank}.json").write_text(json.dumps({"error": None}))
    return 1


if __name__ == "__main__":
    sys.exit(main())
