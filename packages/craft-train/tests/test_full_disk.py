"""A real full disk (issue 32): the output folder on a small tmpfs that fills while a
checkpoint is written. Each writer of a checkpoint raises its own error when the disk is full
(torch.save a RuntimeError from its zip writer, safetensors a SafetensorError, a text or JSON
file an OSError); whichever it is, the run stops with `CheckpointNotSaved`, no `.tmp` folder
is left, the last complete checkpoint is kept, and once space is freed the same command
resumes. The same for one rank of two, and for distill's teacher cache. Skipped where a
tmpfs cannot be mounted (not root).
"""

from __future__ import annotations

import errno
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import TinySetup

from craft_testkit.filesystem import PAGE, fill_filesystem, small_filesystem
from craft_train import cli
from craft_train.checkpoint import find_latest_checkpoint
from craft_train.config import load_config
from craft_train.data import Example
from craft_train.teacher_cache import TeacherCache, example_key, fill_cache
from craft_train.trainer import CheckpointNotSaved, StepInfo, train

# the files of a checkpoint in the order they are written (craft/'s three together)
WRITE_ORDER = [
    "rng_state_0.pt",
    "craft/config.json",
    "craft/README.md",
    "craft/model.safetensors",
    "optimizer.pt",
    "scheduler.pt",
    "config.yaml",
    "train_state.json",
]


def _pages(path: Path) -> int:
    return math.ceil(path.stat().st_size / PAGE)


def _room_for(ckpt: Path, target: str) -> int:
    """Free bytes that let the next checkpoint's writes run into `target` and fail inside it:
    every file before it, and half of it (what the previous checkpoint's files take)."""
    before = WRITE_ORDER[: WRITE_ORDER.index(target)]
    if target.startswith("craft/"):  # its order inside save_pretrained is the library's
        before = [name for name in before if not name.startswith("craft/")]
    pages = sum(_pages(ckpt / name) for name in before) + _pages(ckpt / target) // 2
    return pages * PAGE


@pytest.mark.parametrize(
    ("target", "error"),
    [
        ("rng_state_0.pt", "RuntimeError"),  # torch.save: "[enforce fail at inline_container"
        ("craft/model.safetensors", "SafetensorError"),
        ("optimizer.pt", "RuntimeError"),
        ("train_state.json", "OSError: [Errno 28]"),
    ],
)
def test_a_disk_that_fills_during_a_checkpoint(
    target: str,
    error: str,
    tiny: TinySetup,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with small_filesystem(tmp_path / "disk", 1 << 20) as disk:
        out = disk / "run"
        data = tiny.config(out, optim={"max_steps": 3}, train={"save_steps": 1})
        filler: list[Path] = []

        def fill_after_checkpoint_1(info: StepInfo) -> None:
            if info.step == 1:
                filler.append(fill_filesystem(disk, _room_for(out / "checkpoint-1", target)))

        with pytest.raises(CheckpointNotSaved) as stopped:
            train(load_config(data=data), on_step=fill_after_checkpoint_1)
        message = str(stopped.value)
        assert "checkpoint-2 could not be written" in message and error in message, message
        assert "rank 0" in message and f"{out / 'checkpoint-1'}, is kept" in message
        assert not list(out.glob("*.tmp")), list(out.iterdir())
        assert find_latest_checkpoint(out) == out / "checkpoint-1"
        assert not (out / "craft").exists()

        filler[0].unlink()  # space freed: the same command resumes and finishes
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
        assert cli.main(["stage1", "--config", str(tmp_path / "c.yaml")]) == 0
        capsys.readouterr()
        assert find_latest_checkpoint(out) == out / "checkpoint-3"
        assert (out / "craft" / "model.safetensors").is_file()


def test_the_cli_reports_a_full_disk_in_one_line(
    tiny: TinySetup, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No room even for the first checkpoint: exit 1, one line, no folder left behind."""
    with small_filesystem(tmp_path / "disk", 1 << 20) as disk:
        out = disk / "run"
        out.mkdir()
        (tmp_path / "c.yaml").write_text(
            yaml.safe_dump(tiny.config(out, optim={"max_steps": 2}, train={"save_steps": 1}))
        )
        fill_filesystem(disk, 2 * PAGE)  # config.yaml and log.jsonl fit, a checkpoint not
        assert cli.main(["stage1", "--config", str(tmp_path / "c.yaml")]) == 1
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("craft-train:")]
        assert len(lines) == 1 and "checkpoint-1 could not be written" in lines[0], err
        assert "no earlier one exists" in lines[0] and "Traceback" not in err
        assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "log.jsonl"]


def test_a_full_disk_on_one_rank_stops_every_rank(tiny: TinySetup, tmp_path: Path) -> None:
    """Two processes (DeepSpeed ZeRO-2 on gloo): the disk fills one page short of checkpoint-2,
    so the write of one rank fails. Every rank stops (none waits for the one that gave up) with the same
    message naming that rank, and checkpoint-1 is kept."""
    worker = Path(__file__).parent / "full_disk_worker.py"
    report = tmp_path / "report"
    report.mkdir()
    with small_filesystem(tmp_path / "disk", 1 << 20) as disk:
        out = disk / "run"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                   f"--master_port={_port()}", str(worker), str(tiny.root), str(out),
                   str(report)]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]  # each rank stopped with the error
        errors = [json.loads((report / f"rank{r}.json").read_text())["error"] for r in (0, 1)]
        assert errors[0] == errors[1] and errors[0] is not None, done.stderr[-3000:]
        named = [r for r in (0, 1) if f"rank {r}: " in errors[0]]
        assert len(named) == 1, errors[0]  # exactly one rank's write failed, and it is named
        assert "checkpoint-2 could not be written" in errors[0]
        assert find_latest_checkpoint(out) == out / "checkpoint-1"
        assert not list(out.glob("*.tmp"))
        assert sorted(p.name for p in (out / "checkpoint-1").glob("rng_state_*.pt")) == [
            "rng_state_0.pt",
            "rng_state_1.pt",
        ]


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _examples(n: int) -> list[Example]:
    return [Example(f"/videos/clip{i:03d}.mp4", "What happens?", "", "unlabeled") for i in range(n)]


def _teacher(example: Example) -> list[int]:
    """A deterministic stand-in for the teacher's greedy ids (the cache is under test)."""
    seed = int(example.video[-7:-4])
    return [(seed * 31 + j) % 1000 for j in range(40)]


def test_the_teacher_cache_on_a_disk_that_fills(tmp_path: Path) -> None:
    """distill's teacher cache: the responses written before the disk filled are kept, the
    error names the cache file, nothing is generated twice after space is freed, and a
    `meta.json` that cannot be written leaves no `meta.tmp`."""
    examples = _examples(60)  # ~60 x 200 bytes: several pages
    with small_filesystem(tmp_path / "disk", 256 * 1024) as disk:
        cache = TeacherCache(disk / "teacher", {"teacher": "t"})
        filler = fill_filesystem(disk, PAGE)
        with pytest.raises(OSError, match=r"teacher cache .*responses-0\.jsonl") as stopped:
            fill_cache(cache, examples, _teacher)
        assert stopped.value.errno == errno.ENOSPC and "run the same command" in str(stopped.value)
        kept = cache.responses()
        assert 0 < len(kept) < len(examples)

        filler.unlink()
        made: list[str] = []

        def counted(example: Example) -> list[int]:
            made.append(example.video)
            return _teacher(example)

        assert fill_cache(cache, examples, counted) == len(examples) - len(kept)
        assert {example_key(e) for e in _examples(60) if e.video in made}.isdisjoint(kept)
        assert cache.responses() == {example_key(e): _teacher(e) for e in examples}

        filler = fill_filesystem(disk, 0)
        with pytest.raises(OSError, match=r"teacher cache .*meta\.json"):
            TeacherCache(disk / "other", {"teacher": "t"})
        assert list((disk / "other").iterdir()) == []
