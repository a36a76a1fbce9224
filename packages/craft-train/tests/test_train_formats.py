"""End to end: a LLaVA-Video-178K-shaped file, a LLaMA-Factory-shaped file and frame-folder
videos train the tiny model in one mixture file (the issue's acceptance run)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml
from conftest import COLOURS, TinySetup

from craft_train.config import load_config
from craft_train.inputs import make_encoder
from craft_train.trainer import train


def _frame_folder(clip: Path, folder: Path) -> None:
    """The clip's frames as numbered PNGs (what a frame-folder release holds)."""
    import av
    from PIL import Image

    folder.mkdir()
    with av.open(str(clip)) as container:
        for i, frame in enumerate(container.decode(video=0)):
            Image.fromarray(np.asarray(frame.to_ndarray(format="rgb24"))).save(folder / f"{i}.png")


def test_llava_llamafactory_and_frame_folders_train_in_one_mixture(
    tiny: TinySetup, tmp_path: Path
) -> None:
    names = list(COLOURS)
    llava = [
        {
            "id": f"v{i}",
            "video": str(tiny.root / f"clip{i}.mp4"),
            "conversations": [
                {"from": "human", "value": "<image>\nWhich colour is most common?"},
                {"from": "gpt", "value": names[i % 4]},
                {"from": "human", "value": "Say it again."},
                {"from": "gpt", "value": f"mostly {names[i % 4]}"},
            ],
            "data_source": "llava_video",
        }
        for i in range(4)
    ]
    (tmp_path / "llava.json").write_text(json.dumps(llava, indent=1))
    factory = [
        {
            "messages": [
                {"role": "user", "content": "<video>What is the main colour?"},
                {"role": "assistant", "content": names[i % 4]},
            ],
            "videos": [str(tiny.root / f"clip{i}.mp4")],
        }
        for i in range(4, 8)
    ]
    (tmp_path / "factory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in factory))
    for i in (8, 9):
        _frame_folder(tiny.root / f"clip{i}.mp4", tmp_path / f"frames{i}")
    captions = [{"video": f"frames{i}", "caption": f"mostly {names[i % 4]}"} for i in (8, 9)]
    (tmp_path / "frames.jsonl").write_text("".join(json.dumps(r) + "\n" for r in captions))
    mixture = {
        "datasets": [
            {"json_path": "llava.json", "sampling_strategy": "all"},
            {"json_path": "factory.jsonl", "format": "sharegpt", "source": "factory"},
            {"json_path": "frames.jsonl", "format": "caption", "video_fps": 4.0},
        ]
    }
    (tmp_path / "mix.yaml").write_text(yaml.safe_dump(mixture))
    data = tiny.config(tmp_path / "out", data={"manifests": [], "mixture": str(tmp_path / "mix.yaml")},
                       optim={"epochs": 1})  # fmt: skip
    encoded: list[str] = []

    def recording(cfg, processor):
        encode = make_encoder(cfg, processor)

        def run(example):
            item = encode(example)
            encoded.append(f"{example.source}:{int((item['labels'] != -100).sum())}")
            return item

        return run

    result = train(load_config(data=data, stage=1), encoder_factory=recording)
    assert result.global_step == 5 and result.skipped_videos == 0  # 10 rows / accumulation 2
    assert all(np.isfinite(result.losses))
    sources = sorted(e.split(":")[0] for e in encoded)
    assert sources == ["factory"] * 4 + ["frames"] * 2 + ["llava_video"] * 4
    rows = [json.loads(x) for x in (tmp_path / "out" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert (tmp_path / "out" / "craft" / "model.safetensors").is_file()
