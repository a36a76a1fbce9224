"""A real full disk for the workspace's tests (no mocks).

    from craft_testkit.filesystem import PAGE, fill_filesystem, small_filesystem

    with small_filesystem(tmp_path / "disk", 1 << 20) as disk:   # a real 1 MiB tmpfs
        fill_filesystem(disk, leave=2 * PAGE)                     # 8 KiB left: a full disk
        ...                                                       # the writer meets ENOSPC

Every package's tests import these (craft-testkit is in every package's `test` group), so a
full disk is made one way across the workspace. Nothing here runs outside a test.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import unittest
from collections.abc import Iterator
from pathlib import Path

__all__ = ["PAGE", "fill_filesystem", "small_filesystem"]

PAGE = 4096
"""tmpfs allocates whole pages: sizes and free space move in steps of this."""


@contextlib.contextmanager
def small_filesystem(where: Path, size: int) -> Iterator[Path]:
    """A real tmpfs of `size` bytes mounted at `where` for the block: a full disk as the
    writers meet it. Needs root (CI runs as root); skipped, saying why, where mounting is not
    permitted (`unittest.SkipTest`, which pytest reports as a skip)."""
    where.mkdir(parents=True, exist_ok=True)
    command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as error:  # no mount binary
        raise unittest.SkipTest(f"cannot mount a tmpfs for a real full disk: {error}") from None
    if done.returncode != 0:
        raise unittest.SkipTest(f"cannot mount a tmpfs for a real full disk: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill_filesystem(where: Path, leave: int) -> Path:
    """Fill the filesystem of `where` with one file until `leave` bytes remain free; return
    the file (delete it to free the space again)."""
    filler = where / "filler"
    free = shutil.disk_usage(where).free
    with filler.open("wb") as handle:
        handle.write(b"\0" * (free - leave))
    if shutil.disk_usage(where).free != leave:
        raise RuntimeError(f"{where}: {shutil.disk_usage(where).free} bytes free, not {leave}")
    return filler
