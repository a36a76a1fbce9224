"""`craft_testkit.filesystem`: the full disk every package's tests write to is a real one.

Skipped where a tmpfs cannot be mounted (not root), as the tests that use it are.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from craft_testkit.filesystem import PAGE, fill_filesystem, small_filesystem


def test_a_filled_small_filesystem_refuses_the_next_write(tmp_path: Path) -> None:
    where = tmp_path / "disk"
    with small_filesystem(where, 64 * PAGE) as disk:
        assert os.stat(disk).st_dev != os.stat(tmp_path).st_dev  # a mount of its own
        filler = fill_filesystem(disk, leave=2 * PAGE)
        (disk / "fits").write_bytes(b"x" * PAGE)  # control: what is left can be used
        with pytest.raises(OSError) as caught:
            (disk / "too-big").write_bytes(b"x" * (4 * PAGE))
        assert caught.value.errno == errno.ENOSPC
        filler.unlink()  # freed again: the same write now fits
        (disk / "too-big").write_bytes(b"x" * (4 * PAGE))
    assert os.stat(where).st_dev == os.stat(tmp_path).st_dev  # unmounted after the block
    assert not (where / "fits").exists()
