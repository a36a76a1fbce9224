"""One example -> model inputs: labels only on the target, thinning to max_seq_len, decode errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TinySetup
from transformers import AutoProcessor

from craft_train.config import load_config
from craft_train.data import DecodeError, Example
from craft_train.inputs import ExampleEncoder


def _encoder(tiny: TinySetup, tmp_path: Path, **data) -> ExampleEncoder:
    cfg = load_config(data=tiny.config(tmp_path, data=data), stage=1)
    return ExampleEncoder(cfg, AutoProcessor.from_pretrained(tiny.backbone))


def test_labels_cover_exactly_the_target(tiny: TinySetup, tmp_path: Path) -> None:
    encode = _encoder(tiny, tmp_path)
    item = encode(Example(str(tiny.root / "clip0.mp4"), "Describe.", "mostly red", "s"))
    ids, labels = item["input_ids"][0], item["labels"][0]
    assert ids.shape == labels.shape == item["attention_mask"][0].shape
    assert item["mm_token_type_ids"].shape == item["input_ids"].shape
    target = labels[labels != -100]
    n = target.numel()
    assert (labels[:-n] == -100).all() and (labels[-n:] == ids[-n:]).all()
    tokenizer = encode.tokenizer
    assert tokenizer.decode(target) == "mostly red<|im_end|>\n"  # the template's assistant turn
    assert "<|video_pad|>" in tokenizer.decode(ids[:-n])


def test_too_long_examples_are_read_with_fewer_frames(tiny: TinySetup, tmp_path: Path) -> None:
    example = Example(str(tiny.root / "clip1.mp4"), "Describe.", "mostly green", "s")
    full = _encoder(tiny, tmp_path)(example)
    length = full["input_ids"].shape[-1]
    short = _encoder(tiny, tmp_path, max_seq_len=length - 5)(example)
    assert short["input_ids"].shape[-1] <= length - 5
    assert int(short["video_grid_thw"][0, 0]) < int(full["video_grid_thw"][0, 0])
    assert (short["labels"] != -100).sum() == (full["labels"] != -100).sum()  # target intact


def test_unreadable_videos_raise_decode_error(tiny: TinySetup, tmp_path: Path) -> None:
    encode = _encoder(tiny, tmp_path)
    (tmp_path / "bad.mp4").write_bytes(b"\x00" * 1000)
    for path in (tmp_path / "bad.mp4", tmp_path / "missing.mp4"):
        with pytest.raises(DecodeError):
            encode(Example(str(path), "p", "t", "s"))
