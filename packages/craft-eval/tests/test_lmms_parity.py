"""craft-eval's six benchmarks against lmms-eval 0.7.3's OWN task functions.

For every benchmark: the prompt of every fixture item equals lmms-eval's `doc_to_text` (with
the task YAML's default `lmms_eval_specific_kwargs`), and on a corpus of >= 300 replies per
benchmark (letters in every form and case, option texts, answer phrases, `<think>` blocks,
whitespace, empty replies, other scripts) craft-eval's verdict equals lmms-eval's, where
lmms-eval's is deterministic. lmms-eval's replies go through its default reasoning-tag
stripping (`api/reasoning.py:strip_reasoning_tags`) first, as its evaluator does.

Where lmms-eval picks a random letter (LongVideoBench, EgoSchema) or calls an LLM judge
(TempCompass), the test patches that call to a sentinel and checks that craft-eval reaches
its fallback exactly there. The aggregates (MVBench's denominator without empty replies,
MLVU's mean over 7 task types) are compared on the same corpus.
"""

from __future__ import annotations

import importlib
import random
import warnings
from pathlib import Path
from typing import Any

import lmms_eval  # declared in the test group: a missing one fails
import pytest
import torch

from craft_eval.fixtures import write_fixture
from craft_eval.scoring import summarize
from craft_eval.tasks import BENCHMARKS, Item

TAGS = [["<think>", "</think>"], ["<analysis>", "</analysis>"]]
SENTINEL = "<random>"
NAMES = ("videomme", "longvideobench", "mvbench", "egoschema", "mlvu", "tempcompass")


@pytest.fixture(scope="module")
def items(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Item]]:
    root = tmp_path_factory.mktemp("parity")
    out = {}
    for name in NAMES:
        path = write_fixture(name, root / name, num_items=4, num_frames=2, size=(16, 16))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # MVBench: the fixture has 2 of its 19 tasks
            out[name] = BENCHMARKS[name].load(path)
    return out


@pytest.fixture(scope="module")
def utils(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """lmms-eval's task modules (TempCompass reads HF_HOME at import)."""
    import os

    os.environ.setdefault("HF_HOME", str(tmp_path_factory.mktemp("hf")))
    return {n: importlib.import_module(f"lmms_eval.tasks.{n}.utils") for n in NAMES}


def _kwargs(task_yaml: str) -> dict[str, Any]:
    """The YAML's default `lmms_eval_specific_kwargs` (as lmms-eval merges them)."""
    import yaml

    base = Path(lmms_eval.__file__).parent / "tasks"
    text = (base / task_yaml).read_text()
    data = yaml.safe_load("\n".join(x for x in text.splitlines() if "!function" not in x))
    kwargs = dict(data.get("lmms_eval_specific_kwargs") or {})
    if "default" not in kwargs and "include" in data:
        return _kwargs(str(Path(task_yaml).parent / data["include"]))
    return dict(kwargs.get("default", {}))


def lmms_doc(name: str, item: Item) -> dict[str, Any]:
    """The document lmms-eval reads for `item` (its record as distributed; LongVideoBench's
    HF parquet spells the candidates option0..option4 with "N/A" for missing ones)."""
    doc = dict(item.record)
    if name == "longvideobench":
        options = list(item.options) + ["N/A"] * (5 - len(item.options))
        doc.update({f"option{i}": o for i, o in enumerate(options)})
    return doc


def corpus(item: Item) -> list[str]:
    """~110 replies for one item; four items give >= 300 per benchmark."""
    letters = item.letters
    texts = item.options
    gold = item.answer or "A"
    other = next(x for x in letters if x != gold)
    replies = ["", " ", "\n", "  \n\t ", "none of the above", "I cannot tell from the video."]
    for x in (gold, other, "E", "F"):
        replies += [x, x.lower(), f"({x})", f"{x}.", f"{x})", f"{x}:", f" {x} ", f"**{x}**"]
        replies += [f"The answer is {x}.", f"the answer is {x.lower()}", f"Answer: {x}"]
        replies += [f"The best answer is ({x})", f"I choose {x}", f"Best option:({x}"]
        replies += [f"答案是{x}", f"选{x}", f"{x}\n\nBecause the video shows it."]
    for i, text in enumerate(texts[:3]):
        x = letters[i]
        replies += [text, text.lower(), f"{x}. {text}", f"({x}) {text}", f"The answer is {text}"]
        replies += [f"The answer is {x}. {text}", f"In the video, {text.lower()} as we can see."]
        replies += [f"I think it is {text} because the clip clearly shows that."]
    replies += [
        f"<think>Option {other} looks wrong, maybe {gold}.</think>{gold}",
        f"<think>\nA or C? Let me look.\n</think>\n\n{other}.",
        f"</think>{gold}",
        f"<think>unclosed reasoning about {gold}",
        f"<analysis>It is {other}.</analysis> {gold}",
        f"<think>{gold}</think>",
        "There is a cat in a box.",
        "Apple and Banana",
        "ABCD",
        "1",
        f"Option {gold} is correct.",
        f"Both {other} and {gold} are plausible, but {gold} is best.",
        f"The video shows a man. So the answer is {other}. Actually ({gold}).",
        f"{item.question}",
    ]
    return replies


def _lmms_verdict(name: str, mod: Any, doc: dict[str, Any], reply: str) -> Any:
    """lmms-eval's verdict: True/False, or SENTINEL where it picks at random / asks a judge."""
    text = _strip(reply)
    if name == "videomme":
        r = mod.videomme_process_results(doc, [text])["videomme_perception_score"]
        return r["score"] == 1.0
    if name == "mlvu":
        r = mod.mlvu_process_results(doc, [text])["mlvu_percetion_score"]
        return r["pred_answer"] == r["answer"]
    if name == "mvbench":
        return mod.mvbench_process_results(doc, [text])["mvbench_accuracy"]["score"] == 1
    if name == "longvideobench":
        r = mod.longvideobench_process_results(doc, [text])["lvb_acc"]
        return SENTINEL if r["parsed_pred"] == SENTINEL else r["parsed_pred"] == r["answer"]
    if name == "egoschema":
        letters = "ABCDE"
        choice = random.choice
        random.choice = lambda seq: SENTINEL  # type: ignore[assignment]
        try:
            pred, _ = mod.parse_multi_choice_response(text, *mod.get_multi_choice_info(doc)[::-1])
        finally:
            random.choice = choice  # type: ignore[assignment]
        if pred == SENTINEL:
            return SENTINEL
        r = mod.egoschema_process_results_generation(doc, [text])["score"]
        assert r["pred"] == letters.find(pred) if pred in letters else r["pred"] == -1
        return str(r["ground_truth"]) == str(r["pred"])
    if name == "tempcompass":
        r = mod.tempcompass_process_results_multi_choice(doc, [text])["avg_accuracy"]
        return SENTINEL if not r["match_success"] else r["rating"] == 1
    raise AssertionError(name)


def _strip(reply: str) -> str:
    from lmms_eval.api.reasoning import strip_reasoning_tags

    return strip_reasoning_tags(reply, TAGS)


@pytest.fixture
def no_randomness(utils: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """lmms-eval's random picks and LLM judge return the sentinel instead."""
    monkeypatch.setattr(utils["longvideobench"].random, "choice", lambda seq: SENTINEL)
    monkeypatch.setattr(
        utils["tempcompass"], "get_eval_result", lambda *a, **k: ("Incorrect (sentinel judge)", 0)
    )


@pytest.mark.parametrize("name", NAMES)
def test_prompts_equal_lmms_eval(
    name: str, items: dict[str, list[Item]], utils: dict[str, Any]
) -> None:
    yaml_of = {
        "videomme": "videomme/videomme.yaml",
        "longvideobench": "longvideobench/longvideobench_val_v.yaml",
        "mvbench": "mvbench/mvbench_action_antonym.yaml",
        "egoschema": "egoschema/egoschema_subset.yaml",
        "mlvu": "mlvu/mlvu_dev.yaml",
        "tempcompass": "tempcompass/_default_template_yaml",
    }
    doc_to_text = {
        "videomme": "videomme_doc_to_text",
        "longvideobench": "longvideobench_doc_to_text",
        "mvbench": "mvbench_doc_to_text",
        "egoschema": "egoschema_doc_to_text",
        "mlvu": "mlvu_doc_to_text",
        "tempcompass": "tempcompass_doc_to_text_multi_choice",
    }
    kwargs = _kwargs(yaml_of[name])
    bench = BENCHMARKS[name]
    for item in items[name]:
        expected = getattr(utils[name], doc_to_text[name])(lmms_doc(name, item), kwargs)
        assert bench.prompt(item).text == expected


@pytest.mark.parametrize("name", NAMES)
def test_verdicts_equal_lmms_eval(
    name: str, items: dict[str, list[Item]], utils: dict[str, Any], no_randomness: None
) -> None:
    bench = BENCHMARKS[name]
    n = agree = fallbacks = 0
    mismatches = []
    for item in items[name]:
        doc = lmms_doc(name, item)
        for reply in corpus(item):
            expected = _lmms_verdict(name, utils[name], doc, reply)
            if expected == SENTINEL:
                fallbacks += 1
                assert bench.parse(reply, item, fallback=_empty(bench)) == "", (name, reply)
                continue
            n += 1
            got = bench.is_correct(bench.parse(reply, item, fallback=_empty(bench)), item)
            if got == expected:
                agree += 1
            else:
                mismatches.append((reply, expected, got))
    assert n + fallbacks >= 300
    assert not mismatches, f"{name}: {len(mismatches)} of {n} differ, e.g. {mismatches[:5]}"


def _empty(bench: Any) -> str | None:
    return "empty" if "empty" in bench.fallbacks else None


def test_aggregates_equal_lmms_eval(items: dict[str, list[Item]], utils: dict[str, Any]) -> None:
    """MVBench leaves empty replies out of the denominator; MLVU divides by its 7 types."""
    mv, ml = BENCHMARKS["mvbench"], BENCHMARKS["mlvu"]
    for bench, mod, key in ((mv, utils["mvbench"], "mvbench_accuracy"), (ml, utils["mlvu"], None)):
        records, lmms_rows = [], []
        for k, item in enumerate(items[bench.name]):
            reply = ["", item.answer, "no idea", f"({item.answer})", " "][k % 5]
            pred = bench.parse(reply, item)
            records.append(
                {
                    "status": "ok",
                    "reply": reply,
                    "gold": item.answer,
                    "prediction": pred,
                    "correct": bench.is_correct(pred, item),
                    "categories": item.categories,
                }
            )
            doc = lmms_doc(bench.name, item)
            if key:
                lmms_rows.append(mod.mvbench_process_results(doc, [_strip(reply)])[key])
            else:
                lmms_rows.append(
                    mod.mlvu_process_results(doc, [_strip(reply)])["mlvu_percetion_score"]
                )
        ours = summarize(records, bench)["accuracy"]
        if key:  # lmms-eval aggregates each MVBench task, the group averages them
            tasks = sorted({i.categories["task"] for i in items["mvbench"]})
            per_task = [
                mod.mvbench_aggregate_results(
                    [r for r, i in zip(lmms_rows, items["mvbench"]) if i.categories["task"] == t]
                )
                for t in tasks
            ]
            expected = sum(per_task) / len(per_task)
        else:
            expected = mod.mlvu_aggregate_results_dev(lmms_rows)
        assert ours == pytest.approx(expected), bench.name


@pytest.mark.parametrize(
    "shape,bounds",
    [
        ((8, 240, 320), "qwen3_vl"),
        ((64, 720, 1280), "qwen3_vl"),
        ((32, 360, 640), "qwen3_5"),
        ((6, 64, 96), {"min_pixels": 3136, "max_pixels": 6272}),
        ((4, 256, 384), "qwen3_vl"),  # up-scaled to min_pixels: pixels compared
        ((4, 640, 1024), "qwen3_5"),  # down-scaled: pixels compared
    ],
)
def test_qwen3_frames_resized_as_lmms_eval(
    shape: tuple[int, int, int], bounds: Any, tmp_path: Path
) -> None:
    """craft-adapters' per-frame sizes and pixels equal qwen-vl-utils' `fetch_video` (what
    lmms-eval's Qwen3-VL / Qwen3.5 classes call, with their default bounds)."""
    import numpy as np
    from qwen_vl_utils.vision_process import fetch_video

    from craft_adapters.inputs import LMMS_VIDEO_PIXELS, _resize_frames, frame_size
    from craft_adapters.tiny import build_tiny_processor
    from craft_eval.fixtures import synthetic_frames, write_video

    kw = dict(LMMS_VIDEO_PIXELS[bounds]) if isinstance(bounds, str) else dict(bounds)
    kw = {k: v for k, v in kw.items() if v is not None}
    f, h, w = shape
    path = write_video(tmp_path / "v.mp4", synthetic_frames(f, size=(h, w)), fps=4)
    ref = fetch_video({"video": str(path), "nframes": f, **kw}, image_patch_size=16)
    assert tuple(ref.shape[2:]) == frame_size(h, w, f, factor=32, **kw)
    # same pixels: resize the decoded frames (read at their own size) the craft-adapters way
    side = {"resized_height": (h // 32) * 32, "resized_width": (w // 32) * 32}
    raw = fetch_video({"video": str(path), "nframes": f, **side}, image_patch_size=16)
    if tuple(raw.shape[2:]) != (h, w):
        return  # sides not multiples of 32: the decoded frames cannot be read back unresized
    frames = raw.round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    (ours,) = _resize_frames(build_tiny_processor("qwen3_vl"), [frames], kw) or [frames]
    assert np.array_equal(ours, ref.to(torch.uint8).permute(0, 2, 3, 1).numpy())
