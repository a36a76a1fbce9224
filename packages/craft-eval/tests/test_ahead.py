"""Videos compressed ahead of their questions (`HFBackend.prefetch`, `methods/ahead.py`):
the runner hands the backend its next questions, CRAFT compresses their videos in one
`compress_many` call, and each question's `generate` takes its video's result. The records
must be the same bits as a run that compresses each video in its own question's call."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

import craft_eval.runner
from craft_core import TokenBudget
from craft_eval.backend import HFBackend
from craft_eval.measure import Measure
from craft_eval.methods.ahead import AheadResults, Captured, Pending

WORLD_04 = Path(__file__).parent / "fixtures" / "world-0.4"  # 3 squares clips, 2 questions each
TASKS = "moving_count,object_existence"
FIELDS = ("first_token_kl", "first_token_correct", "reply", "tokens_after")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """The trained module at 8x on the 6 questions: computed ahead 4 questions at a time (so
    chunks of 4 and 2), and with `prefetch` off (each video in its own question's call)."""
    import craft_world

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("ahead")
    model, processor = craft_world.load_backbone(WORLD_04 / "backbone")
    out = {}
    for label in ("ahead", "plain"):
        bench = Measure(model, processor, WORLD_04 / "clips", tmp / label, subset=TASKS)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(craft_eval.runner, "AHEAD", 4)
            if label == "plain":
                patch.setattr(HFBackend, "prefetch", None)
            run = bench.run("craft-trained", TokenBudget(ratio=8.0), method="craft",
                            checkpoint=str(WORLD_04 / "craft"))  # fmt: skip
        out[label] = run.records
    return out


def test_questions_take_the_videos_computed_ahead(runs: dict[str, list[dict[str, Any]]]) -> None:
    batches = [r.get("extra", {}).get("compress_batch") for r in runs["ahead"]]
    assert sorted(batches, key=str) == [2, 2, 4, 4, 4, 4]  # run order: 4, then 2
    assert all(r.get("extra", {}).get("compress_batch") is None for r in runs["plain"])


def test_computed_ahead_records_the_same_bits(runs: dict[str, list[dict[str, Any]]]) -> None:
    ahead = {r["id"]: r for r in runs["ahead"]}
    plain = {r["id"]: r for r in runs["plain"]}
    assert sorted(ahead) == sorted(plain) and len(plain) == 6
    for i in plain:
        assert [ahead[i].get(f) for f in FIELDS] == [plain[i].get(f) for f in FIELDS], i
        # the tokens kept and their rows (sha256 of both)
        assert ahead[i]["extra"]["kept_digests"] == plain[i]["extra"]["kept_digests"], i
    assert len({tuple(r["extra"]["kept_digests"]) for r in plain.values()}) == 3  # 3 clips


def test_a_result_is_taken_only_for_its_own_video_and_budget() -> None:
    ahead = AheadResults()
    x, coords = torch.randn(5, 4), torch.zeros(5, 3, dtype=torch.long)
    budget = TokenBudget(ratio=2.0)
    with ahead.capturing() as seen, pytest.raises(Captured):
        ahead.record([x], [coords], budget)
    assert len(seen) == 1 and ahead.capture is None
    ahead.ready = [(Pending(x, coords, budget), "result", 1.0, 3)]  # type: ignore[list-item]
    assert ahead.take(x, coords, TokenBudget(ratio=4.0)) is None  # another budget
    assert ahead.take(x + 1e-7, coords, budget) is None  # another video
    assert ahead.take(x, coords + 1, budget) is None  # other coordinates
    assert ahead.take(x.clone(), coords.clone(), budget) == ("result", 1.0, 3)
    assert ahead.ready == []  # taken once
