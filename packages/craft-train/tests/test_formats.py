"""Data files in the formats people hold, in training: sampling strategies, mixture files
(the shipped curriculum included), `--check` naming every unusable row by file:line. The
readers themselves are tested in craft-adapters (`tests/test_data_files.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from craft_adapters.data_files import Example
from craft_adapters.data_samples import LLAVA_ROWS as LLAVA
from craft_adapters.data_samples import write_json_array as _json_array
from craft_adapters.data_samples import write_jsonl as _jsonl
from craft_train import cli
from craft_train.config import ConfigError, load_config
from craft_train.data import load_data, sample_rows


def _examples(n: int) -> list[Example]:
    return [Example(f"{i}.mp4", "p", "t", "s") for i in range(n)]


def test_sampling_strategies() -> None:
    rows = _examples(10)
    content = repr
    assert sample_rows(rows, "all", 0, content) == (rows, None)
    assert sample_rows(rows, "first:3", 0, content)[0] == rows[:3]
    assert sample_rows(rows, "end:25%", 0, content)[0] == rows[7:]  # ceil(2.5) = 3
    picked, note = sample_rows(rows, "random:4", 0, content)
    assert len(set(picked)) == 4 and picked == sorted(picked, key=rows.index) and note is None
    assert picked == sample_rows(rows, "random:4", 0, content)[0]
    assert {tuple(sample_rows(rows, "random:4", s, content)[0]) for s in range(6)} != {
        tuple(picked)
    }
    everything, note = sample_rows(rows, "random:50", 0, content)
    assert everything == rows and note is not None and "asks 50 rows, the file has 10" in note


def test_random_picks_depend_on_each_rows_content_only() -> None:
    """Leaving out a row that was not picked (the audit's clean copy) keeps every pick; the
    picks follow the rows, wherever they lie in the file."""
    rows = _examples(40)
    picked, _ = sample_rows(rows, "random:10", 3, repr)
    other = next(r for r in rows if r not in picked)
    assert sample_rows([r for r in rows if r is not other], "random:10", 3, repr)[0] == picked
    assert sorted(sample_rows(rows[::-1], "random:10", 3, repr)[0], key=rows.index) == picked


def test_bad_sampling_strategy_is_a_config_error(tmp_path: Path) -> None:
    data = _config(tmp_path, [{"json_path": "a.json", "sampling_strategy": "some:3"}])
    with pytest.raises(ConfigError, match=r"datasets\.0\.sampling_strategy.*'some:3'"):
        load_config(data=data, stage=1)


def _config(tmp_path: Path, datasets: list, **mixture) -> dict:
    return {
        "stage": 1,
        "model": {"backbone": "unused"},
        "data": {"mixture": {"root": str(tmp_path), "datasets": datasets, **mixture}},
        "optim": {"lr": 1e-3},
        "train": {"output_dir": str(tmp_path / "out")},
    }


def _write_sources(tmp_path: Path) -> None:
    _json_array(tmp_path / "llava.json", LLAVA)
    rows = [{"messages": [{"role": "user", "content": f"<video>q{i}"},
                          {"role": "assistant", "content": f"a{i}"}], "videos": [f"l{i}.mp4"]}
            for i in range(20)]  # fmt: skip
    _jsonl(tmp_path / "lf.jsonl", rows)


def test_mixture_file_reads_samples_caps_and_mixes_durations(tmp_path: Path) -> None:
    _write_sources(tmp_path)
    mixture = {
        "datasets": [
            {"json_path": "llava.json", "duration": "long"},
            {
                "json_path": "lf.jsonl",
                "sampling_strategy": "first:50%",
                "source": "lf",
                "duration": "short",
            },
        ],
        "default_cap": 8,
        "duration_mix": {"long": 0.5, "short": 0.5},
    }
    (tmp_path / "mix.yaml").write_text(yaml.safe_dump(mixture))  # paths relative to the file
    cfg = _config(tmp_path, [])
    cfg["data"]["mixture"] = str(tmp_path / "mix.yaml")
    load = load_data(load_config(data=cfg, stage=1))
    assert len(load.problems) == 6
    long = [e for e in load.examples if e.source == "0_30_s_academic_v0_1"]
    short = [e for e in load.examples if e.source == "lf"]
    # lf: first 10 of 20 rows, capped at 8 (seeded subset of those 10); the one llava row;
    # then both buckets resampled to half of the 9 rows: round(4.5) = 4 each.
    assert len(long) == 4 and len(set(long)) == 1
    assert len(short) == 4 and {e.target for e in short} <= {f"a{i}" for i in range(10)}
    assert load.examples == load_data(load_config(data=cfg, stage=1)).examples


def test_check_lists_every_unusable_row_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_sources(tmp_path)
    (tmp_path / "l0.mp4").write_bytes(b"not checked by --check")
    data = _config(tmp_path, [{"json_path": "llava.json"}, {"json_path": "lf.jsonl"}])
    data["train"]["deepspeed"] = None
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    assert cli.main(["stage1", "--check", "--config", str(tmp_path / "c.yaml")]) == 0
    out = capsys.readouterr().out
    assert "21 examples" in out and "rows that cannot be used: 26" in out  # 6 bad + 20 missing
    for line in (3, 4, 5, 6, 7, 8):
        assert f"llava.json:{line}: " in out
    assert f"lf.jsonl:2: video {tmp_path / 'l1.mp4'} does not exist" in out
    assert "lf.jsonl:1:" not in out  # its video exists


def test_shipped_curriculum_runs_on_the_releases_file_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user with the data under $CRAFT_DATA, laid out as the releases are, runs one
    command: every file the stage-2 mixture names is read, capped, and duration-mixed."""
    from craft_train.config import load_mixture

    stage2 = load_mixture("craft_stage2.yaml")
    assert len(stage2.datasets) == 27 and stage2.duration_mix is not None
    monkeypatch.setenv("CRAFT_DATA", str(tmp_path))
    for entry in stage2.datasets:
        path = stage2.dataset_path(entry)
        path.parent.mkdir(parents=True, exist_ok=True)
        row = {**LLAVA[0], "video": f"{path.stem}.mp4"}
        (path.parent / f"{path.stem}.mp4").write_bytes(b"")
        _json_array(path, [row])
    argv = ["stage2", "--check", "--config", "qwen3_5_4b_stage2.yaml",
            "--set", f"model.init_from={tmp_path}"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    # 27 files of one row; buckets short 7, medium 13, long 7 rows, resampled to
    # round(27 x 0.31 / 0.99) = 8, round(27 x 0.35 / 0.99) = 10, round(27 x 0.33 / 0.99) = 9
    assert "27 examples" in out and "rows that cannot be used: 0" in out
    for source in ("academic", "youtube", "nextqa", "perceptiontest", "longvitu"):
        assert f"  {source}: " in out
    monkeypatch.delenv("CRAFT_DATA")
    assert cli.main(argv) == 2
    assert "is an environment variable in it unset?" in capsys.readouterr().err


def test_shipped_stage1_names_the_eight_caption_corpora() -> None:
    from craft_train.config import load_mixture

    stage1 = load_mixture("craft_stage1.yaml")
    assert stage1.default_cap == 30000 and stage1.root == "${CRAFT_DATA}"
    assert [d.source for d in stage1.datasets] == [
        "webvid", "vatex_en", "vatex_zh", "didemo", "msrvtt", "msvd", "lovr", "ucf_crime"
    ]  # fmt: skip
    assert {d.format for d in stage1.datasets} == {"caption"}


def test_random_sampling_is_the_same_wherever_the_data_lies(tmp_path: Path) -> None:
    picked = []
    for where in ("a", "b"):
        root = tmp_path / where
        root.mkdir()
        _write_sources(root)
        entry = {"json_path": "lf.jsonl", "sampling_strategy": "random:5"}
        cfg = load_config(data=_config(root, [entry], default_cap=None), stage=1)
        picked.append([e.target for e in load_data(cfg).examples])
    assert len(picked[0]) == 5 and picked[0] == picked[1]


def test_duration_mix_refuses_files_without_a_duration(tmp_path: Path) -> None:
    _write_sources(tmp_path)
    data = _config(tmp_path, [{"json_path": "lf.jsonl", "duration": "short"}],
                   duration_mix={"short": 1.0})  # fmt: skip
    data["data"]["manifests"] = [str(tmp_path / "llava.json")]
    with pytest.raises(ConfigError, match=r"data\.manifests have no duration"):
        load_data(load_config(data=data, stage=1))


def _lf_rows(n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"<video>q{i}"},
                          {"role": "assistant", "content": f"a{i}"}], "videos": [f"l{i}.mp4"]}
            for i in range(n)]  # fmt: skip


def _check(tmp_path: Path, datasets: list, capsys: pytest.CaptureFixture[str]) -> tuple:
    """`--check` of a config with these datasets -> (exit code, stdout, stderr); the videos
    `l0.mp4` ... `l4.mp4` exist (not read)."""
    for i in range(5):
        (tmp_path / f"l{i}.mp4").write_bytes(b"")
    data = _config(tmp_path, datasets, default_cap=None)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    code = cli.main(["stage1", "--check", "--config", str(tmp_path / "c.yaml")])
    out, err = capsys.readouterr()
    return code, out, err


def test_sampling_counts_file_rows_as_llava_onevision_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _lf_rows(5)
    rows[0]["videos"] = rows[2]["videos"] = rows[3]["videos"] = []  # 3 of 5 rows unusable
    _jsonl(tmp_path / "lf.jsonl", rows)
    code, out, _ = _check(tmp_path, [{"json_path": "lf.jsonl", "sampling_strategy": "first:2"},
                                     {"json_path": "lf.jsonl", "sampling_strategy": "end:9",
                                      "source": "end"}], capsys)  # fmt: skip
    assert code == 0
    # first:2 is file rows 1-2: row 1 cannot be used (listed), row 2 is the one example
    assert "  lf: 1\n" in out and "  end: 2\n" in out
    assert "note: lf.jsonl: sampling_strategy end:9 asks 9 rows, the file has 5; all taken" in out
    assert out.count("lf.jsonl:1: no video") == 2 and "lf.jsonl:3: no video" in out


@pytest.mark.parametrize("strategy", ["first:0", "end:0", "random:0", "first:00"])
def test_a_strategy_taking_no_row_is_refused_by_name(strategy: str, tmp_path: Path) -> None:
    data = _config(tmp_path, [{"json_path": "a.json", "sampling_strategy": strategy}])
    with pytest.raises(
        ConfigError, match=rf"datasets\.0\.sampling_strategy.*'{strategy}' takes no row"
    ):
        load_config(data=data, stage=1)


def test_random_sampling_follows_the_rows_not_the_file_path_or_layout(tmp_path: Path) -> None:
    rows = _lf_rows(20)
    _jsonl(tmp_path / "lf.jsonl", rows)
    _json_array(tmp_path / "clean_copy.json", rows)  # the same rows, another path and layout

    def picked(path: str, **entry: object) -> list[str]:
        data = _config(tmp_path, [{"json_path": path, "sampling_strategy": "random:25%", **entry}],
                       default_cap=None)  # fmt: skip
        return [e.target for e in load_data(load_config(data=data, stage=1)).examples]

    assert len(picked("lf.jsonl")) == 5 and picked("lf.jsonl") == picked("clean_copy.json")
    by_seed = {tuple(picked("lf.jsonl", seed=s)) for s in range(4)}
    assert len(by_seed) > 1  # an explicit seed picks other rows


def test_a_corrupt_jsonl_line_is_one_row_left_out_and_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _jsonl(tmp_path / "lf.jsonl", _lf_rows(3))
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1][:30], lines[2]]) + "\n")
    code, out, _ = _check(tmp_path, [{"json_path": "lf.jsonl"}], capsys)
    assert code == 0 and "2 examples after the mixture" in out
    assert f"  {path}:2: not valid JSON (" in out


def test_check_lists_every_row_when_none_is_usable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _lf_rows(3)
    for row in rows:
        row["videos"] = []
    path = _jsonl(tmp_path / "lf.jsonl", rows)
    code, out, err = _check(tmp_path, [{"json_path": "lf.jsonl"}], capsys)
    assert code == 2
    assert [f"  {path}:{i}: no video (field 'videos' missing or empty)" for i in (1, 2, 3)] == [
        line for line in out.splitlines() if line.startswith("  ")
    ]
    assert err == ("craft-train: data: no usable example in the data files (all 3 rows listed "
                   "above cannot be used)\n")  # fmt: skip


def test_an_empty_data_file_says_it_is_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "lf.jsonl").write_text("")
    code, _, err = _check(tmp_path, [{"json_path": "lf.jsonl"}], capsys)
    assert (
        code == 2 and err == f"craft-train: {tmp_path / 'lf.jsonl'}: the file is empty (no rows)\n"
    )


def test_llamafactory_files_train_with_their_dataset_info_mapping(tmp_path: Path) -> None:
    """A LLaMA-Factory data entry as dataset_info.json gives it (columns, tags), in a mixture."""
    rows = [{"chat": [{"who": "asker", "said": "<video>What?"}, {"who": "bot", "said": "This."}],
             "vids": ["v.mp4"], "sys": "Short answers."}]  # fmt: skip
    _json_array(tmp_path / "lf.json", rows)
    entry = {"json_path": "lf.json", "format": "sharegpt",
             "columns": {"messages": "chat", "videos": "vids", "system": "sys"},
             "tags": {"role_tag": "who", "content_tag": "said", "user_tag": "asker",
                      "assistant_tag": "bot"}}  # fmt: skip
    (ex,) = load_data(load_config(data=_config(tmp_path, [entry]), stage=1)).examples
    assert (ex.prompt, ex.target, ex.system) == ("What?", "This.", "Short answers.")
    with pytest.raises(ConfigError, match=r"datasets\.0\.columns.*unknown \['chats'\]"):
        load_config(data=_config(tmp_path, [{**entry, "columns": {"chats": "c"}}]), stage=1)
    with pytest.raises(ConfigError, match=r"datasets\.0.*need format: sharegpt"):
        load_config(data=_config(tmp_path, [{**entry, "format": "llava"}]), stage=1)
