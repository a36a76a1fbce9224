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


def _reference(processor, example: Example) -> tuple[list[int], list[bool]]:
    """Independent reference: the chat template's text of the whole conversation, tokenized
    in one go; a token is trained on when it starts inside an assistant reply or the
    `<|im_end|>\\n` that closes it (found by searching the text, turn after turn)."""
    turns = [(example.prompt, example.target), *example.follow_up]
    messages: list[dict] = []
    if example.system is not None:
        messages.append({"role": "system", "content": example.system})
    for i, (user, reply) in enumerate(turns):
        text = [{"type": "text", "text": user}]
        messages.append({"role": "user", "content": [{"type": "video"}, *text] if i == 0 else text})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": reply}]})
    full = processor.apply_chat_template(messages, tokenize=False)
    spans, at = [], 0
    for _, reply in turns:
        head = "<|im_start|>assistant\n"
        start = full.index(head + reply + "<|im_end|>\n", at) + len(head)
        at = start + len(reply) + len("<|im_end|>\n")
        spans.append((start, at))
    enc = processor.tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = [any(a <= s < b for a, b in spans) for s, _ in enc["offset_mapping"]]
    return enc["input_ids"], mask


@pytest.mark.parametrize("system", [None, "Answer briefly."])
def test_multi_turn_labels_token_by_token_against_the_chat_template(
    tiny: TinySetup, tmp_path: Path, system: str | None
) -> None:
    encode = _encoder(tiny, tmp_path)
    example = Example(
        str(tiny.root / "clip0.mp4"), "What colour?", "Mostly red.", "s",
        follow_up=(("Are you sure?", "Yes."), ("And the rest?", "Random blocks.")),
        system=system,
    )  # fmt: skip
    item = encode(example)
    ids, labels = item["input_ids"][0].tolist(), item["labels"][0].tolist()
    pad = encode.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    keep = [i for i, t in enumerate(ids) if t != pad or ids[i - 1] != pad]  # one pad per run
    ref_ids, ref_mask = _reference(encode.processor, example)
    assert [ids[i] for i in keep] == ref_ids
    assert [labels[i] != -100 for i in keep] == ref_mask
    assert all(labels[i] == ids[i] for i in range(len(ids)) if labels[i] != -100)
    trained = encode.tokenizer.decode([t for t in labels if t != -100])
    assert trained == "Mostly red.<|im_end|>\nYes.<|im_end|>\nRandom blocks.<|im_end|>\n"


def test_frame_folder_is_sampled_like_a_video(tiny: TinySetup, tmp_path: Path) -> None:
    from PIL import Image

    from craft_train.inputs import read_frame_folder

    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(12):  # frame_10 sorts after frame_9: numbers compare as numbers
        Image.new("RGB", (32, 24), (i * 20, 0, 0)).save(folder / f"frame_{i}.png")
    (folder / "notes.txt").write_text("not a frame")
    frames, fps = read_frame_folder(str(folder), 4.0, 2.0, 64)  # 3 s at 4 fps, read at 2
    assert fps == 2.0 and frames.shape == (6, 24, 32, 3)
    assert [int(f[0, 0, 0]) for f in frames] == [0, 40, 80, 120, 160, 200]
    frames, _ = read_frame_folder(str(folder), 4.0, 2.0, 3)  # the cap spreads over the clip
    assert [int(f[0, 0, 0]) for f in frames] == [0, 120, 220]
    encode = _encoder(tiny, tmp_path)
    item = encode(Example(str(folder), "Describe.", "dark", "s", video_fps=4.0))
    assert int(item["video_grid_thw"][0, 0]) == 3  # 6 frames, temporal patch 2
    with pytest.raises(DecodeError, match="video_fps"):
        encode(Example(str(folder), "Describe.", "dark", "s"))
