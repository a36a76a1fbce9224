"""A compressed video in a request, as a client builds it (no vLLM import: torch and
craft-adapters are enough on the client's side).

Two forms of one payload (the fields below, one video):

- Python (`LLM.generate`): `{"prompt": ..., "multi_modal_data": {"video": video_payload(v)}}`;
- the OpenAI API of `vllm serve --enable-mm-embeds`: the content part `chat_part(v)`, vLLM's
  own `video_embeds` part (a dict of base64 tensors, `torch.save` bytes; vLLM reads them with
  `torch.load(weights_only=True)`). `python -m craft_vllm.payload FILE` prints a whole request.

Fields (K kept rows of width D, a grid of T x H x W merged tokens):

| field | Python `[V = 1, ...]` | chat part (one video) |
| --- | --- | --- |
| `video_embeds` | `[K, D]` floating (Qwen3-VL: `[K, D + levels * D]`, the deepstack rows after) | `[K, D]` |
| `video_grid_thw` | `[1, 3]` int: T, H * merge, W * merge (patches; LLaVA-OneVision: F, P, P) | `[3]` |
| `craft_coords` | `[K, 3]` int: each row's original (t, h, w) | `[K, 3]` |
| `craft_num_kept` | `[1]` int: K | `[]` |
| `second_per_grid_ts` | `[1]` float: seconds per grid step | `[]` |
| `craft_made_with` | `[1, L]` uint8: JSON of what made it (`MADE_WITH`) | `[L]` |
| `timestamps` (Qwen3-VL, Qwen3.5, GLM-4.1V) | `[1, T]` float64: each frame run's seconds | `[T]` |
"""

from __future__ import annotations

import argparse
import ast
import base64
import io
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from craft_adapters import CompressedVideo

ROWS, GRID = "video_embeds", "video_grid_thw"
COORDS, COUNT, SECONDS = "craft_coords", "craft_num_kept", "second_per_grid_ts"
MADE_WITH = "craft_made_with"
TIMESTAMPS = "timestamps"  # Qwen3-VL / Qwen3.5 / GLM-4.1V: each frame run's seconds (text)
PER_VIDEO = (GRID, COUNT, SECONDS, MADE_WITH, TIMESTAMPS)  # one entry per video (batched)
MADE_WITH_KEYS = ("model_type", "hidden_size", "craft_sha256")
"""What a server compares with its own (`craft_adapters.check_made_with`): the backbone's
family and width, the CRAFT checkpoint's digest (`checkpoint_sha256`)."""


def encode_made_with(metadata: dict[str, Any]) -> torch.Tensor:
    """`[L]` uint8: the UTF-8 JSON of `metadata`'s `MADE_WITH_KEYS` (those it has)."""
    made = {k: metadata[k] for k in MADE_WITH_KEYS if k in metadata}
    text = json.dumps(made, sort_keys=True).encode()
    return torch.frombuffer(bytearray(text), dtype=torch.uint8)


def decode_made_with(value: Any) -> dict[str, Any]:
    """The dict `encode_made_with` wrote (`[L]` or `[1, L]` uint8).

    Raises:
        ValueError: not a uint8 tensor of one video's UTF-8 JSON object (names the field).
    """
    ok = isinstance(value, torch.Tensor) and value.dtype == torch.uint8
    if ok and value.dim() == 2 and value.shape[0] == 1:
        value = value[0]
    try:
        if not ok or value.dim() != 1:
            raise TypeError
        made = json.loads(bytes(value.tolist()).decode())
        if not isinstance(made, dict):
            raise TypeError
    except (TypeError, ValueError):
        raise ValueError(
            f"compressed video payload: {MADE_WITH} must be one video's [L] uint8 UTF-8 JSON "
            f"object (payload.encode_made_with), got {describe(value)}"
        ) from None
    return made


def describe(value: Any) -> str:
    """A field's shape and dtype (or type) for an error message."""
    if isinstance(value, torch.Tensor):
        return f"shape {tuple(value.shape)} dtype {str(value.dtype).removeprefix('torch.')}"
    return type(value).__name__


@dataclass(frozen=True)
class PayloadFormat:
    """What a served backbone needs of a payload, declared by its model file (`PAYLOAD =
    PayloadFormat(...)` at the top of `craft_vllm/<backbone>.py`, as craft-adapters' backbones
    declare theirs), read here from the file's source (`declared_formats`): a client needs
    no vLLM.

    Attributes:
        model_type: the backbone's transformers `model_type` (the payload's `craft_made_with`).
        merge: the spatial merge size: vLLM's `video_grid_thw` is the merged grid `(T, H *
            merge, W * merge)` (1: the grid is the frames' token grid itself).
        frame_runs: frames per run that the prompt writes with its seconds (`<t seconds>`,
            Qwen3-VL and Qwen3.5: 2): the payload carries `timestamps`; 0: it does not.
        flat: 1-D positions: the text after a video of N tokens starts where it does
            uncompressed, whatever was kept (LLaVA-OneVision, InternVL).
        seconds_positions: the temporal positions follow `second_per_grid_ts` (Qwen2.5-VL:
            `tokens_per_second` per second of video).
        run_seconds: how a run's seconds are read off its frames (`frame_timestamps`):
            "mean" of its first and last frame's (Qwen3-VL, Qwen3.5), or the "whole" seconds
            of its first frame (GLM-4.1V writes `int(seconds)`).
    """

    model_type: str
    merge: int = 2
    frame_runs: int = 0
    flat: bool = False
    seconds_positions: bool = False
    run_seconds: str = "mean"


@dataclass(frozen=True)
class ServedBackbone:
    """One model file of `craft_vllm`: its module name, the CRAFT architecture it serves
    (`ARCHITECTURE`, also its model class's name) and its `PAYLOAD`."""

    module: str
    architecture: str
    payload: PayloadFormat


def _declared(path: Path) -> ServedBackbone | None:
    """The model file `path`'s `ARCHITECTURE = "..."` and `PAYLOAD = PayloadFormat(...)`
    (literal arguments), read from its source; None for a module without `PAYLOAD`."""
    found: dict[str, Any] = {}
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.Assign):
            continue
        name, call = ast.unparse(node.targets[0]), node.value
        if name == "ARCHITECTURE":
            found[name] = ast.literal_eval(call)
        if name != "PAYLOAD":
            continue
        if not (isinstance(call, ast.Call) and ast.unparse(call.func) == "PayloadFormat"):
            raise TypeError(f"{path.name}: PAYLOAD must be PayloadFormat(...)")
        args = [ast.literal_eval(a) for a in call.args]
        kwargs = {str(k.arg): ast.literal_eval(k.value) for k in call.keywords}
        found[name] = PayloadFormat(*args, **kwargs)
    if "PAYLOAD" not in found:
        return None
    if not isinstance(found.get("ARCHITECTURE"), str):
        raise TypeError(f'{path.name}: a model file declares ARCHITECTURE = "Craft..."')
    return ServedBackbone(path.stem, found["ARCHITECTURE"], found["PAYLOAD"])


@lru_cache(maxsize=1)
def served_backbones() -> tuple[ServedBackbone, ...]:
    """Every model file of `craft_vllm` (a module declaring `PAYLOAD`), read from the sources
    without importing them (they import vLLM): the plugin registers their architectures, a
    client reads their payload formats."""
    found = (_declared(path) for path in sorted(Path(__file__).parent.glob("*.py")))
    return tuple(b for b in found if b is not None)


def declared_formats() -> dict[str, PayloadFormat]:
    """Every served backbone's `PayloadFormat`, by `model_type`."""
    return {b.payload.model_type: b.payload for b in served_backbones()}


def payload_format(model_type: Any) -> PayloadFormat:
    """The served backbone `model_type`'s `PayloadFormat`.

    Raises:
        ValueError: no served backbone has that `model_type`.
    """
    formats = declared_formats()
    if model_type not in formats:
        raise ValueError(
            f"no served backbone has model_type {model_type!r} (the payload's metadata; "
            f"served: {', '.join(sorted(formats))})"
        )
    return formats[model_type]


def frame_timestamps(
    frames: int, fps: float, grid_frames: int, run: int = 2, rule: str = "mean"
) -> list[float]:
    """The `[T]` seconds of each run of `run` frames of `frames` frames sampled at `fps`
    (indices 0, 1, ...: how `craft-compress` and `build_inputs` hand frames to the
    processor), by the processor's rule: the last frame repeated up to a whole run, each run
    the mean of its first and last frame's `index / fps` (`rule="mean"`, Qwen3's
    `_calculate_timestamps`) or the whole seconds of its first frame (`rule="whole"`,
    GLM-4.1V's `int(index / fps)`).

    Raises:
        ValueError: `fps` not > 0 and finite, or `frames` not the `grid_frames` runs' frames.
    """
    if isinstance(fps, bool) or not (isinstance(fps, (int, float)) and 0 < fps < float("inf")):
        raise ValueError(f"fps must be > 0 and finite, got {fps!r}")
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
        raise ValueError(f"frames must be an int >= 1, got {frames!r}")
    if -(-frames // run) != grid_frames:
        raise ValueError(
            f"{frames} frames make {-(-frames // run)} frame runs of {run}, the video's grid "
            f"has T = {grid_frames}"
        )
    index = list(range(frames)) + [frames - 1] * (-frames % run)
    seconds = [i / fps for i in index]
    if rule == "whole":
        return [float(int(s)) for s in seconds[::run]]
    if rule != "mean":
        raise ValueError(f"rule must be 'mean' or 'whole', got {rule!r}")
    return [(seconds[i] + seconds[i + run - 1]) / 2 for i in range(0, len(seconds), run)]


def video_timestamps(video: CompressedVideo, fps: float | None = None) -> list[float] | None:
    """The frame runs' seconds (`frame_timestamps`) of a video whose backbone writes them
    (`PayloadFormat.frame_runs`), from the `fps` and `frames` its metadata records
    (`craft-compress` writes them), or from `fps` (the rate the frames were sampled at; their
    count then `frames` or `frame_runs * T`). None for other backbones.

    Raises:
        ValueError: the rate is unknown (no `fps` recorded or given), or it and the frame
            count do not fit the grid; `fps` given for another backbone; a backbone that
            is not served.
    """
    form = payload_format(video.metadata.get("model_type"))
    run = form.frame_runs
    if not run:
        if fps is not None:  # not ignored: the caller thinks it matters
            timed = [f.model_type for f in declared_formats().values() if f.frame_runs]
            raise ValueError(
                f"fps is for {' / '.join(timed)} payloads only (their frame runs' timestamps), "
                f"this one is {video.metadata.get('model_type')!r}"
            )
        return None
    rate = fps if fps is not None else video.metadata.get("fps")
    if rate is None:
        raise ValueError(
            f"a {video.metadata['model_type']} payload needs its frame runs' timestamps: the "
            "video's metadata has no fps (give the rate its frames were sampled at: --fps, "
            "or the timestamps: video_payload / chat_part's timestamps=)"
        )
    frames = video.metadata.get("frames", video.grid[0] * run)
    return frame_timestamps(frames, rate, video.grid[0], run, form.run_seconds)


def video_payload(
    video: CompressedVideo, merge: int | None = None, timestamps: Sequence[float] | None = None
) -> dict[str, torch.Tensor]:
    """The `multi_modal_data["video"]` of a request carrying `video` (one video).

    `merge`: the backbone's spatial merge size: vLLM's `video_grid_thw` counts patches, the
    compressed video's grid merged tokens. None: the served backbone's (`payload_format` of
    the video's `model_type`: 1 for LLaVA-OneVision and InternVL, 2 for every Qwen and GLM).
    Qwen3-VL: the rows are the main rows and the deepstack rows side by side (`[K, D +
    levels * D]`, vLLM's layout of Qwen3-VL's embedding inputs).
    `timestamps`: for a backbone that writes frame runs' seconds (Qwen3-VL, Qwen3.5,
    GLM-4.1V) only: the T seconds its frame runs are written with, as its processor gives
    them (Qwen3: `processor._calculate_timestamps(indices, fps, 2)`; GLM-4.1V: the whole
    seconds of each run's first frame). None: from the video's metadata
    (`video_timestamps`; refused where it has no `fps`).
    """
    t, h, w = video.grid
    if merge is None:
        merge = payload_format(video.metadata.get("model_type")).merge
    seconds = float(video.metadata.get("second_per_grid", 1.0))
    rows = video.features
    if video.deepstack is not None:
        rows = torch.cat([rows, video.deepstack.to(rows.dtype)], dim=1)
    out = {
        ROWS: rows,
        GRID: torch.tensor([[t, h * merge, w * merge]]),
        COORDS: video.coords,
        COUNT: torch.tensor([video.features.shape[0]]),
        SECONDS: torch.tensor([seconds]),
        MADE_WITH: encode_made_with(video.metadata)[None],
    }
    if timestamps is None:
        timestamps = video_timestamps(video)
    if timestamps is not None:
        out[TIMESTAMPS] = torch.tensor([list(timestamps)], dtype=torch.float64)
    return out


def tensor_base64(tensor: torch.Tensor) -> str:
    """vLLM's base64 tensor: `torch.save` bytes (read with `torch.load(weights_only=True)`)."""
    buffer = io.BytesIO()
    torch.save(tensor.contiguous(), buffer)
    return base64.b64encode(buffer.getvalue()).decode()


def chat_part(
    video: CompressedVideo, merge: int | None = None, timestamps: Sequence[float] | None = None
) -> dict[str, Any]:
    """The OpenAI chat content part carrying `video`: `{"type": "video_embeds",
    "video_embeds": {field: base64 tensor}}`, each per-video field without its batch row
    (vLLM stacks one row per content part)."""
    fields = video_payload(video, merge, timestamps)
    one = {k: v[0] if k in PER_VIDEO else v for k, v in fields.items()}
    return {"type": "video_embeds", "video_embeds": {k: tensor_base64(v) for k, v in one.items()}}


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m craft_vllm.payload FILE --model NAME [--question Q] [--fps R]`: print a chat
    completions request body (JSON) asking `Q` about the compressed video in FILE (Qwen3-VL /
    Qwen3.5: with its frame runs' timestamps, from the file's recorded fps or `--fps`)."""
    from craft_adapters import load_compressed_video

    parser = argparse.ArgumentParser(prog="python -m craft_vllm.payload", description=main.__doc__)
    parser.add_argument("file", help="a *.craft.safetensors payload (craft-compress)")
    parser.add_argument("--model", required=True, help="the served model's name")
    parser.add_argument("--question", default="What happens in this video?")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--fps",
        type=float,
        help="Qwen3-VL / Qwen3.5 / GLM-4.1V: the rate the video's frames were sampled at, for a file "
        "that does not record it (craft-compress does; given, it overrides the file's)",
    )
    args = parser.parse_args(argv)
    try:
        video = load_compressed_video(args.file)  # its errors name the file
        try:
            part = chat_part(video, timestamps=video_timestamps(video, args.fps))
        except ValueError as error:
            raise ValueError(f"{args.file}: {error}") from None
    except (FileNotFoundError, ValueError) as error:
        message = " ".join(str(error).split())  # one line
        print(f"python -m craft_vllm.payload: {message}", file=sys.stderr)
        return 2
    content = [part, {"type": "text", "text": args.question}]
    body = {
        "model": args.model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": args.max_tokens,
        "temperature": 0,
    }
    json.dump(body, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
