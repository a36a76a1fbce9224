"""The first-token measurements as scorers of the runner, in the miniature world: the same
figures the demo printed before they moved out of craft-world, checked against an obvious
loop, and the paired comparison against a plain formula."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

from craft_core import TokenBudget
from craft_eval.measure import Measure
from craft_eval.scoring import kl_to, paired, paired_records

TASKS = "moving_count,object_existence"
WORLD_04 = Path(__file__).parent / "fixtures" / "world-0.4"
"""craft-world 0.4's backbone (`backbone/`), trained module (`craft/`) and the 3 held-out
squares clips the figures below were measured on (`clips/`: `make_clips(.., 3, seed=0,
split="test")` of generator 2, whose x264 settings craft-world 0.5 changed: generator 3
writes other bytes)."""
IDS = [f"{task}/{i}" for task in TASKS.split(",") for i in range(3)]

# Per item (IDS order) first-token KL (nats, 6 significant digits) and option-letter hits of
# craft-world's own measurement before it moved here: `craft_world.measure.evaluate` at
# commit 8da4f5f on `make_clips(tmp, 3, seed=0, split="test")` (`WORLD_04 / "clips"`), every
# compressor built by `build_compressor(method, hidden_size=128, allow_untrained=True)`
# ("craft-trained": "craft" with the shipped checkpoint), ratio 8, the world backbone in
# float32 on the 2-core AMD EPYC CPU. The mean and SE are that run's `Score.kl_mean` / `Score.kl_se`. That backbone and
# module (craft-world 0.4's, shipped until 0.5) are kept as test fixtures, `WORLD_04`.
MAIN_TABLE = """
none             0         0           0          0           0           0           111111 0          0
uniform          0.0274768 6.30439     5.33827    0.000396893 0.00382758  5.02376e-05 100111 1.945735   1.231908
divprune         0.0615613 0.000225317 0.0107654  0.000542245 0.000117959 4.88407e-05 111111 0.01221017 0.01001918
visionzip        0.150893  1.3293      0.0303299  0.000391205 4.53028     6.51185e-05 101101 1.006877   0.7355585
craft-selection  0.0692298 0.000312292 0.0067075  5.39463     0.00708862  1.34166e-05 111011 0.9129966  0.8963913
craft-trained    0.0848314 0.000350371 0.00959099 0.00296588  0.000470755 8.25119e-05 111111 0.01638199 0.01376867
"""
MAIN: dict[str, tuple[list[float], list[int], float, float]] = {
    # method: (per-item KL, per-item hits, mean KL, its SE)
    name: ([float(x) for x in kl], [int(h) for h in hits], float(mean), float(se))
    for name, *kl, hits, mean, se in (line.split() for line in MAIN_TABLE.strip().splitlines())
}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The world backbone and 6 held-out questions, run uncompressed and with every method
    of MAIN at ratio 8 through the runner with the first-token scorer."""
    import craft_world

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("first-token")
    model, processor = craft_world.load_backbone(WORLD_04 / "backbone")
    bench = Measure(model, processor, WORLD_04 / "clips", tmp / "runs", subset=TASKS)
    runs: dict[str, Any] = {}
    for name in MAIN:
        trained = name == "craft-trained"
        runs[name] = bench.run(
            name,
            None if name == "none" else TokenBudget(ratio=8.0),
            method="craft" if trained else name,
            checkpoint=str(WORLD_04 / "craft") if trained else None,
        )
    return {"model": model, "processor": processor, "data": WORLD_04 / "clips", "runs": runs}


@pytest.mark.parametrize("name", list(MAIN))
def test_scorer_gives_the_figures_of_craft_worlds_measurement(world: Any, name: str) -> None:
    kl, hits, kl_mean, kl_se = MAIN[name]
    records = {r["id"]: r for r in world["runs"][name].records}
    assert sorted(records) == sorted(IDS)
    got = [records[i]["first_token_kl"] for i in IDS]
    assert got == pytest.approx(kl, rel=1e-4, abs=1e-6)
    assert [int(records[i]["first_token_correct"]) for i in IDS] == hits
    s = world["runs"][name].scores
    assert s["first_token_kl_mean"] == pytest.approx(kl_mean, rel=1e-4, abs=1e-7)
    assert s["first_token_kl_se"] == pytest.approx(kl_se, rel=1e-4, abs=1e-7)
    assert s["first_token_accuracy"] == pytest.approx(sum(hits) / 6)
    p = sum(hits) / 6
    assert s["first_token_accuracy_se"] == pytest.approx(math.sqrt(p * (1 - p) / 6))
    if name == "none":  # the reference itself: exactly 0, not merely small
        assert all(v == 0.0 for v in got)


@pytest.mark.parametrize("name", ["none", "divprune", "craft-trained"])
def test_generation_keeps_the_first_token_logprobs_of_a_plain_forward(
    world: Any, name: str
) -> None:
    # The scorer reads the first answer token's log-probabilities from the generation (no
    # second prefill); they are the bits a separate forward gives, compressed or not.
    from craft_eval.tasks import get_benchmark

    bench = get_benchmark("mvbench")
    backend = world["runs"][name].backend
    for item in bench.load(world["data"], subset=TASKS)[:2]:
        prompt = bench.prompt(item)
        kept = backend.generate(item, prompt).first_logprobs
        assert kept.dtype == torch.float32 and kept.shape[0] > 100
        assert torch.equal(kept, backend.first_token_logprobs(item, prompt))


def test_scorer_prefills_nothing_more_when_the_generation_kept_its_logprobs(world: Any) -> None:
    from craft_eval.runner import Generation
    from craft_eval.scoring import FirstTokenScorer
    from craft_eval.tasks import get_benchmark

    class Counting:
        calls = 0

        def first_token_logprobs(self, item: Any, prompt: Any) -> torch.Tensor:
            Counting.calls += 1
            return world["runs"]["divprune"].backend.first_token_logprobs(item, prompt)

    bench = get_benchmark("mvbench")
    item = bench.load(world["data"], subset=TASKS)[0]
    prompt = bench.prompt(item)
    reference, other = Counting(), Counting()
    scorer = FirstTokenScorer(reference, world["processor"].tokenizer)
    logprobs = world["runs"]["uniform"].backend.generate(item, prompt).first_logprobs
    kept = scorer(item, prompt, other, Generation(reply="A", first_logprobs=logprobs))
    assert Counting.calls == 1  # the reference's answer only
    assert kept["first_token_kl"] > 0
    without = scorer(item, prompt, other, Generation(reply="A"))
    assert Counting.calls == 2 and without["first_token_kl"] == 0.0  # it prefilled itself


def _obvious_first_token(model: Any, processor: Any, data: Path, method: str | None) -> list:
    """Per item of IDS: the option-letter log-probabilities and the full [V] ones, each
    clip read, prompted and run by hand (the bare model, or wrapped with `method` at 8)."""
    from craft_adapters import build_inputs, read_video, wrap
    from craft_eval.methods.build import build_compressor

    runner = model
    if method is not None:
        width = int(model.config.get_text_config().hidden_size)
        compressor = build_compressor(method, hidden_size=width, allow_untrained=True)
        runner = wrap(model, compressor, ratio=8.0)
    rows = []
    for task in TASKS.split(","):
        for rec in json.loads((data / "json" / f"{task}.json").read_text()):
            video = read_video(data / "video" / "clevrer/video_validation" / rec["video"])
            lines = "\n".join(f"({'ABCDE'[i]}) {c}" for i, c in enumerate(rec["candidates"]))
            text = f"Question:{rec['question']}\nOption:\n{lines}\nOnly give the best option.\n"
            with torch.no_grad():
                logits = runner(**build_inputs(processor, video.frames, video.fps, text)).logits
            gold = "ABCDE"[rec["candidates"].index(rec["answer"])]
            rows.append((torch.log_softmax(logits[0, -1].double(), -1).tolist(), gold, rec))
    return rows


@pytest.mark.parametrize("method", ["divprune", "craft-selection"])
def test_kl_and_its_se_equal_an_obvious_loop(world: Any, method: str) -> None:
    model, processor = world["model"], world["processor"]
    ref = _obvious_first_token(model, processor, world["data"], None)
    mine = _obvious_first_token(model, processor, world["data"], method)
    kls, hits = [], []
    for (p, gold, rec), (q, _, _) in zip(ref, mine):
        kls.append(sum(math.exp(a) * (a - b) for a, b in zip(p, q)))
        letters = "ABCDE"[: len(rec["candidates"])]
        ids = [processor.tokenizer.convert_tokens_to_ids(c) for c in letters]
        hits.append(letters[max(range(len(ids)), key=lambda k: q[ids[k]])] == gold)
    n = len(kls)
    mean = sum(kls) / n
    se = math.sqrt(sum((k - mean) ** 2 for k in kls) / (n - 1) / n)
    s = world["runs"][method].scores
    records = {r["id"]: r for r in world["runs"][method].records}
    assert [records[i]["first_token_kl"] for i in IDS] == pytest.approx(kls, rel=1e-4, abs=1e-6)
    assert [records[i]["first_token_correct"] for i in IDS] == hits
    assert s["first_token_kl_mean"] == pytest.approx(mean, rel=1e-4)
    assert s["first_token_kl_se"] == pytest.approx(se, rel=1e-4)
    assert s["first_token_kl_mean"] > 1e-3  # the compressor changed the answers: not 0 == 0


def test_paired_comparison_equals_the_plain_formula(world: Any) -> None:
    a, b = world["runs"]["uniform"].records, world["runs"]["craft-trained"].records
    drop, se = paired_records(a, b, "first_token_kl")
    by_id = {r["id"]: r["first_token_kl"] for r in b}
    d = [r["first_token_kl"] - by_id[r["id"]] for r in a]
    mean = sum(d) / len(d)
    assert drop == pytest.approx(mean)
    assert se == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in d) / 5 / 6))
    # from the pinned figures of craft-world's measurement: the demo's paired line
    ref = [x - y for x, y in zip(MAIN["uniform"][0], MAIN["craft-trained"][0])]
    assert drop == pytest.approx(sum(ref) / 6, rel=1e-4)
    gain, _ = paired_records(b, a, "first_token_correct")
    assert gain == pytest.approx(2 / 6)  # uniform misses 2 items craft-trained gets


def test_paired_and_kl_helpers() -> None:
    mean, se = paired([3.0, 5.0, 4.0], [1.0, 2.0, 3.0])
    assert mean == pytest.approx(2.0) and se == pytest.approx(1.0 / 3**0.5)
    with pytest.raises(ValueError, match="paired values"):
        paired([1.0], [2.0])
    with pytest.raises(ValueError, match="paired values"):
        paired([1.0, 2.0], [2.0])
    a = [{"id": "x", "first_token_kl": 1.0}, {"id": "y", "first_token_kl": 3.0}]
    b = [{"id": "y", "first_token_kl": 1.0}, {"id": "x", "first_token_kl": 0.5}, {"id": "z"}]
    assert paired_records(a, b, "first_token_kl") == paired([1.0, 3.0], [0.5, 1.0])  # by id
    with pytest.raises(ValueError, match="got 0 and 0"):  # records without the scorer's fields
        paired_records([{"id": "x"}, {"id": "y"}], b, "first_token_kl")
    ref = torch.log_softmax(torch.randn(4, 7), -1)
    other = torch.log_softmax(torch.randn(4, 7), -1)
    expect = torch.nn.functional.kl_div(other, ref, log_target=True, reduction="none").sum(-1)
    torch.testing.assert_close(kl_to(ref, other), expect)
    with pytest.raises(ValueError, match="shapes differ"):
        kl_to(ref, other[:, :5])


@pytest.mark.slow
def test_shipped_world_backbone_answers_heldout_questions(tmp_path: Path) -> None:
    """The world's shipped backbone, uncompressed, through the runner and the scorer: its
    most likely option letter is right on > 90% of 100 held-out questions per task of the
    squares and > 95% of 100 corners questions."""
    import craft_world

    model, processor = craft_world.load_backbone()
    assert (craft_world.backbone_path() / "model.safetensors").stat().st_size < 5_000_000
    assert 0.5e6 < sum(p.numel() for p in model.parameters()) < 1.5e6
    data = craft_world.make_clips(tmp_path / "w", 100, seed=0, split="test")
    records = Measure(model, processor, data, tmp_path / "runs", subset=TASKS).run("none").records
    for task in TASKS.split(","):
        hits = [r["first_token_correct"] for r in records if r["categories"]["task"] == task]
        assert len(hits) == 100 and sum(hits) / 100 > 0.9, task  # see world_recipe.json
    corners = craft_world.make_clips(tmp_path / "c", 100, seed=0, split="test", family="corners")
    bench = Measure(model, processor, corners, tmp_path / "runs-c", subset="moving_direction")
    hits = [r["first_token_correct"] for r in bench.run("none").records]
    assert len(hits) == 100 and sum(hits) / 100 > 0.95


@pytest.mark.slow
def test_shipped_quiz_backbone_answers_the_question_it_is_asked(tmp_path: Path) -> None:
    """The quiz family's backbone (each clip asks about one of 24 colour x corner features),
    uncompressed: right on > 95% of 100 held-out quiz questions (600 measured: 99.2%), and
    DivPrune at 8x loses >= 10 points of it (600: 79.0%). The corners backbone, which reads
    one feature only, answers about half."""
    import craft_world

    model, processor = craft_world.load_backbone(craft_world.quiz_backbone_path())
    quiz = craft_world.make_clips(tmp_path / "q", 100, seed=0, split="test", family="quiz")
    bench = Measure(model, processor, quiz, tmp_path / "runs", subset="counterfactual_inference")
    accuracy = {}
    for method in ("none", "divprune"):
        budget = None if method == "none" else TokenBudget(ratio=8.0)
        hits = [r["first_token_correct"] for r in bench.run(method, budget).records]
        assert len(hits) == 100
        accuracy[method] = sum(hits) / 100
    assert accuracy["none"] > 0.95 and accuracy["divprune"] <= accuracy["none"] - 0.10, accuracy


WORLD_GOOD = {"video": "a.mp4", "question": "Is it red?", "candidates": ["yes", "no"]}
BAD_QUESTION_FILES: list[tuple[str, bytes, str]] = [
    # (id, content of json/object_existence.json, text the message must hold): the world's
    # question files are read by MVBench's loader, which names the file
    ("not-json", b"[{", "cannot be read"),
    ("binary", b"\xff\xfe\x00", "cannot be read"),
    ("an-object", json.dumps({**WORLD_GOOD, "answer": "no"}).encode(), "list of records"),
    (
        "answer-not-a-candidate",
        json.dumps([{**WORLD_GOOD, "answer": "maybe"}]).encode(),
        "record 0",
    ),
    ("no-candidates", json.dumps([{"video": "a.mp4", "answer": "no"}]).encode(), "'candidates'"),
    ("record-not-object", json.dumps([{**WORLD_GOOD, "answer": "no"}, 3]).encode(), "record 1"),
]


@pytest.mark.parametrize(
    ("content", "text"),
    [c[1:] for c in BAD_QUESTION_FILES],
    ids=[c[0] for c in BAD_QUESTION_FILES],
)
def test_world_question_file_errors_name_the_file(
    tmp_path: Path, content: bytes, text: str
) -> None:
    from craft_eval.tasks import get_benchmark

    path = tmp_path / "json" / "object_existence.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(ValueError, match=text) as info:
        get_benchmark("mvbench").load(tmp_path, subset="object_existence")
    assert str(path) in str(info.value)
    path.write_text(json.dumps([{**WORLD_GOOD, "answer": "no"}]))  # control: a good file loads
    (item,) = get_benchmark("mvbench").load(tmp_path, subset="object_existence")
    assert item.answer == "B" and item.categories == {"task": "object_existence"}
