"""Every registered method compresses identically through the three ways of running it.

On one tiny Qwen2.5-VL and the same two clips (4 frames of 56 x 56, read whole by every
path), at ratio 4:

  1. `craft-eval run` (the CLI entry, `HFBackend`): the kept-token digests in records.jsonl,
  2. the real lmms-eval entry (`lmms_eval.cli.dispatch:main`, what the `lmms-eval` console
     script runs; in this process so lmms-eval is imported once): the digests in the
     sample logs' `token_counts`,
  3. `craft_adapters.wrap(model, build_compressor(name), ...)` called directly.

A digest is sha256 of the kept indices and the output rows (`methods.build.result_digest`):
equal digests mean the same tokens kept with the same features. lmms-eval loads Qwen2.5-VL in
bfloat16 (hard-coded in its class) and `craft-eval run` in float32 on a CPU, so path 2 is
compared with path 3 run in bfloat16 and path 1 with path 3 in float32 (the processor
outputs are identical: same frames, same pixels).

Methods that rank by attention must get the vision tower's: every path records
`importance == "attention"`, the tensor handed over is the one craft-adapters computes from
the last ViT layer, and the same method on the L2-norm proxy keeps different tokens (so a
path that lost the attention would fail here, as lmms-eval's did before 0.3.0).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from craft_eval.methods import get_method, list_methods

pytestmark = pytest.mark.slow

METHODS = [m.name for m in list_methods()]
RATIO = 4
LMMS_ARGS = "device=cpu,device_map=cpu,max_num_frames=4,min_pixels=3136,max_pixels=3136"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Two clips in Video-MME's layout, a tiny Qwen2.5-VL saved with its processor, an
    lmms-eval task over the same clips, an offline HF environment."""
    import lmms_eval  # noqa: F401  (declared in the test group: a missing one fails)
    from test_lmms_plugin import offline_env, write_task

    from craft_adapters.tiny import build_tiny_vlm
    from craft_eval.fixtures import write_fixture

    root = tmp_path_factory.mktemp("cross")
    data = write_fixture("videomme", root / "data", num_items=2, num_frames=4, size=(56, 56))
    videos = sorted((data / "data").glob("*.mp4"))
    model, _ = build_tiny_vlm("qwen2_5_vl", root / "model")
    _write_checkpoint(root / "ckpt", model.config.get_text_config().hidden_size)
    rows = [
        {"id": i, "video": str(v), "question": "q?", "answer": "A"} for i, v in enumerate(videos)
    ]
    task = write_task(root, rows)
    with offline_env(root):
        yield {
            "root": root,
            "data": data,
            "videos": videos,
            "model": root / "model",
            "task": task,
            "ckpt": root / "ckpt",
        }


def _write_checkpoint(folder: Path, hidden_size: int) -> None:
    """A merge module with a gate that is not the untrained constant 0.5 (a fresh module's
    random projections differ per process, so every path loads this one)."""
    from craft_core import CraftCompressor, CraftConfig

    torch.manual_seed(0)
    module = CraftCompressor(CraftConfig(hidden_size=hidden_size))
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    module.save_pretrained(folder)


def _options(name: str, world: dict[str, Any]) -> dict[str, Any]:
    from craft_eval.methods import get_method_info

    info = get_method_info(name)
    out = {"checkpoint": str(world["ckpt"])} if "checkpoint" in info.needs else {}
    if "layer" in (info.options or ()):  # a stage inside the LM: the tiny model has 2 layers
        out["layer"] = 1
    return out


@pytest.fixture(scope="module")
def models(world: dict[str, Any]) -> dict[str, Any]:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    path = str(world["model"])
    fp32 = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    bf16 = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.bfloat16).eval()
    return {"float32": fp32, "bfloat16": bf16, "processor": AutoProcessor.from_pretrained(path)}


class _Spy:
    """Records the `importance` each call is handed (the method itself runs unchanged)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seen: list[tuple[torch.Tensor, torch.Tensor, Any]] = []

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __call__(
        self, features: torch.Tensor, coords: torch.Tensor, budget: Any = None, **kwargs: Any
    ) -> Any:
        self.seen.append((features, coords, kwargs.get("importance")))
        return self.inner(features, coords, budget, **kwargs)

    def compress_many(
        self, features: list[Any], coords: list[Any], budget: Any, *, importance: Any = None
    ) -> Any:
        """The batched entry (`craft_core.compress_many` finds it): each video recorded."""
        from craft_core import compress_many

        given = [None] * len(features) if importance is None else list(importance)
        self.seen.extend(zip(features, coords, given))
        return compress_many(self.inner, features, coords, budget, importance=importance)


def _wrap_path(name: str, world: dict[str, Any], models: dict[str, Any], dtype: str) -> Any:
    """-> (digests per clip, importance sources, spy) through craft_adapters.wrap directly."""
    import craft_adapters
    from craft_core import TokenBudget
    from craft_eval.methods.build import build_compressor

    model, processor = models[dtype], models["processor"]
    timed = build_compressor(
        name, _options(name, world), hidden_size=model.config.get_text_config().hidden_size
    )
    assert timed is not None
    spy = _Spy(timed)
    wrapped = craft_adapters.wrap(model, spy, budget=TokenBudget(ratio=RATIO))
    for video in world["videos"]:
        clip = craft_adapters.read_video(str(video), fps=8, max_frames=4)
        inputs = craft_adapters.build_inputs(processor, clip.frames, float(clip.fps), "q?")
        assert int(inputs["video_grid_thw"][0, 0]) == 2  # all 4 frames (2 temporal patches)
        with torch.no_grad():
            wrapped(**inputs)
    return [c.digest for c in timed.calls], [c.importance for c in timed.calls], spy


def _cli_path(name: str, world: dict[str, Any], tag: str = "") -> tuple[list[str], list[Any]]:
    from craft_eval import cli

    out = world["root"] / f"runs-{name}{tag}"
    argv = ["run", "--model", str(world["model"]), "-b", "videomme"]
    argv += ["--data-root", str(world["data"]), "-o", str(out), "--method", name]
    argv += ["--ratio", str(RATIO), "--fps", "8", "--frames", "4"]
    for key, value in _options(name, world).items():
        argv += [f"--{key}", value] if key == "checkpoint" else ["--method-arg", f"{key}={value}"]
    assert cli.main([*argv, "--no-progress"]) == 0
    (records,) = list(out.rglob("records.jsonl"))
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    rows = [r for r in rows if "extra" in r]
    assert len(rows) == 2, rows
    digests = [d for r in rows for d in r["extra"]["kept_digests"]]
    return digests, [s for r in rows for s in r["extra"].get("importance", [None])]


_INDEX: dict[str, Any] = {}


def _lmms_path(
    name: str, world: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tag: str = ""
) -> tuple[list[str], list[Any]]:
    from lmms_eval.cli.dispatch import main
    from lmms_eval.tasks import TaskManager

    real = TaskManager._get_task_and_group  # index lmms-eval's own task folders once

    def indexed(self: Any, task_dir: str) -> Any:
        if task_dir not in _INDEX:
            _INDEX[task_dir] = real(self, task_dir)
        return dict(_INDEX[task_dir])

    monkeypatch.setattr(TaskManager, "_get_task_and_group", indexed)
    out = world["root"] / f"lmms-{name}{tag}"
    args = f"pretrained={world['model']},{LMMS_ARGS},method={name},ratio={RATIO}"
    args += "".join(f",{k}={v}" for k, v in _options(name, world).items())
    argv = ["--model", "craft_qwen2_5_vl", "--model_args", args, "--tasks", "tiny_video"]
    argv += ["--include_path", str(world["task"]), "--output_path", str(out), "--log_samples"]
    monkeypatch.setattr(sys, "argv", ["lmms-eval", *argv])
    main()
    (samples,) = list(out.rglob("*_samples_tiny_video.jsonl"))
    lines = sorted(
        (json.loads(line) for line in samples.read_text().splitlines() if line.strip()),
        key=lambda s: s["doc_id"],
    )
    counts = [s["token_counts"][0] for s in lines]
    assert len(counts) == 2
    return [d for c in counts for d in c["kept_digests"]], [
        s for c in counts for s in c.get("importance", [None])
    ]


@pytest.mark.parametrize("name", METHODS)
def test_same_tokens_through_every_path(
    name: str, world: dict[str, Any], models: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    wrap32, sources32, spy = _wrap_path(name, world, models, "float32")
    wrap16, sources16, _ = _wrap_path(name, world, models, "bfloat16")
    cli, cli_sources = _cli_path(name, world)
    lmms, lmms_sources = _lmms_path(name, world, monkeypatch)
    assert len(wrap32) == len(wrap16) == 2
    assert cli == wrap32, f"{name}: craft-eval run kept other tokens than wrap (float32)"
    assert lmms == wrap16, f"{name}: lmms-eval kept other tokens than wrap (bfloat16)"

    wants = bool(getattr(get_method(name), "needs_attention", False))
    expected = ["attention"] * 2 if wants else [s for s in sources32]
    for sources in (sources32, sources16, cli_sources, lmms_sources):
        assert [s for s in sources if s is not None] == [s for s in expected if s is not None]
    if wants:
        _check_attention_came_from_the_tower(name, world, models, spy)
    else:
        assert all(importance is None for _, _, importance in spy.seen)


def _check_attention_came_from_the_tower(
    name: str, world: dict[str, Any], models: dict[str, Any], spy: _Spy
) -> None:
    """The importance handed to the method is the last ViT layer's received attention, and it
    changes the result (the L2 proxy keeps other tokens)."""
    import craft_adapters
    from craft_adapters.attention import encode_videos_with_attention
    from craft_eval.methods.build import result_digest

    model, processor = models["float32"], models["processor"]
    adapter = craft_adapters.wrap(model, None).adapter
    differs = 0
    for video, (features, coords, importance) in zip(world["videos"], spy.seen):
        clip = craft_adapters.read_video(str(video), fps=8, max_frames=4)
        inputs = dict(craft_adapters.build_inputs(processor, clip.frames, float(clip.fps), "q"))
        with torch.no_grad():
            _, _, attention = encode_videos_with_attention(adapter, inputs, spy)
        assert importance is not None and attention[0] is not None
        torch.testing.assert_close(importance, attention[0], rtol=0, atol=0)
        bare = get_method(name)
        with_attention = bare(features, coords, ratio=RATIO, importance=importance)
        proxy = bare(features, coords, ratio=RATIO)
        assert proxy.info["importance"] == "l2_norm"
        differs += result_digest(with_attention) != result_digest(proxy)
    assert differs >= 1, f"{name}: attention and the L2 proxy keep the same tokens here"


def _count_budget_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A one-element list counting `TokenBudget` validations (its checking `__post_init__`,
    which `TokenBudget(...)` and `TokenBudget.parse` both run) from now on."""
    from craft_core import TokenBudget

    count = [0]
    check = TokenBudget.__post_init__

    def counted(budget: Any) -> None:
        count[0] += 1
        check(budget)

    monkeypatch.setattr(TokenBudget, "__post_init__", counted)
    return count


@pytest.mark.parametrize("entry", ["craft-eval run", "lmms-eval model_args", "wrap(ratio=)"])
@pytest.mark.parametrize("name", ["craft", "visionzip"])
def test_each_entry_path_checks_the_budget_once(
    entry: str,
    name: str,
    world: dict[str, Any],
    models: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The user's `--ratio 4` / `ratio=4` / `wrap(ratio=4)` becomes ONE TokenBudget, passed
    down unopened to the compressor of each of the two videos (CRAFT's module and a baseline
    that takes the tower's attention)."""
    import craft_adapters
    from craft_eval.methods.build import build_compressor

    count = _count_budget_checks(monkeypatch)
    if entry == "craft-eval run":
        digests, _ = _cli_path(name, world, tag="-once")
    elif entry == "lmms-eval model_args":
        digests, _ = _lmms_path(name, world, monkeypatch, tag="-once")
    else:
        model, processor = models["float32"], models["processor"]
        timed = build_compressor(name, _options(name, world))
        wrapped = craft_adapters.wrap(model, timed, ratio=RATIO)
        for video in world["videos"]:
            clip = craft_adapters.read_video(str(video), fps=8, max_frames=4)
            inputs = craft_adapters.build_inputs(processor, clip.frames, float(clip.fps), "q?")
            with torch.no_grad():
                wrapped(**inputs)
        assert timed is not None
        digests = [call.digest for call in timed.calls]
    assert len(digests) == 2  # both videos were compressed
    assert count[0] == 1, f"{entry}: the budget was checked {count[0]} times"


def test_timed_compressor_declares_what_the_method_declares() -> None:
    """The bug lmms-eval's copy had: the timing wrapper hid `needs_attention`."""
    from craft_adapters.attention import wants_attention
    from craft_core import TokenCompressor
    from craft_eval.methods.build import TimedCompressor

    for name in METHODS:
        bare = get_method(name)
        timed = TimedCompressor(bare)
        assert wants_attention(timed) is wants_attention(bare), name
        # craft-adapters asks the protocol: both are craft-core TokenCompressors
        assert isinstance(bare, TokenCompressor) and isinstance(timed, TokenCompressor), name
    assert wants_attention(TimedCompressor(get_method("visionzip")))
    assert wants_attention(TimedCompressor(get_method("fastvid")))


def test_run_reads_the_annotations_once(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`craft-eval run` checks the items before loading the model and evaluates those same
    items: the benchmark's annotations are read once per run, not once per check."""
    from craft_eval import cli
    from craft_eval.tasks import get_benchmark

    bench_cls = type(get_benchmark("videomme"))
    real = bench_cls.load
    reads: list[str] = []

    def counted(self: Any, root: Any, *, subset: str | None = None) -> Any:
        reads.append(str(root))
        return real(self, root, subset=subset)

    monkeypatch.setattr(bench_cls, "load", counted)
    out = world["root"] / "runs-once"
    argv = ["run", "--model", str(world["model"]), "-b", "videomme", "--data-root"]
    argv += [str(world["data"]), "-o", str(out), "--fps", "8", "--frames", "4", "--no-progress"]
    assert cli.main(argv) == 0
    assert len(reads) == 1, reads  # was 2: the check and the run each read them
    assert len(list(out.rglob("records.jsonl"))) == 1
