"""Hostile input to craft-world's public functions, table-driven (issue 25): lax types that
change meaning (a bool as a clip count), non-integers, out-of-range values, and broken
question files. Each case must raise the documented error type naming the argument or file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from craft_world import make_clips

MAKE_CLIPS_CASES: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    # (id, keyword arguments, error type, text the message must hold)
    ("n-bool", {"n": True}, TypeError, "n must be an int"),
    ("n-float", {"n": 2.0}, TypeError, "n must be an int"),
    ("n-text", {"n": "2"}, TypeError, "n must be an int"),
    ("n-zero", {"n": 0}, ValueError, "n must be positive"),
    ("n-negative", {"n": -3}, ValueError, "n must be positive"),
    ("seed-bool", {"n": 1, "seed": False}, TypeError, "seed must be an int"),
    ("seed-float", {"n": 1, "seed": 1.5}, TypeError, "seed must be an int"),
    ("seed-negative", {"n": 1, "seed": -1}, ValueError, "seed"),
    ("start-bool", {"n": 1, "start": True}, TypeError, "start must be an int"),
    ("start-negative", {"n": 1, "start": -2}, ValueError, "start"),
    ("split-unknown", {"n": 1, "split": "val"}, ValueError, "split"),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [c[1:] for c in MAKE_CLIPS_CASES],
    ids=[c[0] for c in MAKE_CLIPS_CASES],
)
def test_make_clips_refuses_bad_arguments_before_writing(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], text: str
) -> None:
    with pytest.raises(error, match=text):
        make_clips(tmp_path / "w", **kwargs)
    assert not (tmp_path / "w").exists()  # nothing written


class _Payload:
    """Unpickling this runs `open(marker, "w")`: what a hostile `state.pt` would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


def test_train_backbone_refuses_a_state_that_runs_code(tmp_path: Path) -> None:
    """Issue 32: a `state.pt` from someone else must not run code at resume (the CLI turns
    the ValueError into its one-line usage error, exit 2)."""
    import torch

    from craft_world.train_backbone import Recipe, train_backbone

    marker, work = tmp_path / "pwned", tmp_path / "work"
    work.mkdir()
    torch.save({"recipe": {}, "model": _Payload(marker)}, work / "state.pt")
    with pytest.raises(ValueError, match=r"state\.pt holds Python objects") as err:
        train_backbone(
            work,
            tmp_path / "out",
            Recipe(steps_a=1, steps_b=1, steps_p=0, steps_c=0),
            eval_clips=1,
            final_clips=1,
        )
    assert str(work / "state.pt") in str(err.value) and "refused" in str(err.value)
    assert not marker.exists() and not (tmp_path / "out").exists()
    # control: the payload is live; the unsafe loader runs it
    torch.load(work / "state.pt", weights_only=False)
    assert marker.exists()
