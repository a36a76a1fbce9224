"""Loaders read tiny fixtures written in each benchmark's real distributed format."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from craft_eval.fixtures import write_fixture
from craft_eval.tasks import BENCHMARKS, get_benchmark


@pytest.mark.filterwarnings("ignore:MVBench. task files missing")
@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_fixture_loads_with_gold_and_existing_videos(name: str, tmp_path: Path) -> None:
    root = write_fixture(name, tmp_path / name, num_items=4, num_frames=4)
    bench = get_benchmark(name)
    items = bench.load(root)
    assert len(items) == (8 if name == "mvbench" else 4)
    assert len({i.id for i in items}) == len(items)
    for item in items:
        assert Path(item.video).exists(), item.video
        assert item.answer in item.letters
        prompt = bench.prompt(item)
        assert item.question in prompt.text
        assert prompt.max_new_tokens >= 16
        for option in item.options:
            assert option in prompt.text
    golds = {i.answer for i in items}
    assert len(golds) > 1  # fixtures vary the gold letter


def test_videomme_record_fields_and_video_extensions(tmp_path: Path) -> None:
    root = write_fixture("videomme", tmp_path, num_items=2, num_frames=2)
    (root / "data" / "vid001.mp4").rename(root / "data" / "vid001.mkv")
    items = get_benchmark("videomme").load(root)
    assert items[0].categories == {
        "duration": "short",
        "domain": "Knowledge",
        "sub_category": "Humanity & History",
        "task_type": "Counting Problem",
    }
    assert items[0].options[0] in ("Right.", "Left.", "Down.", "Up.")  # letter prefix removed
    assert items[1].video.endswith("vid001.mkv")
    prompt = get_benchmark("videomme").prompt(items[0], "original")
    assert prompt.text.endswith("The best answer is:")


def test_videomme_missing_video_still_yields_item(tmp_path: Path) -> None:
    root = write_fixture("videomme", tmp_path, num_items=1, num_frames=2)
    (root / "data" / "vid000.mp4").unlink()
    (item,) = get_benchmark("videomme").load(root)
    assert item.video.endswith("vid000.mp4") and not Path(item.video).exists()


def test_longvideobench_parquet_form_with_na_options(tmp_path: Path) -> None:
    rows = [
        {
            "video_id": "soNQYQXrx_A",
            "id": "soNQYQXrx_A_1",
            "question": "What happens to his clothes?",
            "option0": "He puts on a denim jacket.",
            "option1": "He is shirtless.",
            "option2": "He puts on a hat.",
            "option3": "N/A",
            "option4": "N/A",
            "correct_choice": 1,
            "question_category": "TAA",
            "duration_group": 600,
            "duration": 563.37,
            "video_path": "soNQYQXrx_A.mp4",
            "subtitle_path": "soNQYQXrx_A_en.json",
        }
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "validation-00000-of-00001.parquet")
    (item,) = get_benchmark("longvideobench").load(tmp_path)
    assert item.options == ["He puts on a denim jacket.", "He is shirtless.", "He puts on a hat."]
    assert item.answer == "B"
    assert item.categories == {"duration_group": "600", "question_category": "TAA"}
    assert item.video == str(tmp_path / "videos" / "soNQYQXrx_A.mp4")
    text = get_benchmark("longvideobench").prompt(item).text
    assert "C. He puts on a hat.\nAnswer with the option's letter" in text


def test_mvbench_prefix_segment_and_original_protocol(tmp_path: Path) -> None:
    (tmp_path / "json").mkdir()
    record = {
        "video": "ZS9XR.mp4",
        "question": "What happened after the person took the food?",
        "candidates": ["Ate the medicine.", "Tidied up the blanket.", "Took the box."],
        "answer": "Took the box.",
        "start": 11.1,
        "end": 19.6,
    }
    (tmp_path / "json" / "action_sequence.json").write_text(json.dumps([record]))
    bench = get_benchmark("mvbench")
    with pytest.warns(UserWarning, match="missing"):
        (item,) = bench.load(tmp_path)
    assert item.answer == "C"
    assert item.segment == (11.1, 19.6)
    assert item.video == str(tmp_path / "video" / "star/Charades_segment" / "ZS9XR.mp4")
    lmms = bench.prompt(item)
    assert lmms.text == (
        "Question:What happened after the person took the food?\nOption:\n(A) Ate the medicine.\n"
        "(B) Tidied up the blanket.\n(C) Took the box.\nOnly give the best option.\n"
    )
    original = bench.prompt(item, "original")
    assert original.assistant_prefix == "Best option:("
    assert original.system is not None and "Carefully watch the video" in original.system
    assert bench.parse("C) Took the box.", item, "original") == "C"
    with pytest.raises(ValueError, match="episodic_reasoning"):
        bench.load(tmp_path, subset="episodic_reasoning")


def test_egoschema_full_set_has_no_answers_and_writes_submission(tmp_path: Path) -> None:
    from craft_eval.tasks import write_submission

    rows = [
        {
            "question_idx": "uid-1",
            "question": "What is C doing?",
            "video_idx": "uid-1",
            "option": ["A. a", "B. b", "C. c", "D. d", "E. e"],
            "answer": None,
        }
    ]
    (tmp_path / "MC").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "MC" / "test-00000-of-00001.parquet")
    bench = get_benchmark("egoschema")
    (item,) = bench.load(tmp_path, subset="full")
    assert item.answer == "" and item.options[2] == "c"
    assert bench.is_correct("C", item) is None
    out = write_submission(
        [{"id": "uid-1", "status": "ok", "prediction": "C"}], tmp_path / "sub.json"
    )
    assert json.loads(out.read_text()) == {"uid-1": 2}


def test_mlvu_and_tempcompass_fields(tmp_path: Path) -> None:
    root = write_fixture("mlvu", tmp_path / "mlvu", num_items=2, num_frames=2)
    item = get_benchmark("mlvu").load(root)[0]
    assert (
        get_benchmark("mlvu")
        .prompt(item)
        .text.endswith("Only give the best option.\nBest option: (")
    )
    assert item.categories["task_type"] == "plotQA"
    root = write_fixture("tempcompass", tmp_path / "tc", num_items=3, num_frames=2)
    items = get_benchmark("tempcompass").load(root)
    assert items[2].video.endswith("_reverse.mp4")
    assert items[0].categories == {"dim": "action"}
    assert (
        get_benchmark("tempcompass")
        .prompt(items[0])
        .text.endswith("\nPlease directly give the best option:")
    )


def test_unknown_benchmark_and_missing_annotations(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="known"):
        get_benchmark("nextqa")
    with pytest.raises(FileNotFoundError, match="Video-MME"):
        get_benchmark("videomme").load(tmp_path)
    assert get_benchmark("Video-MME").name == "videomme"
