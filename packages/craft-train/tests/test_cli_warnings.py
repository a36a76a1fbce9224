"""Python warnings raised while `craft-train` runs reach the user in the CLI's own one-line
form (`craft-train: warning: ...`), not as `file.py:N: UserWarning` plus a source line."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import TinySetup

from craft_train import cli


def test_warnings_are_one_line(
    tiny: TinySetup,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(tiny.config(tmp_path / "out")))
    real = cli.check_paths

    def check_paths(cfg: Any) -> None:  # a library warning while the config is checked
        warnings.warn("the manifest uses a deprecated field", UserWarning, stacklevel=1)
        warnings.warn("a future default changes", FutureWarning, stacklevel=1)
        real(cfg)

    monkeypatch.setattr(cli, "check_paths", check_paths)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert cli.main(["stage1", "--check", "--config", str(tmp_path / "c.yaml")]) == 0
        shown = warnings.showwarning
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "craft-train: warning: the manifest uses a deprecated field",
        "craft-train: warning: FutureWarning: a future default changes",
    ]
    assert shown is not cli._show_warning  # Python's own format is back after main
