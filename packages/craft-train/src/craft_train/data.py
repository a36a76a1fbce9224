"""Manifests, the per-source mixture, the data order, and the dataset of encoded examples.

A manifest is a JSONL file, one example per line:

    {"video": "clips/a.mp4", "caption": "A dog runs.", "source": "webvid"}              # stage 1
    {"video": "b.mp4", "question": "What falls?", "answer": "A cup.", "source": "nextqa"}  # stage 2

The mixture caps each source (a seeded subset) or resamples it to a target count; the
order of an epoch is a seeded permutation of the mixture, dealt round-robin to the ranks.
Everything here is a pure function of the seed, so a resumed run sees the same examples in
the same order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from craft_adapters.data_files import (
    Example,
    FileRow,
    FormatError,
    Problem,
    detect_format,
    read_data_file,
    read_rows,
    row_content,
)
from craft_train.config import ConfigError, DataFile, MixtureConfig, TrainingConfig

__all__ = [
    "DataLoad",
    "DecodeError",
    "Example",
    "NoUsableData",
    "VideoTextDataset",
    "build_mixture",
    "collate",
    "epoch_order",
    "load_data",
    "rank_indices",
    "read_manifest",
    "sample_rows",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

SEQUENCE_KEYS = ("input_ids", "attention_mask", "labels", "mm_token_type_ids", "token_type_ids")
"""Per-token `[1, L]` tensors that are padded (right) when examples are batched."""


class DecodeError(RuntimeError):
    """A video could not be read; the dataset skips the example and counts it."""


def json_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The JSON-object rows of a JSONL file, each with its `file:line` for error messages.

    Raises:
        ConfigError: a line that is not valid JSON or not an object (file:line named).
    """
    rows = []
    with path.open() as handle:
        for lineno, line in enumerate(handle, start=1):
            if line.strip():
                where = f"{path}:{lineno}"
                rows.append((where, json_object(line, where)))
    return rows


def json_object(text: str, where: str) -> dict[str, Any]:
    """`text` parsed as one JSON object (a manifest row, a DeepSpeed config).

    Raises:
        ConfigError: not valid JSON, or not an object; the message starts with `where`.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{where}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a JSON object")
    return data


def read_manifest(
    path: str | Path, stage: int, *, caption_prompt: str, video_root: str | None = None
) -> list[Example]:
    """Read and check one manifest (JSONL, or a JSON array).

    Args:
        path: the file.
        stage: 1 (rows need `caption`) or 2 (rows need `question` and `answer`).
        caption_prompt: prompt of stage-1 rows that give no `prompt` of their own.
        video_root: folder relative video paths start in (default: the manifest's folder).

    Raises:
        ConfigError: a row that is not a JSON object, or lacks a field (file, line and field
            named).
    """
    path = Path(path)
    try:
        rows = read_rows(path)
    except FormatError as err:
        raise ConfigError(str(err)) from None
    return manifest_examples(path, rows, stage, caption_prompt, video_root)


def manifest_examples(
    path: Path, rows: Sequence[FileRow], stage: int, caption_prompt: str, video_root: str | None
) -> list[Example]:
    """The examples of a manifest's `rows`, strictly: a bad row is an error naming it."""
    root = Path(video_root) if video_root is not None else path.parent
    needed = (
        ("video", "caption", "source") if stage == 1 else ("video", "question", "answer", "source")
    )
    examples = []
    for line, row, error in rows:
        where = f"{path}:{line}"
        if error is not None or not isinstance(row, dict):
            raise ConfigError(f"{where}: {error or 'must be a JSON object'}")
        for field in needed:
            value = row.get(field)
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(f"{where}: field {field!r} must be a non-empty string")
        video = Path(row["video"]).expanduser()
        video = video if video.is_absolute() else root / video
        if stage == 1:
            prompt = row.get("prompt") or caption_prompt
            target = row["caption"]
        else:
            prompt, target = row["question"], row["answer"]
        examples.append(
            Example(str(video), prompt.strip(), target.strip(), row["source"], origin=where)
        )
    if not examples:
        raise ConfigError(f"{path}: the manifest holds no examples")
    return examples


def build_mixture(examples: Sequence[Example], mixture: MixtureConfig, seed: int) -> list[Example]:
    """Cap or resample every source, deterministically for a given seed.

    Sources keep their first-seen order; within a source a capped subset keeps the
    manifest order. Resampling to a larger `target` repeats every row `target // n` times and
    draws the remainder without replacement.

    Raises:
        ConfigError: the mixture names a source that no manifest row has.
    """
    by_source: dict[str, list[Example]] = {}
    for example in examples:
        by_source.setdefault(example.source, []).append(example)
    unknown = sorted(set(mixture.sources) - set(by_source))
    if unknown:
        raise ConfigError(
            f"data.mixture.sources: {unknown} appear in no manifest (sources present: "
            f"{sorted(by_source)})"
        )
    out: list[Example] = []
    for name, rows in by_source.items():
        spec = mixture.sources.get(name)
        rng = random.Random(f"craft-mixture/{seed}/{name}")
        n = len(rows)
        if spec is not None and spec.target is not None:
            out.extend(_resample(rows, spec.target, rng))
            continue
        cap = spec.cap if spec is not None and spec.cap is not None else mixture.default_cap
        if cap is None or n <= cap:
            out.extend(rows)
        else:
            out.extend(rows[i] for i in sorted(rng.sample(range(n), cap)))
    return out


@dataclass
class DataLoad:
    """What the data files gave: the mixture, the rows that cannot be used, and notes (a
    sampling strategy that asked for more rows than a file has)."""

    examples: list[Example]
    problems: list[Problem] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


class NoUsableData(ConfigError):
    """No row of the data files can be used; `load` holds every row that cannot (`--check`
    lists them)."""

    def __init__(self, load: DataLoad) -> None:
        first = f", first: {load.problems[0]}" if load.problems else ""
        super().__init__(f"data: no usable example in the data files ({len(load.problems)} "
                         f"rows cannot be used{first}; run with --check to list them)")  # fmt: skip
        self.load = load


def read_file(
    path: str | Path,
    fmt: str,
    cfg: TrainingConfig,
    entry: DataFile | None = None,
    select: Callable[[list[FileRow]], list[FileRow]] | None = None,
) -> tuple[list[Example], list[Problem]]:
    """One data file of any format (`fmt` "auto": detected), its rows chosen by `select`;
    `entry`: the mixture entry it comes from (source, video root, frame rate, columns).

    Raises:
        ConfigError: the file is empty, not JSON / JSONL, its format cannot be told, or (a
            craft-train manifest) a row is bad.
    """
    path = Path(path)
    root = (entry.video_root if entry is not None else None) or cfg.data.video_root
    source = entry.source if entry is not None else None
    fps = entry.video_fps if entry is not None else None
    try:
        rows = read_rows(path)
        fmt = detect_format(path, rows) if fmt == "auto" else fmt
        if fmt != "craft":
            return read_data_file(
                path, fmt, source=source, video_root=root, video_fps=fps, select=select, rows=rows,
                caption_prompt=cfg.data.caption_prompt,
                columns=entry.columns if entry is not None else None,
                tags=entry.tags if entry is not None else None,
            )  # fmt: skip
    except FormatError as err:
        raise ConfigError(str(err)) from None
    stage = 2 if cfg.stage == 2 else 1
    chosen = select(rows) if select is not None else rows
    examples = manifest_examples(path, chosen, stage, cfg.data.caption_prompt, root)
    if source is not None or fps is not None:
        examples = [dataclasses.replace(e, source=source or e.source, video_fps=fps)
                    for e in examples]  # fmt: skip
    return examples, []


def sample_rows(
    rows: Sequence[T], strategy: str, seed: int, content: Callable[[T], str]
) -> tuple[list[T], str | None]:
    """LLaVA-OneVision's `sampling_strategy` over one file's rows -> (kept, note).

    `first:N` / `end:N`: the first / last N rows; `random:N`: the N rows whose
    `content(row)` hashes lowest with `seed` (a seeded subset that depends on the rows, not
    on where the file lies or how it is laid out), in file order; `P%` takes
    ceil(P% of the rows). A count larger than the file takes every row and returns a note.
    """
    if strategy == "all":
        return list(rows), None
    kind, amount = strategy.split(":")
    n = len(rows)
    count = math.ceil(float(amount[:-1]) * n / 100) if amount.endswith("%") else int(amount)
    note = None
    if count > n:
        note = f"sampling_strategy {strategy} asks {count} rows, the file has {n}; all taken"
        count = n
    if kind == "first":
        return list(rows[:count]), note
    if kind == "end":
        return list(rows[n - count :]), note
    keys = [hashlib.sha256(f"craft-sampling/{seed}/{content(r)}".encode()).digest() for r in rows]
    picked = sorted(range(n), key=lambda i: (keys[i], i))[:count]
    return [rows[i] for i in sorted(picked)], note


def load_data(cfg: TrainingConfig) -> DataLoad:
    """Read `data.manifests` and the mixture's `datasets`, sample, cap, mix durations.

    Cheap: no video is opened. Rows that cannot be used are returned in `problems`, not
    trained on; a sampling strategy picks file rows, and a picked row that cannot be used is
    left out (listed), not replaced by another.

    Raises:
        NoUsableData: not one row can be used (it holds them all).
    """
    mixture = cfg.mixture()
    seed = mixture.seed if mixture.seed is not None else cfg.optim.seed
    load = DataLoad([])
    bucket: dict[int, str] = {}  # id(example) -> its file's duration bucket
    for manifest in cfg.data.manifests:
        examples, problems = read_file(manifest, "auto", cfg)
        load.examples += examples
        load.problems += problems
    for entry in mixture.datasets:
        select = _sampler(entry, entry.seed if entry.seed is not None else seed, load.notes)
        path = mixture.dataset_path(entry)
        examples, problems = read_file(path, entry.format, cfg, entry, select)
        load.problems += problems
        load.examples += examples
        bucket.update((id(e), str(entry.duration)) for e in examples)
    if not load.examples:
        raise NoUsableData(load)
    load.examples = build_mixture(load.examples, mixture, seed)
    if mixture.duration_mix is not None:
        if cfg.data.manifests:
            raise ConfigError("data.mixture.duration_mix: data.manifests have no duration; "
                              "list those files as mixture datasets with `duration:`")  # fmt: skip
        shares = {str(k): v for k, v in mixture.duration_mix.items()}
        load.examples = mix_durations(load.examples, bucket, shares, seed)
    return load


def _sampler(
    entry: DataFile, seed: int, notes: list[str]
) -> Callable[[list[FileRow]], list[FileRow]]:
    """The rows of `entry`'s file its `sampling_strategy` keeps; a note lands in `notes`."""

    def select(rows: list[FileRow]) -> list[FileRow]:
        kept, note = sample_rows(rows, entry.sampling_strategy, seed, row_content)
        notes.extend([f"{entry.json_path}: {note}"] if note else [])
        return kept

    return select


def mix_durations(
    examples: Sequence[Example], bucket: dict[int, str], shares: Mapping[str, float], seed: int
) -> list[Example]:
    """Resample each duration bucket to `round(share / sum(shares) * len(examples))` rows
    (seeded; the paper's 33 / 35 / 31 % sum to 99 %)."""
    total = len(examples) / sum(shares.values())
    out: list[Example] = []
    for name, share in shares.items():
        rows = [e for e in examples if bucket.get(id(e)) == name]
        if not rows:
            raise ConfigError(f"data.mixture.duration_mix: no example in bucket {name!r}")
        rng = random.Random(f"craft-durations/{seed}/{name}")
        out.extend(_resample(rows, round(share * total), rng))
    return out


def _resample(rows: Sequence[Example], count: int, rng: random.Random) -> list[Example]:
    """Exactly `count` rows: a seeded subset (file order kept) when there are enough, else
    every row `count // n` times plus a seeded subset for the remainder."""
    n = len(rows)
    if count <= n:
        return [rows[i] for i in sorted(rng.sample(range(n), count))]
    return list(rows) * (count // n) + [rows[i] for i in sorted(rng.sample(range(n), count % n))]


def mixture_summary(examples: Sequence[Example]) -> dict[str, int]:
    """Rows per source."""
    return dict(Counter(e.source for e in examples))


def epoch_order(num_examples: int, seed: int, epoch: int) -> list[int]:
    """The seeded permutation of the mixture for one epoch (same on every rank)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_examples, generator=generator).tolist()


def rank_indices(order: Sequence[int], rank: int, world_size: int, per_step: int) -> list[int]:
    """This rank's share of an epoch: every `world_size`-th index, cut to whole steps.

    Every rank gets the same number of examples, a multiple of `per_step`
    (`per_device_batch_size * grad_accum`), so all ranks run the same optimizer steps.
    """
    usable = (len(order) // (world_size * per_step)) * world_size * per_step
    return list(order[rank:usable:world_size])


class VideoTextDataset(torch.utils.data.Dataset):
    """Examples encoded for the model; a video that fails to decode is skipped and counted.

    `encode(example)` returns the model inputs of one example (`[1, L]` sequence tensors
    plus the processor's video tensors) and raises `DecodeError` for an unreadable video.
    Item `i` then falls through to `i + 1, i + 2, ...` (wrapping), so the data order stays a
    function of the seed; the item records how many videos it skipped and which.
    """

    def __init__(
        self,
        examples: Sequence[Example],
        encode: Callable[[Example], dict[str, Any]],
        *,
        max_consecutive_failures: int = 32,
    ) -> None:
        self.examples = list(examples)
        self.encode = encode
        self.max_consecutive_failures = max_consecutive_failures

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        skipped: list[str] = []
        for attempt in range(min(self.max_consecutive_failures, len(self.examples))):
            example = self.examples[(index + attempt) % len(self.examples)]
            try:
                item = self.encode(example)
            except DecodeError as err:
                log.warning("skipping %s: %s", example.video, err)
                skipped.append(example.video)
                continue
            item["skipped_videos"] = skipped
            return item
        raise RuntimeError(
            f"{len(skipped)} videos in a row failed to decode (from example {index}, first "
            f"{skipped[0]!r}); is data.video_root right?"
        )


def collate(batch: Sequence[dict[str, Any]], pad_token_id: int) -> dict[str, Any]:
    """Batch encoded examples: pad the sequences on the right, concatenate video tensors.

    Labels are padded with -100 and attention masks with 0; other per-token tensors with
    `pad_token_id` (ids) or 0. Video tensors (pixel values, grids, ...) are concatenated on
    their first dimension, as the processors do for several videos.
    """
    out: dict[str, Any] = {"skipped_videos": [p for item in batch for p in item["skipped_videos"]]}
    keys = [k for k in batch[0] if k != "skipped_videos"]
    length = max(int(item["input_ids"].shape[-1]) for item in batch)
    for key in keys:
        values = [item[key] for item in batch]
        if key in SEQUENCE_KEYS:
            fill = {"labels": -100, "input_ids": pad_token_id}.get(key, 0)
            padded = []
            for value in values:
                value = value.reshape(1, -1)
                extra = length - value.shape[-1]
                if extra:
                    value = torch.cat([value, value.new_full((1, extra), fill)], dim=-1)
                padded.append(value)
            out[key] = torch.cat(padded, dim=0)
        elif isinstance(values[0], torch.Tensor):
            out[key] = torch.cat(values, dim=0) if len(values) > 1 else values[0]
        else:
            out[key] = [
                v for value in values for v in (value if isinstance(value, list) else [value])
            ]
    return out
