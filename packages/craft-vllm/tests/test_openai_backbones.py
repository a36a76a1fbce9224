"""Compressed videos of LLaVA-OneVision, Qwen3-VL, InternVL, Qwen3.5 and GLM-4.1V through
`vllm serve`'s OpenAI API, as test_openai_payloads.py does for Qwen2.5-VL: one server per backbone
(`backbone`, module scope, one backbone's tests after the other's, each server stopped when its
backbone's tests are done; the multiprocess engine), payloads sent with the `openai` client as
`payload.chat_part` builds them. Under pytest-xdist each backbone is a work unit of its own
(conftest: the five servers' start-ups are shared out between the workers).

- Equality: three videos compressed by craft-adapters in threshold mode (through a file) are
  served with the first step's log-probs within `engine.GAP` of craft-adapters' threshold-mode
  `generate()` and the same greedy tokens (up to the reference's first near-tie; Qwen3.5 in
  bfloat16 both sides, its gap `GAP["bfloat16"]`), the prompt lengths the uncompressed
  prompt's with N video tokens replaced by K. Controls, far in those log-probs
  (`engine.CONTROL_GAP`, `controls`): a fresh CRAFT module's payloads (claiming the
  checkpoint's digest); Qwen3-VL also the right payloads with their deepstack rows zeroed
  (the deepstack rows must reach the model); Qwen3.5 the right payloads with their rows
  rolled (a fresh module's rows are too close to the right ones in bfloat16).
- Refusals specific to each backbone (LLaVA-OneVision and InternVL: a newline row where none
  belongs, a Qwen-style grid; Qwen3-VL: deepstack rows of the wrong width; Qwen3.5 and
  GLM-4.1V: deepstack columns where none belong; Qwen3-VL, Qwen3.5 and GLM-4.1V: timestamps
  missing or wrong; GLM-4.1V: seconds that are not whole, a grid whose group runs would
  carry the positions past the rotary table; all: coords of the wrong width, NaN rows) are each a 400 naming the field; the same server then
  answers `python -m craft_vllm.payload`'s body (POSTed as curl does) as before. For
  Qwen3-VL, Qwen3.5 and GLM-4.1V that body's timestamps come from the file's recorded fps and frames
  (`payload.video_timestamps`), compared here with the processor's own rule.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
from collections.abc import Iterator
from typing import Any, NamedTuple

import engine
import pytest
import tiny_glm4v
import tiny_internvl
import tiny_llava
import tiny_qwen3
import tiny_qwen3_5
import torch
from conftest import serve_all
from craft_vllm import payload
from craft_vllm.payload import COORDS, COUNT, GRID, ROWS, TIMESTAMPS, chat_part
from test_openai_payloads import (
    THRESHOLD,
    ask,
    assert_refused,
    assert_same_answer,
    cli_body,
    post,
    with_fields,
)
from test_precompressed import Case
from test_precompressed import _case as build_case
from test_precompressed import _timestamps as processor_timestamps

import craft_adapters
from craft_adapters import CompressedVideo

openai = pytest.importorskip("openai")
KINDS = {
    "llava_onevision": tiny_llava,
    "qwen3_vl": tiny_qwen3,
    "internvl": tiny_internvl,
    "qwen3_5": tiny_qwen3_5,
    "glm4v": tiny_glm4v,
}
FLAT = (tiny_llava, tiny_internvl)  # 1-D RoPE, the grid is the frames' token grid
TIMED = (tiny_qwen3, tiny_qwen3_5, tiny_glm4v)  # payloads carry the frame runs' timestamps
FRAMES = [16, 10, 12]  # as test_precompressed.py
QWEN3_5_CONTROL = engine.tie("bfloat16")
"""The smallest gap Qwen3.5's control must show: 0.3, twice the bfloat16 gap allowed (the
right payloads measure 0.03-0.05). Not `engine.CONTROL_GAP`'s 0.75: this tiny bfloat16 model
moves little whatever the rows (measured: a fresh module's rows 0.04, the rows reversed
0.07-0.14, rolled by K / 2 0.09-0.20; in process zeroed 0.46-0.55, each the video's mean
row 0.66-1.07, negated 0.79-0.87), and the clean control, zeroed rows, is below it."""


class Backbone(NamedTuple):
    """One backbone served: its tiny-model module, videos and payloads, the server."""

    kind: Any
    case: Case
    base: str  # the server's URL


@pytest.fixture(scope="module", params=list(KINDS))
def backbone(request, workdir, tmp_path_factory) -> Iterator[Backbone]:
    """One of `KINDS` built, its videos compressed, and served at ratio 4 (payloads only),
    until its last test is done (pytest runs one backbone's tests, then the next one's)."""
    kind = KINDS[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    case = build_case(kind, FRAMES, workdir, folder)
    overrides = engine.overrides(workdir / "craft", 4, kind)
    limit = ("--limit-mm-per-prompt", '{"video": 1, "image": 0}')
    spec = (case.model, overrides, folder / "serve.log", limit, kind.DTYPE)
    with serve_all([spec]) as (base,):
        yield Backbone(kind, case, base)


def timestamps(kind: Any, frames: int) -> list[float] | None:
    """The frame runs' seconds of a video of `frames` frames sampled at engine.FPS, by the
    backbone's processor (None: a backbone without them)."""
    return None if kind in FLAT else processor_timestamps(frames, kind)


def parts(backbone: Backbone, videos: list[CompressedVideo]) -> list[dict[str, Any]]:
    """Each video's chat content part (with the processor's timestamps where it needs them)."""
    return [chat_part(v, timestamps=timestamps(backbone.kind, n)) for v, n in zip(videos, FRAMES)]


def test_payloads_served_as_threshold_generate(backbone) -> None:
    kind, case, base = backbone
    model = str(case.model)
    served = [ask(base, model, p) for p in parts(backbone, case.compressed)]
    dtype = getattr(torch, kind.DTYPE)
    reference = engine.adapters_generate(
        case.model, case.loaded, None, case.videos, kind, dtype, threshold=THRESHOLD
    )
    engine.compare(served, reference, kind.DTYPE)
    for s, n, video, k in zip(served, FRAMES, case.videos, case.kept):
        inputs = craft_adapters.build_inputs(kind.processor(), video, engine.FPS, engine.QUESTION)
        assert s.length == inputs["input_ids"].shape[1] - kind.video_tokens(n) + k
    least = QWEN3_5_CONTROL if kind is tiny_qwen3_5 else None
    for videos in controls(kind, case):
        served = [ask(base, model, p) for p in parts(backbone, videos)]
        engine.control_gaps(served, reference, kind.DTYPE, least)


def controls(kind: Any, case: Case) -> list[list[CompressedVideo]]:
    """The payloads that must be served far from the reference (`engine.CONTROL_GAP`).

    A fresh CRAFT module's payloads, except on Qwen3.5: in bfloat16 they are as close to the
    reference as the right ones (0.03-0.05, test_precompressed.py), so there the control is
    the right payloads with their rows zeroed (coords, counts and timestamps kept: the rows
    must reach the language model, as Qwen3-VL's deepstack rows must). Qwen3-VL also: the
    right payloads with their deepstack rows zeroed."""
    if kind is tiny_qwen3_5:
        return [[dataclasses.replace(v, features=v.features * 0) for v in case.compressed]]
    out = [case.fresh]
    if kind is tiny_qwen3:
        out.append([dataclasses.replace(v, deepstack=v.deepstack * 0) for v in case.compressed])
    return out


def malformed(backbone: Backbone) -> dict[str, tuple[dict[str, Any], str]]:
    """Each malformed request of this backbone: (its content part, a piece of the 400)."""
    kind, video = backbone.kind, backbone.case.compressed[0]
    part = parts(backbone, [video])[0]
    rows, coords, k = video.features, video.coords, video.features.shape[0]
    if video.deepstack is not None:
        rows = torch.cat([rows, video.deepstack], dim=1)
    nan = rows.clone()
    nan[0, 5] = float("nan")
    width = f"video_embeds must be [K = {k} (craft_num_kept), "
    out = {
        "rows NaN": (with_fields(part, **{ROWS: nan}), "video_embeds holds NaN"),
        "coords [K, 2]": (
            with_fields(part, **{COORDS: coords[:, 1:]}),
            f"craft_coords must be [K = {k} (craft_num_kept), 3]",
        ),
        "coords [K, 4]": (
            with_fields(part, **{COORDS: torch.cat([coords, coords[:, :1]], 1)}),
            f"craft_coords must be [K = {k} (craft_num_kept), 3]",
        ),
    }
    if kind in FLAT:
        t, side, _ = video.grid
        newline = torch.cat([rows, rows[-1:]])  # K grid rows + a newline row (the server's)
        past = torch.cat([coords, coords.new_tensor([[t, 0, 0]])])  # its index, F * P * P
        out |= {
            "newline row": (with_fields(part, **{ROWS: newline}), width),
            "newline counted": (
                with_fields(part, **{ROWS: newline, COORDS: past, COUNT: torch.tensor(k + 1)}),
                "craft_coords: coords must fit the grid",
            ),
            "Qwen-style grid": (
                with_fields(part, **{GRID: torch.tensor([t, 2 * side, 2 * side])}),
                f"must have H = W = {side}",
            ),
        }
    d = kind.HIDDEN
    if kind is tiny_qwen3:
        out |= {
            "deepstack left out": (with_fields(part, **{ROWS: rows[:, :d]}), width),
            "deepstack level extra": (
                with_fields(part, **{ROWS: torch.cat([rows, rows[:, d:]], 1)}),
                "(the width 128 x (1 + 1 deepstack levels))",
            ),
            "deepstack half": (with_fields(part, **{ROWS: rows[:, : d + d // 2]}), width),
        }
    if kind in (tiny_qwen3_5, tiny_glm4v):  # no deepstack: its layout's rows are refused
        out["deepstack columns"] = (
            with_fields(part, **{ROWS: torch.cat([rows, rows], 1)}),
            f"{width}{d} (the width)]",
        )
    if kind is tiny_glm4v:  # whole seconds; group runs that would leave the rotary table
        stamps = torch.tensor(timestamps(kind, FRAMES[0]), dtype=torch.float64)
        # 300 groups of 64 x 64 (its coords fit): 2 + 300 x (2 + 64 + 1-3 digits) positions,
        # over the 4096 - 2048 the tiny model leaves and past vLLM's rotary cache (4 x 4096:
        # its worker would die), in a prompt of some 1,500 tokens
        long, side = 300, 128
        out |= {
            "seconds fraction": (
                with_fields(part, **{TIMESTAMPS: stamps + 0.5}),
                "timestamps must be whole seconds",
            ),
            "runs past the rotary table": (
                with_fields(
                    part,
                    **{
                        GRID: torch.tensor([long, side, side]),
                        TIMESTAMPS: torch.arange(long, dtype=torch.float64),
                    },
                ),
                f"video_grid_thw [[{long}, {side}, {side}]] spreads the video over",
            ),
        }
    if kind in TIMED:
        stamps = torch.tensor(timestamps(kind, FRAMES[0]), dtype=torch.float64)
        out |= {
            "timestamps missing": (
                with_fields(part, **{TIMESTAMPS: None}),
                "missing field(s) ['timestamps']",
            ),
            "timestamps short": (
                with_fields(part, **{TIMESTAMPS: stamps[1:]}),
                "timestamps must be [V, T] floating seconds",
            ),
            "timestamps NaN": (
                with_fields(part, **{TIMESTAMPS: stamps * float("nan")}),
                "timestamps must be finite",
            ),
        }
    return out


def test_malformed_payloads_get_a_400_naming_the_field(backbone, tmp_path) -> None:
    _, case, base = backbone
    model = str(case.model)
    before = ask(base, model, parts(backbone, case.compressed[:1])[0])
    assert_refused(base, model, malformed(backbone))
    # the same server answers the CLI's body as before: the file records the rate and frame
    # count its frames were sampled at (as craft-compress writes them)
    video = case.compressed[0]
    meta = {**video.metadata, "fps": engine.FPS, "frames": FRAMES[0]}
    path = tmp_path / "clip.craft.safetensors"
    craft_adapters.save_compressed_video(path, dataclasses.replace(video, metadata=meta))
    assert_same_answer(post(base, cli_body(path, model)), before)


@pytest.mark.parametrize(
    "kind", [tiny_qwen3, tiny_qwen3_5, tiny_glm4v], ids=["qwen3_vl", "qwen3_5", "glm4v"]
)
def test_payload_cli_writes_run_timestamps(kind, tmp_path, capsys) -> None:
    """The CLI's (`payload.main`, in process) Qwen3-VL / Qwen3.5 / GLM-4.1V body carries the
    frame runs' seconds the processor would write (odd frame counts too: the last frame
    repeated; GLM-4.1V: whole seconds); a
    file without its rate is refused unless `--fps` gives it, and a rate or frame count that
    does not fit the grid is refused, as is `--fps` for a LLaVA-OneVision file: exit 2, one
    line."""
    d, grid = kind.HIDDEN, (6, 3, 3)
    coords = torch.tensor([[0, 0, 0], [2, 1, 1], [5, 2, 2]])
    made = {"model_type": kind.config().model_type, "hidden_size": d}
    deep = torch.ones(3, d) if kind is tiny_qwen3 else None
    video = CompressedVideo(torch.ones(3, d), coords, grid, made, deep)

    def save(name: str, **meta: Any) -> str:
        path = tmp_path / f"{name}.craft.safetensors"
        saved = dataclasses.replace(video, metadata={**made, **meta})
        return str(craft_adapters.save_compressed_video(path, saved))

    def cli(*args: str) -> tuple[int, str, str]:
        code = payload.main([*args, "--model", "m"])
        out = capsys.readouterr()
        return code, out.out, out.err

    for fps, frames, args in [
        (2.0, 12, ()),
        (3.0, 11, ()),
        (0.5, 12, ()),
        (4.0, 12, ("--fps", "4")),
    ]:
        meta = {"fps": fps, "frames": frames} if not args else {}
        code, out, _ = cli(save(f"f{frames}", **meta), *args)
        sent = json.loads(out)["messages"][0]["content"][0]["video_embeds"][TIMESTAMPS]
        stamps = torch.load(io.BytesIO(base64.b64decode(sent)), weights_only=True)
        want = processor_timestamps(frames, kind, fps)
        assert code == 0 and stamps.dtype == torch.float64
        assert stamps.tolist() == pytest.approx(want, abs=1e-12)
    bare = save("bare")
    for args, message in [
        ([bare], "has no fps (give the rate its frames were sampled at: --fps"),
        ([bare, "--fps", "0"], "fps must be > 0 and finite"),
        ([bare, "--fps", "nan"], "fps must be > 0 and finite"),
        ([save("long", fps=2.0, frames=14)], "14 frames make 7 frame runs"),
        (
            [save("llava", model_type="llava_onevision"), "--fps", "2"],
            "fps is for glm4v / qwen3_5 / qwen3_vl payloads only",
        ),
    ]:
        code, out, err = cli(*args)
        assert code == 2 and out == "", (code, out)
        assert err.count("\n") == 1 and message in err and ".craft.safetensors: " in err, err
