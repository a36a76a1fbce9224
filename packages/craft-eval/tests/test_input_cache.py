"""`InputCache`: a question's frames and processor outputs built once for every method of a
`Measure`, and the runs' records the same bits as without it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pytest
import torch

from craft_core import TokenBudget
from craft_eval.in_model import scaled_stage_options
from craft_eval.input_cache import InputCache
from craft_eval.measure import Measure

WORLD_04 = Path(__file__).parent / "fixtures" / "world-0.4"  # 3 squares clips, 2 questions each
TASKS = "moving_count,object_existence"
# visionzip, fastvid and holitom-llm read the tower's attention: their tower runs every time
METHODS = ["none", "divprune", "craft-selection", "visionzip", "fastvid", "holitom-llm"]


def _prepared(nbytes: int) -> Any:
    return np.zeros(nbytes, dtype=np.uint8), 2.0, False, {"input_ids": torch.zeros(1)}


def test_cache_builds_once_returns_fresh_dicts_and_keeps_its_byte_budget() -> None:
    cache = InputCache(max_bytes=2_000)
    built: list[str] = []

    def build(name: str, n: int) -> Any:
        return lambda: built.append(name) or _prepared(n)

    first = cache.get("a", build("a", 900))
    again = cache.get("a", build("a", 900))
    assert built == ["a"] and (cache.hits, cache.misses) == (1, 1)
    assert again[3] is not first[3] and again[3]["input_ids"] is first[3]["input_ids"]
    again[3]["extra"] = 1  # a caller's own key reaches nobody else
    assert "extra" not in cache.get("a", build("a", 900))[3]
    cache.get("b", build("b", 900))
    cache.get("c", build("c", 900))  # 3 x 904 bytes > 2,000: the least recently used goes
    assert len(cache) == 2 and built == ["a", "b", "c"]
    cache.get("a", build("a", 900))
    assert built == ["a", "b", "c", "a"]
    cache.get("huge", build("huge", 5_000))  # larger than the budget: returned, never kept
    assert "huge" not in cache._entries and len(cache) == 2
    with pytest.raises(ValueError, match="max_bytes"):
        InputCache(max_bytes=-1)


def test_cache_key_changes_when_the_file_is_rewritten(tmp_path: Path) -> None:
    video = tmp_path / "v.mp4"
    video.write_bytes(b"x" * 10)
    before = InputCache.key(str(video), "prompt")
    video.write_bytes(b"y" * 11)
    assert InputCache.key(str(video), "prompt") != before
    assert InputCache.key(str(tmp_path / "missing.mp4"), "p")[1] is None


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every method of METHODS at 8x on the 6 questions, once with the shared cache and
    once with every backend building its own inputs."""
    import craft_world

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("input-cache")
    model, processor = craft_world.load_backbone(WORLD_04 / "backbone")
    out: dict[str, dict[str, Any]] = {}
    for label, cached in (("cached", True), ("plain", False)):
        bench = Measure(model, processor, WORLD_04 / "clips", tmp / label, subset=TASKS)
        if not cached:
            bench.inputs.max_bytes = 0  # nothing kept: every call builds
        records = {
            name: bench.run(
                name,
                None if name == "none" else TokenBudget(ratio=8.0),
                method_kwargs=scaled_stage_options(name, model),  # holitom-llm's layer
            ).records
            for name in METHODS
        }
        out[label] = {"records": records, "cache": bench.inputs}
    return out


def test_measure_builds_each_questions_inputs_once(runs: dict[str, dict[str, Any]]) -> None:
    cache = runs["cached"]["cache"]
    # 6 questions (3 clips x 2 prompts: the key holds the prompt) built once; every other
    # method's calls are hits
    assert cache.misses == 6 and len(cache) == 6
    assert cache.hits >= (len(METHODS) - 1) * 6
    assert runs["plain"]["cache"].hits == 0
    # the vision tower once a question for the methods that share it (those that read no
    # attention: divprune encodes, craft-selection reads it twice, when its video is
    # compressed ahead and in its generate); visionzip, fastvid, holitom-llm run their own
    assert cache.vision_misses == 6 and cache.vision_hits == 2 * 6
    assert runs["plain"]["cache"].vision_hits == 0


@pytest.mark.parametrize("name", METHODS)
def test_cached_runs_record_the_same_bits(runs: dict[str, dict[str, Any]], name: str) -> None:
    fields = ("first_token_kl", "first_token_correct", "reply", "tokens_after")
    cached = {r["id"]: r for r in runs["cached"]["records"][name]}
    plain = {r["id"]: r for r in runs["plain"]["records"][name]}
    assert sorted(cached) == sorted(plain) and len(plain) == 6
    for i in plain:
        assert [cached[i].get(f) for f in fields] == [plain[i].get(f) for f in fields], i
        digests = [r[i].get("extra", {}).get("kept_digests") for r in (cached, plain)]
        assert digests[0] == digests[1] and (name == "none") == (digests[0] is None), i
