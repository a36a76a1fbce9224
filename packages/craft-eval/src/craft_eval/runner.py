"""The evaluation loop: items -> prompts -> backend -> parser -> scorer, streamed to JSONL.

Layout of a run directory (one per benchmark x method x budget):

    <run_dir>/records.rank<r>.jsonl   header line, then one line per finished item, then a
                                      "done" line; appended and flushed as items finish
    <run_dir>/records.jsonl           all ranks merged, in benchmark order (written at the end)
    <run_dir>/summary.json            config + protocol + scores

A killed run started again with the same arguments reads its shard, skips every item already
recorded (a half-written LAST line is dropped; a bad line anywhere else is an error, nothing is
deleted) and goes on; the merged summary is the same as an uninterrupted run's. Result files
are only appended to. Each rank holds a lock on `<run_dir>/.lock.rank<r>` while it writes, so a
second run into the same folder is refused instead of interleaving lines (the lock goes with
the process, so a SIGKILLed run can be resumed at once). A video that cannot be decoded becomes an error record for that
item (scored wrong) and the run goes on.

Data parallel: with torchrun each process reads RANK / WORLD_SIZE from the environment,
takes items[rank::world_size], and rank 0 merges once every shard has its "done" line.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from craft_core import TokenBudget
from craft_eval.scoring import summarize
from craft_eval.tasks import Item, Prompt, get_benchmark


class VideoDecodeError(RuntimeError):
    """A video that is missing or cannot be decoded: recorded as an error for its item."""


class RunLocked(RuntimeError):
    """Another process is writing the same run folder (and rank)."""


class CorruptRecords(ValueError):
    """A results file with a bad line that is not a torn last line: nothing is dropped."""


_BUDGET_OPTIONS = ("--ratio", "--threshold", "--min-tokens")
# Questions whose videos a backend with `prefetch` (HFBackend) compresses in one call ahead of
# them: CRAFT's cost on a small video is mostly per-op overhead (methods/ahead.py).
AHEAD = 16


@dataclass
class Generation:
    """What a backend returns for one item."""

    reply: str
    tokens_before: int | None = None
    tokens_after: int | None = None
    num_frames: int | None = None
    frames_capped: bool = False
    compress_ms: float | None = None
    prefill_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    first_logprobs: Any = None
    """`[V]` float32 CPU log-probabilities of the first answer token, where the backend
    kept them from its generation (scorers read them; never written to the records)."""


class Backend(Protocol):
    """Runs the model on one item: read the video, build inputs, compress, generate. A
    backend may also have `prefetch(questions)`: the runner hands it the next `AHEAD`
    `(item, prompt)` pairs before their `generate` calls (and `[]` at the end of the run)."""

    def generate(self, item: Item, prompt: Prompt) -> Generation: ...


class Scorer(Protocol):
    """Measures an answered item beyond its reply (e.g. `scoring.FirstTokenScorer`: the
    first answer token's KL to the uncompressed model): the fields it returns go into the
    item's record, and `scoring.summarize` aggregates the ones it knows."""

    def __call__(
        self, item: Item, prompt: Prompt, backend: Backend, generation: Generation
    ) -> dict[str, Any]: ...


@dataclass
class RunConfig:
    """Everything that defines a run (written into every result file)."""

    benchmark: str
    data_root: str
    model: str
    method: str = "none"
    checkpoint: str | None = None
    protocol: str = "lmms-eval"
    fallback: str | None = None
    fps: float = 2.0
    max_frames: int = 64
    subset: str | None = None
    limit: int | None = None
    method_kwargs: dict[str, Any] = field(default_factory=dict)
    budget: TokenBudget | None = None
    """The run's budget (None: the uncompressed model), parsed once where the user spelled
    it (the CLI's `--ratio` ..., `parse_budget`) and handed to the backend as it is; its
    fields are the run's record (`run_name`, `identity`)."""

    def run_name(self) -> str:
        budget = ""
        if self.method != "none" and self.budget is not None:
            b = self.budget
            budget = f"-r{b.ratio:g}" if b.ratio is not None else f"-t{b.threshold:g}"
            if b.min_tokens is not None:
                budget += f"-m{b.min_tokens}"
        return f"{self.benchmark}/{self.method}{budget}"

    def validate(self) -> None:
        """Raise ValueError naming the option of any value that cannot give a meaningful run."""
        for option, value in (
            ("--limit", self.limit),
            ("--fps", self.fps),
            ("--frames", self.max_frames),
        ):
            if isinstance(value, bool):  # True would read as 1
                raise ValueError(f"{option} must be a number, got {value!r}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit must be a positive number of items, got {self.limit}")
        if not (math.isfinite(self.fps) and self.fps > 0):
            raise ValueError(f"--fps must be a positive number, got {self.fps:g}")
        if self.max_frames < 1:
            raise ValueError(f"--frames must be at least 1, got {self.max_frames}")
        if self.budget is not None and not isinstance(self.budget, TokenBudget):
            raise TypeError(f"budget must be a TokenBudget, got {type(self.budget).__name__}")
        if self.method == "none":
            given = [
                option
                for option, key in zip(_BUDGET_OPTIONS, ("ratio", "threshold", "min_tokens"))
                if self.budget is not None and getattr(self.budget, key) is not None
            ]
            given += ["--checkpoint"] if self.checkpoint is not None else []
            if given or self.method_kwargs:
                what = ", ".join(given) or "--method-arg"
                raise ValueError(f"{what} given with --method none (the uncompressed model)")
            return
        if self.budget is None:  # craft-core states the one-of rule: its error, our names
            TokenBudget.parse(names=_BUDGET_OPTIONS)

    def token_budget(self) -> TokenBudget | None:
        """The run's budget (None for the uncompressed model)."""
        return None if self.method == "none" else self.budget

    def identity(self) -> dict[str, Any]:
        """The fields a resumed run must share with the interrupted one (JSON-normalised;
        the budget as its record fields)."""
        fields = {k: v for k, v in asdict(self).items() if k != "budget"}
        for key in ("ratio", "threshold", "min_tokens"):  # the record of earlier versions
            fields[key] = None if self.budget is None else getattr(self.budget, key)
        return json.loads(json.dumps(fields, default=str, sort_keys=True))  # type: ignore[no-any-return]


def shard_from_env() -> tuple[int, int]:
    """(rank, world_size) from torchrun's environment; (0, 1) without it."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if not 0 <= rank < world:
        raise ValueError(f"RANK={rank} outside WORLD_SIZE={world}")
    return rank, world


def _read_jsonl(path: Path, *, repair: bool = False) -> list[dict[str, Any]]:
    """Complete JSON lines of `path`.

    Only a torn LAST line (no newline: the process was killed mid-write) is ignored, and with
    `repair` (the shard's own writer, holding its lock) cut off so appending can go on. A line
    that does not parse anywhere else raises `CorruptRecords`: nothing after it is dropped.
    """
    if not path.exists():
        return []
    data = path.read_bytes()
    rows: list[dict[str, Any]] = []
    good_end = 0
    for number, line in enumerate(data.split(b"\n")[:-1], start=1):
        good_end += len(line) + 1
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise CorruptRecords(
                f"{path}: line {number} is not valid JSON ({error}); the file was left as it "
                "is: fix or remove that line, or write the run to another --output"
            ) from None
        if not isinstance(row, dict):
            raise CorruptRecords(f"{path}: line {number} is not a JSON object")
        rows.append(row)
    if repair and good_end < len(data):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    return rows


class _Lock:
    """An exclusive, non-blocking lock on a file (POSIX flock; released when the process
    ends, even by SIGKILL). Where flock is missing (Windows) it does nothing."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "a")  # noqa: SIM115 - closed in release()
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            return
        try:
            fcntl.flock(self.file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.file.close()
            raise RunLocked(
                f"{path.parent}: another craft-eval process is writing this run folder; wait "
                "for it to finish or use another --output"
            ) from None

    def release(self) -> None:
        self.file.close()


class _Writer:
    def __init__(self, path: Path) -> None:
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, row: dict[str, Any]) -> None:
        self.file.write(json.dumps(row, sort_keys=True) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()


def run_benchmark(
    config: RunConfig,
    backend: Backend | Callable[[], Backend],
    run_dir: str | Path,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    progress: bool = True,
    merge_timeout_s: float = 24 * 3600.0,
    stop_after: int | None = None,
    items: list[Item] | None = None,
    scorers: Sequence[Scorer] = (),
) -> dict[str, Any] | None:
    """Evaluate `config` with `backend`; return the merged summary (rank 0) or None.

    Args:
        backend: a Backend, or a zero-argument factory (called only if work remains).
        items: `load_items(config)` when the caller already loaded (and so checked) them.
        scorers: each adds its fields to every answered item's record (see `Scorer`).
        rank, world_size: default from the environment (torchrun); simulate ranks in tests.
        stop_after: stop after this many NEW items without writing "done" (tests use it
            to simulate a killed run).
    """
    config.validate()
    bench = get_benchmark(config.benchmark)
    protocol_info = bench.describe_protocol(config.protocol, config.fallback)
    if rank is None or world_size is None:
        rank, world_size = shard_from_env()
    run_dir = Path(run_dir)

    items = load_items(config) if items is None else items
    order = {item.id: i for i, item in enumerate(items)}
    shard = items[rank::world_size]

    run_dir.mkdir(parents=True, exist_ok=True)
    lock = _Lock(run_dir / f".lock.rank{rank}")
    try:
        return _run_locked(
            config, backend, run_dir, bench, protocol_info, items, order, shard, rank,
            world_size, progress, merge_timeout_s, stop_after, scorers,
        )  # fmt: skip
    finally:
        lock.release()


def load_items(config: RunConfig) -> list[Item]:
    """The items of `config` (its subset and limit), checked: unique ids, gold answers among
    the options, and at least one video present (a wrong --data-root is not a 0% run)."""
    bench = get_benchmark(config.benchmark)
    if not Path(config.data_root).is_dir():
        raise FileNotFoundError(f"--data-root {config.data_root}: no such folder")
    try:
        items = bench.load(config.data_root, subset=config.subset)
    except (KeyError, IndexError, TypeError) as error:  # a record without a needed field
        raise ValueError(
            f"{bench.name}: an annotation record under {config.data_root} is malformed "
            f"({type(error).__name__}: {error})"
        ) from None
    if config.limit is not None:
        items = items[: config.limit]
    if not items:
        raise ValueError(f"{bench.name}: no items under --data-root {config.data_root}")
    ids = [item.id for item in items]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"{bench.name}: duplicate item id {dup!r} in the annotations")
    for item in items:
        if item.answer and item.answer not in item.letters:
            raise ValueError(
                f"{bench.name}: item {item.id}: answer {item.answer!r} is not one of its "
                f"{len(item.options)} options ({item.letters}); check the annotation file"
            )
    if not any(Path(item.video).is_file() for item in items):
        raise FileNotFoundError(
            f"{bench.name}: none of the {len(items)} videos exists (first: {items[0].video}); "
            f"check --data-root {config.data_root}"
        )
    return items


def _run_locked(
    config: RunConfig,
    backend: Backend | Callable[[], Backend],
    run_dir: Path,
    bench: Any,
    protocol_info: dict[str, Any],
    items: list[Item],
    order: dict[str, int],
    shard: list[Item],
    rank: int,
    world_size: int,
    progress: bool,
    merge_timeout_s: float,
    stop_after: int | None,
    scorers: Sequence[Scorer],
) -> dict[str, Any] | None:
    shard_path = run_dir / f"records.rank{rank}.jsonl"
    existing = _read_jsonl(shard_path, repair=True)
    header = _header(config, protocol_info, rank, world_size)
    writer = _Writer(shard_path)
    try:
        if existing:
            _check_same_run(shard_path, existing[0], header)
        else:
            writer.write(header)
        done_ids = {r["id"] for r in existing if r.get("type") == "item"}
        finished = any(r.get("type") == "done" for r in existing)
        todo = [item for item in shard if item.id not in done_ids]

        if todo and not finished:
            model = cast(Backend, backend if hasattr(backend, "generate") else backend())  # type: ignore[operator]
            bar = _progress(len(shard), len(shard) - len(todo), config, rank, progress)
            prefetch = getattr(model, "prefetch", None)  # HFBackend: videos compressed ahead
            try:
                for count, item in enumerate(todo):
                    if stop_after is not None and count >= stop_after:
                        bar.close()
                        return None
                    if prefetch is not None and count % AHEAD == 0:
                        chunk = todo[count : count + AHEAD]
                        prefetch([(i, bench.prompt(i, config.protocol)) for i in chunk])
                    writer.write(_evaluate(item, order[item.id], bench, config, model, scorers))
                    bar.update(1)
            finally:
                if prefetch is not None:
                    prefetch([])  # nothing computed ahead outlives the run
            bar.close()
        if not finished:
            writer.write({"type": "done", "n": len(shard)})
    finally:
        writer.close()

    if rank != 0:
        return None
    wait_for_shards(run_dir, world_size, timeout_s=merge_timeout_s)
    return merge_run(run_dir)


def _header(
    config: RunConfig, protocol_info: dict[str, Any], rank: int, world_size: int
) -> dict[str, Any]:
    """The first line of a shard: what a resumed run must match."""
    return {
        "type": "header",
        "config": config.identity(),
        "protocol": protocol_info,
        "rank": rank,
        "world_size": world_size,
        "frames": f"fps={config.fps:g}, at most {config.max_frames} (uniform over the clip "
        "when the cap binds)",
    }


def _check_same_run(shard_path: Path, old: dict[str, Any], header: dict[str, Any]) -> None:
    """A shard is resumed only by the run that wrote it (same config and world size)."""
    if (
        old.get("type") != "header"
        or old.get("config") != header["config"]
        or old.get("world_size") != header["world_size"]
    ):
        raise ValueError(
            f"{shard_path} holds a different run (config or world size differ); "
            "use another output directory"
        )


def _progress(total: int, initial: int, config: RunConfig, rank: int, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc=f"{config.run_name()} [rank {rank}]",
        disable=not enabled,
        unit="q",
        dynamic_ncols=True,
    )


def _evaluate(
    item: Item,
    index: int,
    bench: Any,
    config: RunConfig,
    model: Backend,
    scorers: Sequence[Scorer] = (),
) -> dict[str, Any]:
    prompt = bench.prompt(item, config.protocol)
    row: dict[str, Any] = {
        "type": "item",
        "index": index,
        "id": item.id,
        "video": item.video,
        "segment": list(item.segment) if item.segment else None,
        "categories": item.categories,
        "gold": item.answer,
    }
    start = time.perf_counter()
    try:
        gen = model.generate(item, prompt)
    except VideoDecodeError as error:
        row.update(
            status="error",
            error=f"{type(error).__name__}: {error}",
            prediction="",
            correct=False if item.answer else None,
        )
        return row
    prediction = bench.parse(gen.reply, item, config.protocol, config.fallback)
    row.update(
        status="ok",
        reply=gen.reply,
        prediction=prediction,
        correct=bench.is_correct(prediction, item),
        tokens_before=gen.tokens_before,
        tokens_after=gen.tokens_after,
        ratio=(gen.tokens_before / gen.tokens_after)
        if gen.tokens_before and gen.tokens_after
        else None,
        num_frames=gen.num_frames,
        frames_capped=gen.frames_capped,
        compress_ms=gen.compress_ms,
        prefill_ms=gen.prefill_ms,
        item_s=round(time.perf_counter() - start, 4),
        **({"extra": gen.extra} if gen.extra else {}),
    )
    for scorer in scorers:
        row.update(scorer(item, prompt, model, gen))
    return row


def wait_for_shards(
    run_dir: Path, world_size: int, *, timeout_s: float, poll_s: float = 2.0
) -> None:
    """Block until every rank's shard ends with its "done" line."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [
            r
            for r in range(world_size)
            if not any(
                row.get("type") == "done"
                for row in _read_jsonl(Path(run_dir) / f"records.rank{r}.jsonl")[-1:]
            )
        ]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{run_dir}: ranks {missing} did not finish in {timeout_s:.0f} s")
        time.sleep(poll_s)


def merge_run(run_dir: str | Path) -> dict[str, Any]:
    """Merge every rank's shard into records.jsonl + summary.json; return the summary."""
    run_dir = Path(run_dir)
    shards = sorted(run_dir.glob("records.rank*.jsonl"))
    if not shards:
        raise FileNotFoundError(f"{run_dir}: no records.rank*.jsonl")
    header: dict[str, Any] | None = None
    rows: dict[str, dict[str, Any]] = {}
    for path in shards:
        lines = _read_jsonl(path)
        if not lines or lines[0].get("type") != "header":
            raise ValueError(f"{path}: missing header line")
        if header is None:
            header = lines[0]
        elif lines[0]["config"] != header["config"]:
            raise ValueError(f"{path}: shards of different runs in {run_dir}")
        for row in lines:
            if row.get("type") == "item":
                rows[row["id"]] = row
    assert header is not None
    world = int(header.get("world_size", 1))
    if len(shards) != world:
        raise ValueError(f"{run_dir}: {len(shards)} shard file(s) for world size {world}")
    records = sorted(rows.values(), key=lambda r: r["index"])
    bench = get_benchmark(header["config"]["benchmark"])
    merged_header = {k: v for k, v in header.items() if k != "rank"}
    merged = "".join(json.dumps(row, sort_keys=True) + "\n" for row in [merged_header, *records])
    _write_whole(run_dir / "records.jsonl", merged)
    summary = {
        "config": header["config"],
        "protocol": header["protocol"],
        "frames": header.get("frames"),
        "world_size": world,
        "scores": summarize(records, bench),
    }
    if bench.name == "egoschema" and any(not r.get("gold") for r in records):
        from craft_eval.tasks import write_submission

        summary["submission"] = str(
            write_submission(records, run_dir / "egoschema_submission.json")
        )
    _write_whole(run_dir / "summary.json", json.dumps(summary, indent=1, sort_keys=True))
    return summary


def run_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """The item records of a merged run (`records.jsonl`), in benchmark order: what the
    scorers measured per item, for paired comparisons of two runs."""
    return [r for r in _read_jsonl(Path(run_dir) / "records.jsonl") if r.get("type") == "item"]


def _write_whole(path: Path, text: str) -> None:
    """`text` into `path` via `path.tmp`, renamed once complete: a full disk (or a kill)
    leaves the previous file or none, never half of one, and no `.tmp` behind."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
