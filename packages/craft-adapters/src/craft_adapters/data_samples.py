"""Small rows in the data formats people hold, and writers for them: what the tests of
craft-adapters, craft-train and craft-eval read, and a quick way to try `--check`.

    from craft_adapters.data_samples import LLAVA_ROWS, write_json_array
    write_json_array(Path("llava.json"), LLAVA_ROWS)   # then: craft-train --check CONFIG
"""

from __future__ import annotations

import json
from pathlib import Path

LLAVA_ROWS: list[dict] = [  # LLaVA-Video-178K's shape: one good row, then six unusable kinds
    {  # two turns; `<image>` marks the video (LLaVA-Video-178K writes it so)
        "id": "v0",
        "video": "clips/a.mp4",
        "conversations": [
            {"from": "human", "value": "<image>\nWhat colour is it?"},
            {"from": "gpt", "value": "Red."},
            {"from": "human", "value": "Are you sure?"},
            {"from": "gpt", "value": "Yes, red."},
        ],
        "data_source": "0_30_s_academic_v0_1",
    },
    {"id": "i1", "image": "x.jpg", "conversations": [{"from": "human", "value": "<image>"}]},
    {
        "id": "v2",
        "video": ["a.mp4", "b.mp4"],
        "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}],
    },
    {"id": "v3", "video": "c.mp4", "conversations": [{"from": "human", "value": "<video>q"}]},
    {
        "id": "v4",
        "video": "d.mp4",
        "conversations": [{"from": "gpt", "value": "a"}, {"from": "human", "value": "q"}],
    },
    {
        "id": "v5",
        "video": "e.mp4",
        "conversations": [
            {"from": "human", "value": "<image><video>q"},
            {"from": "gpt", "value": "a"},
        ],
    },
    {"id": "v6", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
]


def write_json_array(path: Path, rows: list) -> Path:
    """One row per line inside `[...]`, so that row i (0-based) starts on line i + 2."""
    path.write_text("[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n")
    return path


def write_jsonl(path: Path, rows: list) -> Path:
    """One JSON object per line."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
