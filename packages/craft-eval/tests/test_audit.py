"""`craft-eval audit`: training files (LLaVA / LLaMA-Factory / a mixture) against benchmark
fixtures in their distributed layout; overlap by video name and by file content."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from craft_eval.cli import main
from craft_eval.fixtures import write_fixture, write_video
from craft_eval.tasks import get_benchmark

pytestmark = pytest.mark.filterwarnings("ignore:MVBench. task files missing")


def _conv(video: str) -> dict:
    return {
        "video": video,
        "conversations": [
            {"from": "human", "value": "<image>\nQ?"},
            {"from": "gpt", "value": "A."},
        ],
        "data_source": "academic",
    }


@pytest.fixture
def setup(tmp_path: Path) -> dict:
    bench = tmp_path / "bench"
    for name in ("videomme", "mvbench"):
        write_fixture(name, bench / name, num_items=2, num_frames=2)
    mme = sorted({i.video for i in get_benchmark("videomme").load(bench / "videomme")})
    mvb = sorted({i.video for i in get_benchmark("mvbench").load(bench / "mvbench")})
    train = tmp_path / "train"
    (train / "clips").mkdir(parents=True)
    same_name = train / "clips" / Path(mme[0]).name  # another file, the benchmark's name
    write_video(same_name, num_frames=2, size=(96, 96), seed=99)
    shutil.copy(mvb[0], train / "clips" / "renamed.mp4")  # the benchmark's bytes, new name
    write_video(train / "clips" / "own.mp4", num_frames=2, size=(96, 96), seed=98)
    rows = [
        _conv(f"clips/{same_name.name}"),
        _conv("clips/renamed.mp4"),
        _conv("clips/own.mp4"),
        {"id": "img", "image": "x.jpg", "conversations": []},
    ]
    llava = train / "llava.json"
    llava.write_text("[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n")
    factory = train / "lf.jsonl"
    lf_rows = [{"messages": [{"role": "user", "content": "<video>q"},
                             {"role": "assistant", "content": "a"}], "videos": ["clips/own.mp4"]}]  # fmt: skip
    factory.write_text(json.dumps(lf_rows[0]) + "\n")
    return {"bench": bench, "llava": llava, "factory": factory, "rows": rows, "mme": mme}


def _audit(*args: str) -> list[str]:
    return ["audit", *args, "-b", "videomme", "mvbench", "--no-progress"]


def test_audit_finds_name_and_content_overlap_and_writes_clean_files(
    setup: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    llava, factory, bench = setup["llava"], setup["factory"], setup["bench"]
    out = tmp_path / "clean"
    argv = _audit(str(llava), str(factory), "--data-root", str(bench), "--write-clean", str(out))
    assert main(argv) == 1
    text = capsys.readouterr().out
    # row 1 names vid000.mp4 (other bytes); row 2 copies an MVBench clip under a new name,
    # and the fixtures' clip i has the same bytes in every benchmark: VideoMME has it too
    assert "| videomme | academic | 3 | 1 | 1 |" in text
    assert "| mvbench | academic | 3 | 0 | 1 |" in text
    assert "| videomme | lf | 1 | 0 | 0 |" in text
    assert f"overlap: {llava}:2: " in text and "(same name)" in text
    assert f"overlap: {llava}:3: " in text and "(same content)" in text
    # The clean copy keeps the other rows as they were (the image-only row too) ...
    assert json.loads((out / "llava.json").read_text()) == setup["rows"][2:]
    assert (out / "lf.jsonl").read_text() == factory.read_text()
    # ... and its mixture resolves the videos where the originals did: a second audit passes.
    mixture = yaml.safe_load((out / "mixture.yaml").read_text())
    assert [d["video_root"] for d in mixture["datasets"]] == [str(llava.parent)] * 2
    assert main(_audit(str(out / "mixture.yaml"), "--data-root", str(bench))) == 0


def test_without_hashing_only_names_match(setup: dict, capsys: pytest.CaptureFixture) -> None:
    argv = _audit(str(setup["llava"]), "--data-root", str(setup["bench"]), "--no-hash")
    assert main(argv) == 1
    text = capsys.readouterr().out
    assert "| mvbench | academic | 3 | 0 | 0 |" in text  # the renamed copy goes unseen
    assert "| videomme | academic | 3 | 1 | 0 |" in text


def test_clean_data_exits_0(setup: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(_audit(str(setup["factory"]), "--data-root", str(setup["bench"]))) == 0
    assert "| mvbench | lf | 1 | 0 | 0 |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["missing.json"], "training file missing.json does not exist"),
        (["{llava}", "--write-clean", "{train}"], "would overwrite the training file"),
        (["{llava}", "m.yaml"], "one mixture YAML"),
    ],
)
def test_bad_input_exits_2_naming_it(
    setup: dict, extra: list, message: str, capsys: pytest.CaptureFixture
) -> None:
    fill = {"llava": setup["llava"], "train": setup["llava"].parent}
    args = [a.format(**fill) for a in extra]
    assert main(["audit", *args, "-b", "videomme", "--data-root", str(setup["bench"])]) == 2
    assert message in capsys.readouterr().err


def test_every_row_is_audited_a_two_video_row_too(
    setup: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """craft-train cannot use a two-video row, but a trainer taking two videos per row
    would: the audit flags it, and the clean copy leaves it out."""
    train = setup["llava"].parent
    two = {**_conv(["clips/own.mp4", f"clips/{Path(setup['mme'][0]).name}"]), "id": "two"}
    rows = [two, _conv("clips/own.mp4")]
    path = train / "two.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "clean"
    argv = _audit(str(path), "--data-root", str(setup["bench"]), "--write-clean", str(out))
    assert main(argv) == 1
    text = capsys.readouterr().out
    assert (
        f"overlap: {path}:1: {train / 'clips' / Path(setup['mme'][0]).name} is in videomme" in text
    )
    assert (out / "two.jsonl").read_text() == json.dumps(rows[1]) + "\n"


def test_a_row_that_is_not_json_is_listed_and_left_out_of_the_clean_copy(
    setup: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    factory = setup["factory"]
    good = factory.read_text()
    factory.write_text(good + good[:25] + "\n" + good)
    out = tmp_path / "clean"
    argv = _audit(str(factory), "--data-root", str(setup["bench"]), "--write-clean", str(out))
    assert main(argv) == 0  # nothing overlaps
    text = capsys.readouterr().out
    assert "| videomme | lf | 3 | 0 | 0 |" in text
    assert f"not checked (not JSON; no trainer reads it): {factory}:2: not valid JSON (" in text
    assert "without the 0 overlapping rows and the 1 not read" in text
    assert (out / "lf.jsonl").read_text() == good + good
