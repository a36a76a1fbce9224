"""The DeepSpeed ZeRO-2 path on the CPU (gloo), in one process and in two.

Each test launches real processes with `torchrun`, as a user would on GPUs: one through the
`craft-train` command line, two through `ds_worker.py`, which also kills a run after its
step-2 checkpoint, resumes it, and checks it against an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TinySetup
from safetensors.torch import load_file

from craft_core import CraftCompressor

pytestmark = pytest.mark.slow


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _torchrun(nproc: int, args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        f"--master_port={_port()}",
        *args,
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done


def test_one_process_through_the_cli(tiny: TinySetup, tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = tmp_path / "stage1.yaml"
    data = tiny.config(
        out, optim={"max_steps": 3, "epochs": 10}, train={"deepspeed": "zero2", "save_steps": 2}
    )
    config.write_text(yaml.safe_dump(data))
    done = _torchrun(1, ["-m", "craft_train.cli", "stage1", "--config", str(config)])
    assert "stage 1 done (3 steps)" in done.stdout
    ckpt = out / "checkpoint-2"
    assert (ckpt / "deepspeed" / "latest").is_file()
    assert (ckpt / "craft" / "model.safetensors").is_file()
    rows = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    trained = CraftCompressor.from_pretrained(out / "craft")
    assert float(trained.merge.w_up.weight.detach().abs().sum()) > 0  # left its zero init


def test_two_processes_kill_and_resume(tiny: TinySetup, tmp_path: Path) -> None:
    worker = Path(__file__).parent / "ds_worker.py"
    _torchrun(2, [str(worker), str(tiny.root), str(tmp_path)], timeout=420)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["world"] == 2 for r in ranks)
    # One budget per optimizer step, the same on both ranks; each rank its own data.
    assert ranks[0]["budgets"] == ranks[1]["budgets"] and len(ranks[0]["budgets"]) == 4
    assert ranks[0]["losses"] != ranks[1]["losses"]
    assert ranks[0]["resumed_from"].endswith("checkpoint-2")
    # ZeRO-2 shards: one optimizer partition per rank.
    shards = list((tmp_path / "B" / "checkpoint-4" / "deepspeed").rglob("*optim_states.pt"))
    assert len(shards) == 2
    a = load_file(str(tmp_path / "A" / "craft" / "model.safetensors"))
    b = load_file(str(tmp_path / "B" / "craft" / "model.safetensors"))
    init = CraftCompressor.from_pretrained(tmp_path / "A" / "checkpoint-2" / "craft").state_dict()
    assert not torch.equal(a["merge.w_up.weight"], init["merge.w_up.weight"])
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-6)
    rows_a = [json.loads(x) for x in (tmp_path / "A" / "log.jsonl").read_text().splitlines()]
    rows_b = [json.loads(x) for x in (tmp_path / "B" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows_b] == [1, 2, 3, 4]
    for x, y in zip(rows_a, rows_b):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)
