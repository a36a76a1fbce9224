"""export_hub_folder: a finished tiny run (CRAFT+) -> a folder that loads by path and by Hub id."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TinySetup
from huggingface_hub import ModelCard, constants

from craft_core import CraftCompressor
from craft_train.config import load_config
from craft_train.hub_export import SUMMARY_FILE, export_hub_folder, summarize_log
from craft_train.trainer import train


@pytest.fixture(scope="module")
def run(tiny: TinySetup, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hub_run") / "run"
    data = tiny.config(
        out,
        model={"lora": {"enabled": True}},
        optim={"max_steps": 3, "epochs": 10},
        budget={"ratios": [2.0, 4.0]},
    )
    train(load_config(data=data, stage=1))
    return out


def _bits(module: CraftCompressor) -> dict[str, bytes]:
    return {
        k: v.contiguous().view(torch.uint8).numpy().tobytes()
        for k, v in module.state_dict().items()
    }


def test_export_writes_a_folder_that_loads_bit_identically(run: Path, tmp_path: Path) -> None:
    folder = export_hub_folder(run, tmp_path / "hub", base_model="org/tiny-vlm", repo_id="org/x")
    assert sorted(p.name for p in folder.iterdir()) == [
        "README.md",
        "config.json",
        "lora",
        "model.safetensors",
        SUMMARY_FILE,
    ]
    for name in ("config.json", "model.safetensors"):  # the run's weights, byte for byte
        assert (folder / name).read_bytes() == (run / "craft" / name).read_bytes()
    for file in (run / "lora").iterdir():
        assert (folder / "lora" / file.name).read_bytes() == file.read_bytes()
    assert _bits(CraftCompressor.from_pretrained(folder)) == _bits(
        CraftCompressor.from_pretrained(run / "craft")
    )

    meta = ModelCard.load(folder / "README.md").data.to_dict()
    assert meta["library_name"] == "craft-core" and meta["base_model"] == "org/tiny-vlm"
    assert meta["hidden_size"] == 64 and meta["ratios_trained"] == [2.0, 4.0]
    recipe = meta["training_recipe"]
    assert recipe["stage"] == 1 and recipe["steps"] == 3 and recipe["lora"] is True
    assert recipe["lr"] == pytest.approx(2e-2) and recipe["batch_size"] == 2

    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    summary = json.loads((folder / SUMMARY_FILE).read_text())
    assert summary["logged_steps"] == len(rows) == 3 and summary["last_step"] == 3
    assert summary["final_loss"] == rows[-1]["loss"] and summary["first_loss"] == rows[0]["loss"]
    before, after = sum(r["tokens_before"] for r in rows), sum(r["tokens_after"] for r in rows)
    assert summary["tokens_before"] == before and summary["realized_ratio"] == round(
        before / after, 4
    )
    assert summary["train_state"]["finished"] is True
    assert meta["training_summary"]["final_loss"] == rows[-1]["loss"]


def test_exported_folder_loads_by_id_from_the_cache(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As after `hf upload`: the folder's files in huggingface_hub's cache layout, offline."""
    folder = export_hub_folder(run, tmp_path / "hub")
    assert ModelCard.load(folder / "README.md").data.to_dict().get("base_model") is None  # local
    repo = tmp_path / "cache" / "models--org--run"
    commit = "c" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "blobs").mkdir()
    (repo / "snapshots" / commit).mkdir(parents=True)
    for file in folder.iterdir():
        if file.is_file():
            blob = hashlib.sha256(file.read_bytes()).hexdigest()
            shutil.copyfile(file, repo / "blobs" / blob)
            (repo / "snapshots" / commit / file.name).symlink_to(f"../../blobs/{blob}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    by_id = CraftCompressor.from_pretrained("org/run", cache_dir=tmp_path / "cache")
    assert _bits(by_id) == _bits(CraftCompressor.from_pretrained(run / "craft"))


def test_export_refuses_unfinished_runs_and_foreign_folders(run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("checkpoint-*", "hub"))
    state = json.loads((copy / "train_state.json").read_text())
    (copy / "train_state.json").write_text(json.dumps({**state, "finished": False}))
    with pytest.raises(ValueError, match="not finished"):
        export_hub_folder(copy)
    assert not (copy / "hub").exists()
    (copy / "train_state.json").write_text(json.dumps(state))
    (copy / "log.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match=r"log\.jsonl"):
        export_hub_folder(copy)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match=r"already holds \['notes.txt'\]"):
        export_hub_folder(run, mine)
    assert (mine / "notes.txt").read_text() == "keep" and len(list(mine.iterdir())) == 1
    again = export_hub_folder(run, tmp_path / "twice")
    assert export_hub_folder(run, again) == again  # a previous export is refreshed


def test_summary_skips_a_torn_last_line(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text(
        '{"step": 1, "loss": 2.0, "tokens_before": 40, "tokens_after": 10}\n'
        '{"step": 2, "loss": 1.5, "tokens_before": 40, "tokens_after": 20}\n{"step": 3, "lo'
    )
    summary = summarize_log(log)
    assert summary["last_step"] == 2 and summary["min_loss"] == 1.5
    assert summary["realized_ratio"] == round(80 / 30, 4)
    log.write_text("")
    with pytest.raises(ValueError, match="no logged step"):
        summarize_log(log)


def test_train_ends_with_its_hub_folder(run: Path) -> None:
    """`train()` exports the finished run itself: run/hub holds the run's weights byte for byte."""
    folder = run / "hub"
    assert {"README.md", "config.json", "model.safetensors", SUMMARY_FILE} <= {
        p.name for p in folder.iterdir()
    }
    for name in ("config.json", "model.safetensors"):
        assert (folder / name).read_bytes() == (run / "craft" / name).read_bytes()
    assert json.loads((folder / SUMMARY_FILE).read_text())["train_state"]["finished"] is True
