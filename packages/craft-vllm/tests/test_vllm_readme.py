"""craft-vllm's README: every Python example runs (in `nox -s vllm`; the one that serves a 7B
checkpoint only where vLLM has CUDA, skipped naming it elsewhere), and what the payload
example prints holds."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest
import torch

from craft_testkit.readme import Block, python_blocks, run_block, shape_problems

README = Path(__file__).parents[1] / "README.md"
BLOCKS = python_blocks(README)


def test_the_readme_has_its_examples() -> None:
    assert len(BLOCKS) == 2  # LLM(...) at a fixed ratio, a threshold-mode payload
    assert BLOCKS[0].needs() == ["cuda", "vllm"] and BLOCKS[1].needs() == []


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_vllm_readme_example_runs(
    block: Block, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = run_block(block, tmp_path)
    printed = capsys.readouterr().out
    if "content" in namespace:  # the payload: compressed once, sent as vLLM's video_embeds part
        video = namespace["video"]
        assert (tmp_path / "clip.craft.safetensors").is_file()
        assert video.features.shape[0] == 9 and video.grid == (2, 3, 3)  # type: ignore[attr-defined]
        assert "9 of 18 rows kept" in printed  # what the README's comment says
        part = namespace["content"][0]  # type: ignore[index]
        assert part["type"] == "video_embeds"
        assert sorted(part["video_embeds"]) == sorted(
            [
                "video_embeds",
                "video_grid_thw",
                "craft_coords",
                "craft_num_kept",
                "second_per_grid_ts",
                "craft_made_with",
            ]
        )
        rows = base64.b64decode(part["video_embeds"]["video_embeds"])
        sent = torch.load(io.BytesIO(rows), weights_only=True)  # as vLLM reads it
        assert torch.equal(sent, video.features)  # type: ignore[attr-defined]


def test_readme_shape() -> None:
    assert not shape_problems(README)  # <= 200 lines, none over 100 characters in prose
