"""Test helpers: a scripted model backend (no model), used through the real runner, and a
real small filesystem (a tmpfs) to fill."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from craft_eval.runner import Generation, VideoDecodeError
from craft_eval.tasks import Item, Prompt


class ScriptedBackend:
    """Opens each video with PyAV (so broken files fail like they do for a model), then
    answers the gold letter for even-numbered calls and a wrong one for odd ones."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.calls: list[str] = []

    def generate(self, item: Item, prompt: Prompt) -> Generation:
        import av

        try:
            with av.open(item.video) as container:
                frames = sum(1 for _ in container.decode(video=0))
        except (OSError, av.error.FFmpegError) as error:
            raise VideoDecodeError(f"{item.video}: {error}") from error
        self.calls.append(item.id)
        time.sleep(self.delay_s)
        digits = re.search(r"\d+", item.id)
        index = int(digits.group(0)) if digits else 0
        letters = item.letters or "AB"
        wrong = next(x for x in letters if x != item.answer)
        reply = f"The answer is ({item.answer})." if index % 2 == 0 else f"{wrong}. no idea"
        return Generation(
            reply=reply,
            tokens_before=64 * frames,
            tokens_after=8 * frames,
            num_frames=frames,
            compress_ms=1.0,
            prefill_ms=2.0,
        )


PAGE = 4096  # tmpfs allocates whole pages


@contextlib.contextmanager
def small_filesystem(where: Path, size: int) -> Iterator[Path]:
    """A real tmpfs of `size` bytes mounted at `where` for the block: a full disk as the
    writers meet it. Needs root (CI runs as root); skipped, saying why, where mounting is not
    permitted."""
    where.mkdir(parents=True, exist_ok=True)
    command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as error:  # no mount binary
        pytest.skip(f"cannot mount a tmpfs for a real full disk: {error}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for a real full disk: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill_filesystem(where: Path, leave: int) -> Path:
    """Fill the filesystem of `where` with one file until `leave` bytes remain free."""
    filler = where / "filler"
    free = shutil.disk_usage(where).free
    with filler.open("wb") as handle:
        handle.write(b"\0" * (free - leave))
    assert shutil.disk_usage(where).free == leave
    return filler
