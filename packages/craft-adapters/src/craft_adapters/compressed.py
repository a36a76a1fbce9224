"""A video as CRAFT left it, on disk: compress once, answer many questions later.

    videos = wrapped.compress_videos(**inputs)          # craft_adapters.CraftModel
    save_compressed_video("clip.craft.safetensors", videos[0])
    video = load_compressed_video("clip.craft.safetensors")   # another process, later

A `CompressedVideo` is the kept rows (after the merge, in the language model's width) and
each kept token's ORIGINAL `(t, h, w)` in the video's grid of merged tokens, plus the grid
itself: what a server needs to place the rows at their positions without running the vision
tower or the compressor again (craft-vllm serves it; that is how the threshold mode, whose
token count depends on the content, is served). The file is safetensors (no pickle): tensors
`features` and `coords` (and `deepstack` where the backbone has deepstack rows: Qwen3-VL),
and the grid and free-form metadata as JSON in the header.

What the video was made with travels in the metadata, so a server can refuse a mismatch
(`check_made_with`): `model_type` (since 0.4, `compress_videos`), and from `craft-compress`
(0.6) `hidden_size`, `craft_sha256` (`checkpoint_sha256` of the CRAFT module), `backbone`,
`source_sha256`. Files without them still load; `check_made_with` names what is missing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from craft_core.checks import check_index_tensor

__all__ = [
    "CompressedVideo",
    "check_made_with",
    "checkpoint_sha256",
    "load_compressed_video",
    "save_compressed_video",
]

FORMAT = "craft-compressed-video/1"


@dataclass(frozen=True)
class CompressedVideo:
    """One compressed video; checked when built (a bad field is named).

    Attributes:
        features: `[K, D]` floating, finite: the kept rows.
        coords: `[K, 3]` int64: each row's original `(t, h, w)` in the grid, in the video's
            row-major order (strictly ascending `kept_index`).
        grid: `(T, H, W)` of the uncompressed video in merged tokens (N = T * H * W).
        metadata: JSON-able extras (backbone, budget, `second_per_grid`, ...).
        deepstack: `[K, levels * D]` floating, finite, or None: Qwen3-VL's deepstack rows of
            each kept token (the mean over the tokens merged into it, craft-adapters' rule),
            its levels side by side (vLLM's layout of Qwen3-VL's embedding inputs).
    """

    features: torch.Tensor
    coords: torch.Tensor
    grid: tuple[int, int, int]
    metadata: dict[str, Any] = field(default_factory=dict)
    deepstack: torch.Tensor | None = None

    def __post_init__(self) -> None:
        f, c = self.features, self.coords
        if not isinstance(f, torch.Tensor) or f.dim() != 2 or not f.is_floating_point():
            raise ValueError(f"features must be a [K, D] floating tensor, got {_describe(f)}")
        if f.shape[0] < 1 or not bool(torch.isfinite(f).all()):
            raise ValueError("features must hold at least one row, all finite (NaN/inf found)")
        deep = self.deepstack
        if deep is not None and (
            not isinstance(deep, torch.Tensor)
            or deep.dim() != 2
            or not deep.is_floating_point()
            or deep.shape[0] != f.shape[0]
            or deep.shape[1] % f.shape[1]
            or not bool(torch.isfinite(deep).all())
        ):
            raise ValueError(
                f"deepstack must be a [K = {f.shape[0]}, levels * {f.shape[1]}] finite floating "
                f"tensor or None, got {_describe(deep)}"
            )
        check_index_tensor("coords", c, dim=2)
        if c.shape[1] != 3 or c.shape[0] != f.shape[0]:
            raise ValueError(
                f"coords must be [K, 3] with K = {f.shape[0]} (the rows of features), "
                f"got shape {tuple(c.shape)}"
            )
        grid = tuple(self.grid)
        if len(grid) != 3 or any(isinstance(g, bool) or not isinstance(g, int) for g in grid):
            raise ValueError(f"grid must be 3 ints (T, H, W), got {self.grid!r}")
        if min(grid) < 1:
            raise ValueError(f"grid entries must be >= 1, got {grid}")
        object.__setattr__(self, "grid", grid)
        object.__setattr__(self, "coords", c.long())
        low, high = c.min(0).values, c.max(0).values
        if bool((low < 0).any()) or any(int(high[i]) >= grid[i] for i in range(3)):
            raise ValueError(
                f"coords must fit the grid {grid}: got (t, h, w) from {low.tolist()} "
                f"to {high.tolist()}"
            )
        index = self.kept_index
        if index.numel() > 1 and not bool((index[1:] > index[:-1]).all()):
            raise ValueError("coords must be distinct and in the video's (t, h, w) order")

    @property
    def num_tokens(self) -> int:
        """N: the video's merged tokens before compression."""
        t, h, w = self.grid
        return t * h * w

    @property
    def kept_index(self) -> torch.Tensor:
        """`[K]` long: each row's index among the N tokens (row-major over the grid)."""
        _, h, w = self.grid
        c = self.coords.long()
        return (c[:, 0] * h + c[:, 1]) * w + c[:, 2]


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"shape {tuple(value.shape)} dtype {value.dtype}"
    return type(value).__name__


def save_compressed_video(path: str | Path, video: CompressedVideo) -> Path:
    """Write `video` to `path` (safetensors; parent folders must exist); return the path.
    The same video gives the same bytes (the header's keys in sorted order)."""
    from safetensors.torch import save

    path = Path(path)
    header = {"format": FORMAT, "grid": json.dumps(list(video.grid))}
    header["metadata"] = json.dumps(video.metadata)  # refuses what JSON cannot hold
    tensors = {"features": video.features.detach().cpu().contiguous()}
    tensors["coords"] = video.coords.detach().cpu().contiguous()
    if video.deepstack is not None:
        tensors["deepstack"] = video.deepstack.detach().cpu().contiguous()
    path.write_bytes(_sorted_header(save(tensors, metadata=header)))
    return path


def _sorted_header(blob: bytes) -> bytes:
    """A safetensors file with its JSON header re-written in sorted key order: safetensors
    writes its metadata map in a per-process random order. Tensor offsets are relative to
    the data section, which is unchanged; the header stays padded to 8 bytes."""
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + size])
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + blob[8 + size :]


def load_compressed_video(path: str | Path) -> CompressedVideo:
    """Read a file `save_compressed_video` wrote; every field is checked again.

    Raises:
        FileNotFoundError: no such file. ValueError: not a compressed-video file, or a field
            that does not check (the message names the file and the field).
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"compressed video {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as handle:
            header = handle.metadata() or {}
            tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
    except Exception as error:  # safetensors raises its own error types
        raise ValueError(f"{path} is not a readable safetensors file: {error}") from None
    if header.get("format") != FORMAT or set(tensors) - {"deepstack"} != {"features", "coords"}:
        raise ValueError(
            f"{path} is not a compressed video (format {header.get('format')!r}, tensors "
            f"{sorted(tensors)}); write one with save_compressed_video"
        )
    try:
        grid = tuple(json.loads(header["grid"]))
        metadata = json.loads(header.get("metadata", "{}"))
        deep = tensors.get("deepstack")
        return CompressedVideo(tensors["features"], tensors["coords"], grid, metadata, deep)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path}: {error}") from None


def checkpoint_sha256(compressor: torch.nn.Module) -> str:
    """SHA-256 of a CRAFT module's weights: every state-dict entry (name, dtype, shape, bytes)
    in name order, so the same checkpoint gives the same digest wherever it was loaded from
    (folder, Hub cache, any device)."""
    digest = hashlib.sha256()
    for name, value in sorted(compressor.state_dict().items()):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{list(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def check_made_with(
    video: CompressedVideo, source: str = "compressed video", **expected: Any
) -> None:
    """Refuse a video made with another backbone or CRAFT module than the server's, e.g.
    `check_made_with(video, model_type="qwen2_5_vl", hidden_size=3584, craft_sha256=digest)`.

    Raises:
        ValueError: a key of `expected` that the metadata lacks (a file written before it was
            recorded) or holds with another value; the message names `source` and the key.
    """
    for key, want in expected.items():
        if key not in video.metadata:
            raise ValueError(
                f"{source}: its metadata has no {key} (written before it was recorded)"
            )
        if video.metadata[key] != want:
            raise ValueError(
                f"{source}: made with {key}={video.metadata[key]!r}, this server has {want!r}"
            )
