"""`craft-compress` (issue 41): a video library compressed once, resumed, sharded, refused.

The payloads are checked against the loop a user writes by hand (read_video, build_inputs,
wrap(...).compress_videos) on a tiny Qwen2.5-VL and a tiny saved CRAFT module; two worker
processes (RANK / WORLD_SIZE as torchrun sets them) against one process, bit for bit, with a
worker killed (SIGKILL) mid-run; a full disk on a real tmpfs (skipped where mounting is not
permitted).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from adapters_testkit import make_frames

from craft_adapters import build_inputs, load_compressed_video, read_video, wrap
from craft_adapters.compress_cli import main
from craft_adapters.compress_library import INDEX, SUFFIX, list_videos
from craft_adapters.compressed import check_made_with, checkpoint_sha256
from craft_adapters.tiny import build_tiny_vlm
from craft_adapters.video import write_video
from craft_core import CraftCompressor, CraftConfig
from craft_testkit.filesystem import PAGE, fill_filesystem, small_filesystem

CLIPS = 6  # two workers take 3 each (+ the broken file)


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("library")
    _, processor = build_tiny_vlm("qwen2_5_vl", root / "model")
    processor.save_pretrained(root / "model")
    torch.manual_seed(0)
    CraftCompressor(CraftConfig(hidden_size=64)).save_pretrained(root / "craft")
    for i in range(CLIPS):
        write_video(root / "videos" / f"clip{i}.mp4", make_frames(4 + i % 3, seed=i), fps=2)
    (root / "videos" / "broken.mp4").write_bytes(b"not a video" * 50)
    return {"root": root, "model": root / "model", "craft": root / "craft"}


def _argv(lib: dict[str, Path], out: Path, *extra: str, videos: Any = None) -> list[str]:
    videos = videos or lib["root"] / "videos"
    base = ["--videos", str(videos), "--model", str(lib["model"]), "--craft", str(lib["craft"])]
    return [
        *base,
        "--output",
        str(out),
        "--threshold",
        "0.8",
        "--device",
        "cpu",
        "--no-progress",
        *extra,
    ]


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob(f"*{SUFFIX}"))}


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / INDEX).read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(library: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process over the whole folder."""
    out = tmp_path_factory.mktemp("reference") / "out"
    assert main(_argv(library, out)) == 1  # the broken file is listed: not every video done
    return out


def test_payloads_are_the_hand_written_loop(library: dict[str, Path], reference: Path) -> None:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(library["model"]).eval()
    processor = AutoProcessor.from_pretrained(library["model"])
    craft = CraftCompressor.from_pretrained(library["craft"]).eval()
    wrapped = wrap(model, craft, threshold=0.8)
    rows = _rows(reference)
    assert [Path(r["source"]).name for r in rows] == sorted(
        ["broken.mp4", *[f"clip{i}.mp4" for i in range(CLIPS)]]
    )
    broken = rows[0]
    assert broken["status"] == "unreadable" and "broken.mp4" in broken["reason"]
    assert broken["output"] is None
    digest = checkpoint_sha256(craft)
    for row in rows[1:]:
        frames, fps = read_video(row["source"], fps=2.0, max_frames=64)
        (want,) = wrapped.compress_videos(**build_inputs(processor, frames, fps, ""))
        got = load_compressed_video(reference / row["output"])
        assert torch.equal(got.features, want.features) and torch.equal(got.coords, want.coords)
        assert got.grid == want.grid
        source = Path(row["source"]).read_bytes()
        assert row["sha256"] == hashlib.sha256(source).hexdigest() == got.metadata["source_sha256"]
        k, n = want.features.shape[0], want.num_tokens
        assert (row["status"], row["tokens"], row["tokens_before"]) == ("done", k, n)
        assert row["ratio"] == n / k and k < n and row["seconds"] > 0
        check_made_with(got, model_type="qwen2_5_vl", hidden_size=64, craft_sha256=digest)
        with pytest.raises(ValueError, match="craft_sha256"):
            check_made_with(got, craft_sha256="0" * 64)
    old = load_compressed_video(reference / rows[1]["output"])
    old = type(old)(old.features, old.coords, old.grid, {"model_type": "qwen2_5_vl"})
    with pytest.raises(ValueError, match="has no hidden_size"):  # a file from before 0.6
        check_made_with(old, model_type="qwen2_5_vl", hidden_size=64)


def test_checkpoint_digest_follows_the_weights(library: dict[str, Path]) -> None:
    craft = CraftCompressor.from_pretrained(library["craft"])
    again = CraftCompressor.from_pretrained(library["craft"])
    assert checkpoint_sha256(craft) == checkpoint_sha256(again)
    with torch.no_grad():
        next(again.parameters()).view(-1)[0] += 1e-6
    assert checkpoint_sha256(craft) != checkpoint_sha256(again)


def test_lists_globs_and_per_row_sampling(library: dict[str, Path], tmp_path: Path) -> None:
    videos = library["root"] / "videos"
    rows = [
        {"path": str(videos / "clip1.mp4"), "frames": 2},
        {"path": "../videos/clip0.mp4", "fps": 1},
        {"path": "gone.mp4"},
    ]
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (lists / "a.csv").write_text(
        f"path,fps,frames\n{videos / 'clip1.mp4'},,2\n../videos/clip0.mp4,1,\ngone.mp4,,\n"
    )
    (tmp_path / "videos").symlink_to(videos)
    from_jsonl = list_videos(str(lists / "a.jsonl"), 2.0, 64)
    assert from_jsonl == list_videos(str(lists / "a.csv"), 2.0, 64)
    assert {(Path(e.source).name, e.fps, e.frames) for e in from_jsonl} == {
        ("gone.mp4", 2.0, 64),
        ("clip0.mp4", 1.0, 64),
        ("clip1.mp4", 2.0, 2),
    }
    assert from_jsonl == sorted(from_jsonl)
    assert str(tmp_path / "videos" / "clip0.mp4") in {e.source for e in from_jsonl}  # as named
    globbed = list_videos(str(videos / "clip[01].mp4"), 2.0, 64)
    assert [Path(e.source).name for e in globbed] == ["clip0.mp4", "clip1.mp4"]
    out = tmp_path / "out"
    assert main(_argv(library, out, videos=lists / "a.jsonl")) == 1
    by_name = {Path(r["source"]).name: r for r in _rows(out)}
    assert by_name["gone.mp4"]["status"] == "missing"
    assert "no such file" in by_name["gone.mp4"]["reason"]
    two = load_compressed_video(out / by_name["clip1.mp4"]["output"])
    assert two.metadata["frames"] == by_name["clip1.mp4"]["sampled_frames"] == 2
    one = load_compressed_video(out / by_name["clip0.mp4"]["output"])
    assert one.metadata["fps"] == 1.0 and one.grid[0] == 1  # 2 s at 1 fps: 2 frames, 1 step


def test_a_rerun_keeps_what_is_verified_and_redoes_the_rest(
    library: dict[str, Path], tmp_path: Path
) -> None:
    videos = tmp_path / "videos"
    videos.mkdir()
    for i in range(4):
        (videos / f"clip{i}.mp4").write_bytes(
            (library["root"] / f"videos/clip{i}.mp4").read_bytes()
        )
    out = tmp_path / "out"
    assert main(_argv(library, out, videos=videos)) == 0
    first, seconds = _files(out), [r["seconds"] for r in _rows(out)]
    names = sorted(first)  # names[i] is clip{i}'s payload
    (out / names[0]).write_bytes(first[names[0]][:100])  # a partial file
    (out / names[1]).unlink()
    (out / f".{names[2]}.tmp").write_bytes(b"left by a killed run")
    write_video(videos / "clip2.mp4", make_frames(5, seed=9), fps=2)  # the source changed
    kept = (out / names[3]).stat().st_mtime_ns
    assert main(_argv(library, out, videos=videos)) == 0
    rows = _rows(out)
    assert [r["reused"] for r in rows] == [False, False, False, True]
    assert rows[3]["seconds"] == seconds[3]  # the time the payload cost when it was made
    again = _files(out)
    assert again[names[0]] == first[names[0]] and again[names[1]] == first[names[1]]
    assert again[names[2]] != first[names[2]]  # made from the new bytes
    assert rows[2]["sha256"] == hashlib.sha256((videos / "clip2.mp4").read_bytes()).hexdigest()
    assert (out / names[3]).stat().st_mtime_ns == kept and again[names[3]] == first[names[3]]
    assert not list(out.glob(".*.tmp"))
    assert main(_argv(library, out, videos=videos)) == 0  # nothing to do now
    assert all(r["reused"] for r in _rows(out)) and _files(out) == again
    assert [r["seconds"] for r in _rows(out)] == [r["seconds"] for r in rows]  # still carried


def _worker(lib: dict[str, Path], out: Path, rank: int, world: int) -> subprocess.Popen:
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}
    code = "import sys; from craft_adapters.compress_cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [sys.executable, "-c", code, *_argv(lib, out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_workers_equal_one_process_and_survive_a_kill(
    library: dict[str, Path], reference: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    ranks = [_worker(library, out, r, 2) for r in range(2)]
    part = out / "shards" / "index.rank1-of-2.jsonl.part"
    deadline = time.monotonic() + 120
    while not (part.is_file() and part.read_text().count("\n") >= 1):
        assert time.monotonic() < deadline and ranks[1].poll() is None, ranks[1].stderr
        time.sleep(0.02)
    ranks[1].send_signal(signal.SIGKILL)  # rank 1 has made one of its 4 rows
    assert ranks[1].wait() == -signal.SIGKILL
    assert ranks[0].wait(timeout=120) == 0, ranks[0].communicate()
    assert not (out / INDEX).exists()  # rank 1's shard is missing: nothing merged
    assert not (out / "shards" / "index.rank1-of-2.jsonl").exists()  # killed mid-share
    for payload in out.glob(f"*{SUFFIX}"):
        load_compressed_video(payload)  # whatever is under a final name is whole
    assert len(_files(out)) < len(_files(reference))
    reruns = [_worker(library, out, r, 2) for r in range(2)]
    codes = [p.wait(timeout=180) for p in reruns]
    # a rank that merged says 1 video failed (exit 1); when both finish at once both merge
    # (the same bytes) and both say so; a rank that did not merge exits 0
    assert 1 in codes and set(codes) <= {0, 1}, [p.communicate() for p in reruns]
    assert _files(out) == _files(reference)  # bit for bit
    strip = ("seconds", "reused")
    got = [{k: v for k, v in r.items() if k not in strip} for r in _rows(out)]
    assert got == [{k: v for k, v in r.items() if k not in strip} for r in _rows(reference)]
    assert not list(out.glob(".*.tmp"))


def test_a_full_disk_stops_cleanly_and_the_rerun_finishes(
    library: dict[str, Path], reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    sizes = [-(-len(b) // PAGE) * PAGE for b in _files(reference).values()]
    with small_filesystem(tmp_path / "disk", 1 << 20) as disk:
        out = disk / "out"
        # room for the settings and shard pages and the first payload, not the second
        filler = fill_filesystem(disk, leave=3 * PAGE + sizes[0])
        assert main(_argv(library, out)) == 1
        message = capsys.readouterr().err.strip().splitlines()[-1]
        assert "disk full writing" in message and "run the same command again" in message
        made = _files(out)
        assert 0 < len(made) < len(sizes)
        assert all(_files(reference)[n] == b for n, b in made.items())
        assert not list(out.glob(".*.tmp")) and not (out / INDEX).exists()
        part = out / "shards" / "index.rank0-of-1.jsonl.part"
        assert all(json.loads(line) for line in part.read_text().splitlines())
        filler.unlink()
        assert main(_argv(library, out)) == 1  # the broken file
        assert _files(out) == _files(reference)


def _error(argv: list[str], capsys: pytest.CaptureFixture, env: dict | None = None) -> str:
    old = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        assert main(argv) == 2
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("craft-compress: error: ")
    return err


def test_bad_arguments_are_named(
    library: dict[str, Path], reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "out"
    argv = _argv(library, out)
    cut = argv.index("--threshold")
    no_budget = argv[:cut] + argv[cut + 2 :]
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.jsonl").write_text('{"path": "a.mp4", "fps": "fast"}\n')
    (tmp_path / "extra.jsonl").write_text('{"path": "a.mp4", "question": "why"}\n')
    (tmp_path / "notjson.jsonl").write_text("{oops\n")
    (tmp_path / "file").write_text("")
    CraftCompressor(CraftConfig(hidden_size=32)).save_pretrained(tmp_path / "craft32")
    cases = [
        (no_budget, {}, "--ratio R or --threshold T"),
        ([*argv, "--ratio", "2"], {}, "exactly one budget"),
        ([*no_budget, "--ratio", "0.5"], {}, "--ratio must be a finite number >= 1"),
        ([*no_budget, "--threshold", "2"], {}, "--threshold must lie in"),
        ([*no_budget, "--threshold", "x"], {}, "--threshold='x' is not a number"),
        ([*argv, "--fps", "0"], {}, "--fps 0.0"),
        ([*argv, "--frames", "0"], {}, "--frames 0"),
        ([*argv, "--bogus"], {}, "unrecognized arguments: --bogus"),
        (_argv(library, out, videos=tmp_path / "nope"), {}, "--videos .*nope: no such folder"),
        (_argv(library, out, videos=tmp_path / "empty"), {}, "--videos .*empty: no video file"),
        (_argv(library, out, videos=tmp_path / "*.mkv"), {}, "the glob matches no file"),
        (_argv(library, out, videos=tmp_path / "bad.jsonl"), {}, "bad.jsonl:1: fps='fast'"),
        (_argv(library, out, videos=tmp_path / "extra.jsonl"), {}, r"extra.jsonl:1: unknown col"),
        (_argv(library, out, videos=tmp_path / "notjson.jsonl"), {}, "notjson.jsonl:1: not JSON"),
        (argv, {"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2, WORLD_SIZE=2"),
        (argv, {"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an int"),
        ([*argv, "--device", "cuda:0"], {}, "--device cuda:0: CUDA is not available"),
        ([*argv, "--output", str(tmp_path / "file")], {}, "--output .*file: exists and is not"),
        ([*argv, "--model", str(tmp_path / "nope")], {}, "--model .*nope: cannot be loaded"),
        ([*argv, "--craft", str(tmp_path / "nope")], {}, "--craft .*nope: "),
        ([*argv, "--craft", str(tmp_path / "craft32")], {}, "--craft .*craft32: .*32"),
        (
            [*no_budget, "--output", str(reference), "--ratio", "2"],
            {},
            "made with budget='threshold=0.8', not 'ratio=2'",
        ),
    ]
    for case, env, pattern in cases:
        if "cuda" in pattern and torch.cuda.is_available():
            continue
        assert re.search(pattern, _error(case, capsys, env)), (case, pattern)
    assert not out.exists()  # nothing made by a refused command


def test_the_console_script_prints_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "craft_adapters.compress_cli",
            "--videos",
            "x",
            "--model",
            "m",
            "--craft",
            "c",
            "--output",
            str(tmp_path),
            "--ratio",
            "nan",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        == "craft-compress: error: --ratio must be a finite number >= 1, got nan"
    )


def _cache(cache: Path, repo_id: str, folder: Path) -> None:
    """`folder` as a huggingface_hub cache holds a download of `repo_id` (refs/main)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(folder, repo / "snapshots" / commit)


def test_hub_ids_come_from_the_cache_offline(
    library: dict[str, Path], reference: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "hub"
    _cache(cache, "org/tiny-vl", library["model"])
    _cache(cache, "org/tiny-craft", library["craft"])
    clip = library["root"] / "videos" / "clip1.mp4"
    hub = ["--videos", str(clip), "--output", str(tmp_path / "out"), "--device", "cpu"]
    hub += ["--threshold", "0.8", "--no-progress", "--craft", "org/tiny-craft"]
    code = (
        "import sys, json; from craft_adapters.compress_cli import main; "
        "a = sys.argv[1:]; print(json.dumps([main([*a, '--model', 'org/not-cached']), "
        "main([*a, '--model', 'org/tiny-vl'])]))"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", code, *hub], env=env, capture_output=True, text=True, check=False
    )
    assert json.loads(done.stdout.splitlines()[-1]) == [2, 0], done.stderr
    assert "--model org/not-cached: cannot be loaded" in done.stderr
    (row,) = _rows(tmp_path / "out")
    got = load_compressed_video(tmp_path / "out" / row["output"])
    want = load_compressed_video(reference / row["output"])  # same path and sampling: same name
    assert torch.equal(got.features, want.features) and torch.equal(got.coords, want.coords)
    assert got.metadata["backbone"] == "org/tiny-vl"
    assert got.metadata["craft_sha256"] == want.metadata["craft_sha256"]


def test_sigterm_unwinds_with_nothing_half_written(
    library: dict[str, Path], tmp_path: Path
) -> None:
    """torchrun stops the other workers with SIGTERM when one fails."""
    clip = library["root"] / "videos" / "clip2.mp4"
    rows = [{"path": str(clip), "fps": 2.0 + i / 8} for i in range(40)]  # 40 entries, 1 clip
    (tmp_path / "many.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    code = "import sys; from craft_adapters.compress_cli import main; sys.exit(main(sys.argv[1:]))"
    argv = _argv(library, out, videos=tmp_path / "many.jsonl")
    run = subprocess.Popen([sys.executable, "-c", code, *argv], stderr=subprocess.PIPE, text=True)
    part = out / "shards" / "index.rank0-of-1.jsonl.part"
    deadline = time.monotonic() + 120
    while not (part.is_file() and part.read_text().count("\n") >= 2):
        assert time.monotonic() < deadline and run.poll() is None, run.stderr
        time.sleep(0.01)
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 128 + signal.SIGTERM, run.communicate()
    made = list(out.glob(f"*{SUFFIX}"))
    assert 2 <= len(made) < 40 and not list(out.glob(".*.tmp"))
    for payload in made:
        load_compressed_video(payload)
    assert all(json.loads(line) for line in part.read_text().splitlines())
