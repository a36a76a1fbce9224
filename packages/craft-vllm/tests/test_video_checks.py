"""The per-request video checks (video_checks.py) on vLLM's own Qwen2-VL loader, no server.

Real mp4 bytes through `Qwen2VLVideoBackend.load_bytes` (what `serve` runs for each video):
a 1-frame video is refused naming the frame count (vLLM alone: ZeroDivisionError), a video
over `max_frames` naming the limit (vLLM alone: silently resampled to `max_frames`); a good
video and one at the limit load unchanged. The served 400s: test_serve.py.
"""

from __future__ import annotations

import pytest
import test_serve
import tiny
from craft_vllm import video_checks


@pytest.fixture(scope="module")
def loader():
    from vllm.multimodal.video import Qwen2VLVideoBackend

    video_checks.install()  # also done by the plugin; idempotent
    return Qwen2VLVideoBackend


def _bytes(tmp_path, frames: int) -> bytes:
    return test_serve._write_mp4(
        tmp_path / f"v{frames}.mp4", tiny.video(frames, seed=0)
    ).read_bytes()


def test_one_frame_is_refused(loader, tmp_path) -> None:
    with pytest.raises(video_checks.VideoRequestError, match="has 1 frame"):
        loader.load_bytes(_bytes(tmp_path, 1))


def test_over_max_frames_is_refused_at_the_limit_served(loader, tmp_path) -> None:
    data = _bytes(tmp_path, 12)
    with pytest.raises(video_checks.VideoRequestError, match=r"12 frames, over .* limit of 10"):
        loader.load_bytes(data, max_frames=10)
    frames, _ = loader.load_bytes(data, max_frames=12)  # at the limit: every frame
    assert len(frames) == 12
    assert len(loader.load_bytes(_bytes(tmp_path, 8))[0]) == 8  # no limit set: unchanged


def test_install_is_idempotent(loader) -> None:
    patched = loader.compute_frames_index_to_sample
    video_checks.install()
    assert loader.compute_frames_index_to_sample == patched
