"""The threshold (adaptive) mode, served from videos that arrive already compressed.

craft-adapters compresses each video in threshold mode (`compress_videos`), the result goes
through a file (`save_compressed_video` / `load_compressed_video`), and vLLM serves it from
that payload (`precompressed.video_payload`, `enable_mm_embeds=True`). vLLM's greedy tokens
must equal craft-adapters' threshold-mode `generate()` on the same videos; each malformed
payload fails its own request with the field named, and the engine keeps serving. Qwen2.5-VL
(float32) and Qwen3.5 (bfloat16 both sides; the payload carries the frame timestamps and the
K rows are laid out in per-frame runs from the coords). LLaVA-OneVision, InternVL, Qwen3-VL
and GLM-4.1V payloads are served through `vllm serve` only (test_openai_backbones.py: the
same equality, controls and refusals through the same parser; `LLM.generate`'s dict is what
the API server builds from a chat part); their `Case`s are built here (`_case`).
Equality is judged on the first step's log-probs (within `engine.GAP`) besides the greedy
tokens. Control, Qwen2.5-VL (float32): the payload a FRESH (unloaded) CRAFT module makes,
served, is far from the reference in those log-probs (`engine.CONTROL_GAP`: 0.16-0.42
measured, against 2e-6 for the right payload). Qwen3.5 (bfloat16): there the fresh payload's
log-probs are as close to the reference as the right one's (0.03-0.05 both, measured: at
threshold 0.98 a merge joins near-identical tokens, so any fusion gives nearly the same
rows), and its greedy tokens agreed or not depending on how the CPU rounds bfloat16 (CI red
on AVX2 machines). So the Qwen3.5 control is on the ROWS: those the engine embeds are the
payload's bit for bit (read from vLLM's worker), and the fresh payload's rows are not
(craft-core's exact rows are the same on every CPU). Positions are checked by the prompt
lengths here and against a slow rule in test_options.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import engine
import pytest
import tiny
import tiny_qwen3_5
import torch
from conftest import small_config
from craft_vllm.precompressed import video_payload

import craft_adapters
from craft_core import CraftCompressor

THRESHOLD = 0.98  # keeps 58, 41, 59 of 128, 80, 96 (0.7-0.95: 16-19, too few to tell rows apart)
# Qwen3.5: 0.98 keeps 63, 43, 51 of 72, 45, 54 (7-9 per frame); 0.95 keeps 38, 36, 37 (2-9
# per frame), the uneven layout, but there neither the fresh-module control nor rows put in
# the first K slots change the tokens (measured): both are served, 0.98 carries the control
LOW = 0.95
TOKENS = [128, 80, 96]  # merged tokens of the three videos (as test_equality.py)


@pytest.fixture(scope="module")
def videos() -> list:
    return [tiny.video(16, seed=0), tiny.video(10, seed=1), tiny.video(12, seed=2)]


def _generate(llm, payloads: list, kind=tiny) -> list[engine.Served]:
    text = engine.prompt(kind=kind)
    requests = [{"prompt": text, "multi_modal_data": {"video": p}} for p in payloads]
    return engine.served(llm.generate(requests, engine.sampling()))


def _malformed(payload: dict) -> list[tuple[dict, str]]:
    rows, coords = payload["video_embeds"], payload["craft_coords"]
    nan = rows.clone()
    nan[0, 3] = float("nan")
    far = coords.clone()
    far[-1, 2] = 99
    return [
        ({**payload, "video_embeds": rows[:, :64]}, "video_embeds must be [K = "),
        ({**payload, "craft_coords": far}, "coords must fit the grid"),
        ({**payload, "video_embeds": nan}, "NaN"),
        ({**payload, "craft_num_kept": payload["craft_num_kept"] + 1}, "craft_num_kept"),
        # in process these once crashed (NaN: IndexError, then a busy loop) or were served
        ({**payload, "second_per_grid_ts": torch.tensor([float("nan")])}, "holds NaN"),
        ({**payload, "second_per_grid_ts": torch.tensor([-1.0])}, "second_per_grid_ts must be"),
        (
            {**payload, "video_embeds": rows[:0], "craft_coords": coords[:0]}
            | {"craft_num_kept": torch.tensor([0])},
            "craft_num_kept must be >= 1",
        ),
    ]


def test_threshold_mode_served_from_compressed_videos(workdir, videos, tmp_path) -> None:
    loaded = CraftCompressor.from_pretrained(workdir / "craft")
    compressed = engine.compress_payloads(workdir / "model", loaded, videos, tmp_path / "trained")
    torch.manual_seed(0)
    fresh = engine.compress_payloads(
        workdir / "model", CraftCompressor(small_config()), videos, tmp_path / "f"
    )
    kept = [v.features.shape[0] for v in compressed]
    # the threshold decides each count: not a fixed ratio's floor(N / r) for every video
    assert all(1 <= k < n for k, n in zip(kept, TOKENS))
    assert len({n / k for k, n in zip(kept, TOKENS)}) > 1

    def work(llm):
        payloads = [video_payload(v) for v in compressed]
        for bad, field in _malformed(payloads[0]):
            with pytest.raises(Exception, match=field.replace("[", r"\[")):
                _generate(llm, [bad])
        with pytest.raises(Exception, match="made with craft_sha256="):
            _generate(llm, [video_payload(fresh[0])])  # another CRAFT module's payload
        served = _generate(llm, payloads)  # the engine still serves
        control = _generate(llm, [video_payload(v) for v in engine.made_as(fresh, compressed[0])])
        return served, control

    overrides = engine.overrides(workdir / "craft", 4)
    served, control = engine.run(workdir / "model", overrides, work, enable_mm_embeds=True)
    reference = engine.adapters_generate(
        workdir / "model", loaded, None, videos, threshold=THRESHOLD
    )
    engine.compare(served, reference)
    assert [s.length for s in served] == [engine.text_tokens() + k for k in kept]
    engine.control_gaps(control, reference)


def _timestamps(frames: int, kind=tiny_qwen3_5, fps: float = engine.FPS) -> list[float]:
    """Qwen3.5's / Qwen3-VL's / GLM-4.1V's frame-run seconds of a video sampled at `fps`
    (its processor's rule; GLM-4.1V's read back from its prompt)."""
    if hasattr(kind, "timestamps"):
        return kind.timestamps(frames, fps)  # type: ignore[no-any-return]
    return kind.processor()._calculate_timestamps(list(range(frames)), fps, 2)


class Case(NamedTuple):
    """A tiny backbone's videos and their payloads (threshold mode, read back from files)."""

    model: Path
    videos: list
    loaded: CraftCompressor  # the checkpoint's module
    compressed: list  # its CompressedVideos
    fresh: list  # a fresh module's, claiming the checkpoint's digest (the control)
    kept: list[int]  # K of each video


def _case(kind, frames: list[int], workdir: Path, tmp_path: Path) -> Case:
    """Build `kind`'s tiny model and compress its videos of `frames` frames with the
    checkpoint and with a fresh module; the threshold decides each count (not one ratio)."""
    model = kind.build(tmp_path / kind.__name__)
    videos = [kind.video(n, seed=i) for i, n in enumerate(frames)]
    loaded = CraftCompressor.from_pretrained(workdir / "craft")
    compressed = engine.compress_payloads(model, loaded, videos, tmp_path / "trained", kind)
    torch.manual_seed(0)
    fresh = engine.compress_payloads(
        model, CraftCompressor(small_config()), videos, tmp_path / "fresh", kind
    )
    kept = [v.features.shape[0] for v in compressed]
    tokens = [kind.video_tokens(n) for n in frames]
    assert all(1 <= k < n for k, n in zip(kept, tokens))
    assert len({n / k for k, n in zip(kept, tokens)}) > 1
    fresh = engine.made_as(fresh, compressed[0])
    return Case(model, videos, loaded, compressed, fresh, kept)


def _assert_lengths(served: list, kind, frames: list[int], case: Case) -> None:
    """Each prompt is the uncompressed one with N video tokens replaced by the payload's K
    (the timestamps, frame markers and newline row all stay)."""
    for (_, length, _), n, video, k in zip(served, frames, case.videos, case.kept):
        inputs = craft_adapters.build_inputs(kind.processor(), video, engine.FPS, engine.QUESTION)
        assert length == inputs["input_ids"].shape[1] - kind.video_tokens(n) + k


def test_qwen3_5_threshold_mode_served_from_compressed_videos(workdir, tmp_path) -> None:
    """The same on Qwen3.5 (bfloat16 both sides): K rows laid out per frame, timestamps kept."""
    kind, frames = tiny_qwen3_5, [16, 10, 12]
    case = _case(kind, frames, workdir, tmp_path)
    model, videos, loaded, compressed, fresh, kept = case
    uneven = engine.compress_payloads(model, loaded, videos, tmp_path / "low", kind, LOW)

    def payloads(vs: list) -> list:
        return [video_payload(v, timestamps=_timestamps(n)) for v, n in zip(vs, frames)]

    def work(llm):
        good = payloads(compressed)
        stamps = good[0]["timestamps"]
        nan, back = stamps.clone(), stamps.clone()
        nan[0, 1], back[0, -1] = float("nan"), stamps[0, 0]  # back: the last run goes back
        bad = [
            *_malformed(good[0]),
            ({**good[0], "timestamps": stamps[:, 1:]}, "timestamps must be"),
            ({**good[0], "timestamps": nan}, "timestamps must be finite"),
            ({**good[0], "timestamps": -stamps - 1}, "timestamps must be finite and >= 0"),
            ({**good[0], "timestamps": back}, "timestamps must not decrease"),
            ({**good[0], "timestamps": stamps.long()}, "timestamps must be"),
        ]
        for payload, field in bad:
            with pytest.raises(Exception, match=field.replace("[", r"\[")):
                _generate(llm, [payload], kind)
        engine.record_video_rows(llm)
        out = []
        for vs in (compressed, fresh, uneven):
            out.append((_generate(llm, payloads(vs), kind), engine.recorded_rows(llm)))
        return out

    overrides = engine.overrides(workdir / "craft", 4, kind)
    (served, rows), (_, fresh_rows), (low, _) = engine.run(
        model, overrides, work, dtype=kind.DTYPE, enable_mm_embeds=True
    )
    reference, reference_low = (
        engine.adapters_generate(model, loaded, None, videos, kind, torch.bfloat16, threshold=t)
        for t in (THRESHOLD, LOW)
    )
    engine.compare(low, reference_low, kind.DTYPE)
    engine.compare(served, reference, kind.DTYPE)
    _assert_lengths(served, kind, frames, case)
    # the engine embedded each payload's rows bit for bit; the control's rows are others
    bf16 = [[v.features.to(torch.bfloat16) for v in vs] for vs in (compressed, fresh)]
    assert [r.shape[0] for r in rows] == kept
    assert all(torch.equal(r, v) for r, v in zip(rows, bf16[0]))
    assert all(torch.equal(r, v) for r, v in zip(fresh_rows, bf16[1]))
    assert not any(torch.equal(r, v) for r, v in zip(fresh_rows, bf16[0]))
