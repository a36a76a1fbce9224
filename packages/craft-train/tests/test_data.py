"""Manifests, the mixture (caps + seeded resampling), the data order, skip-on-decode-failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from craft_train.config import ConfigError, MixtureConfig, SourceSpec
from craft_train.data import (
    DecodeError,
    Example,
    VideoTextDataset,
    build_mixture,
    collate,
    epoch_order,
    rank_indices,
    read_manifest,
)


def _rows(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_read_manifest_both_stages(tmp_path: Path) -> None:
    p = _rows(tmp_path, [{"video": "v/a.mp4", "caption": " A cat. ", "source": "x"}])
    (ex,) = read_manifest(p, 1, caption_prompt="Describe.")
    assert ex == Example(str(tmp_path / "v/a.mp4"), "Describe.", "A cat.", "x")
    p = _rows(tmp_path, [{"video": "/abs.mp4", "question": "Q?", "answer": "A", "source": "y"}])
    (ex,) = read_manifest(p, 2, caption_prompt="unused", video_root="/elsewhere")
    assert (ex.video, ex.prompt, ex.target) == ("/abs.mp4", "Q?", "A")


@pytest.mark.parametrize(
    ("row", "stage", "message"),
    [
        ({"video": "a", "source": "x"}, 1, "'caption'"),
        ({"video": "a", "caption": "c"}, 1, "'source'"),
        ({"video": "a", "question": "q", "source": "x"}, 2, "'answer'"),
        ([1, 2], 1, "JSON object"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path: Path, row, stage: int, message: str) -> None:
    p = _rows(
        tmp_path,
        [{"video": "ok", "caption": "c", "question": "q", "answer": "a", "source": "s"}, row],
    )
    with pytest.raises(ConfigError, match=rf"m\.jsonl:2: .*{message}"):
        read_manifest(p, stage, caption_prompt="D")


def _examples(counts: dict[str, int]) -> list[Example]:
    return [Example(f"{s}{i}.mp4", "p", "t", s) for s, n in counts.items() for i in range(n)]


def test_mixture_caps_and_resamples_deterministically() -> None:
    examples = _examples({"big": 100, "small": 7, "tiny": 3})
    mix = MixtureConfig(default_cap=30, sources={"tiny": SourceSpec(target=8)})
    a = build_mixture(examples, mix, seed=1)
    counts = {s: sum(e.source == s for e in a) for s in ("big", "small", "tiny")}
    assert counts == {"big": 30, "small": 7, "tiny": 8}
    assert len({e.video for e in a if e.source == "big"}) == 30  # a subset, no repeats
    assert {e.video for e in a if e.source == "tiny"} == {"tiny0.mp4", "tiny1.mp4", "tiny2.mp4"}
    assert a == build_mixture(examples, mix, seed=1)
    assert a != build_mixture(examples, mix, seed=2)
    down = build_mixture(
        examples, MixtureConfig(default_cap=None, sources={"big": SourceSpec(target=10)}), 0
    )
    assert sum(e.source == "big" for e in down) == 10


def test_mixture_naming_an_absent_source_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"data\.mixture\.sources"):
        build_mixture(_examples({"a": 2}), MixtureConfig(sources={"b": SourceSpec(cap=1)}), 0)


def test_order_is_seeded_and_ranks_split_evenly() -> None:
    order = epoch_order(103, seed=5, epoch=0)
    assert sorted(order) == list(range(103)) and order == epoch_order(103, 5, 0)
    assert order != epoch_order(103, 5, 1)
    parts = [rank_indices(order, r, 2, per_step=4) for r in range(2)]
    assert len(parts[0]) == len(parts[1]) == 48  # 96 usable = 2 ranks x 12 steps x 4
    assert not set(parts[0]) & set(parts[1])


def test_failed_videos_are_skipped_and_counted() -> None:
    examples = _examples({"s": 5})

    def encode(example: Example) -> dict:
        if example.video in ("s1.mp4", "s2.mp4"):
            raise DecodeError("broken")
        return {"input_ids": torch.tensor([[1, 2]]), "labels": torch.tensor([[-100, 2]])}

    ds = VideoTextDataset(examples, encode)
    item = ds[1]
    assert item["skipped_videos"] == ["s1.mp4", "s2.mp4"]
    assert ds[0]["skipped_videos"] == []

    def always_fails(example: Example) -> dict:
        raise DecodeError("gone")

    with pytest.raises(RuntimeError, match="in a row"):
        VideoTextDataset(examples, always_fails, max_consecutive_failures=3)[0]


def test_collate_pads_right_and_concatenates_video_tensors() -> None:
    a = {
        "input_ids": torch.tensor([[5, 6, 7]]),
        "attention_mask": torch.ones(1, 3, dtype=torch.long),
        "labels": torch.tensor([[-100, 6, 7]]),
        "pixel_values_videos": torch.zeros(4, 2),
        "skipped_videos": ["x"],
    }
    b = {
        "input_ids": torch.tensor([[8]]),
        "attention_mask": torch.ones(1, 1, dtype=torch.long),
        "labels": torch.tensor([[8]]),
        "pixel_values_videos": torch.ones(2, 2),
        "skipped_videos": [],
    }
    out = collate([a, b], pad_token_id=0)
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert out["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert out["pixel_values_videos"].shape == (6, 2)
    assert out["skipped_videos"] == ["x"]
