"""The lmms-eval plugin end to end: `lmms-eval --model craft_<backbone> ...` on tiny random
models saved with their processors, over a tiny local task (`--include_path` YAML over a
JSONL file and synthetic videos), uncompressed and compressed, for every backbone.

One run is the real `lmms-eval` command in a subprocess (entry points discovered in a fresh
interpreter, batch size 2); the other runs call the same entry function
(`lmms_eval.cli.dispatch:main`, what the console script runs) in this process, so lmms-eval
is imported once. Checked: the summary (`results.json` -> `throughput`) and every sample log
line hold the compression fields; tokens before match the processor's own count; the budget
is exact.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from craft_eval.lmms.compress import parse_budget
from craft_eval.methods.build import build_compressor

FIELDS = ("visual_tokens_before", "visual_tokens_after", "realized_ratio", "compression_ms")
# (plugin id, model type, model_args giving small frames, frames reaching the model)
BACKBONES = [
    ("craft_qwen2_5_vl", "qwen2_5_vl", "max_num_frames=4,min_pixels=3136,max_pixels=6272"),
    ("craft_qwen3_vl", "qwen3_vl", "max_num_frames=4,min_pixels=4096,max_pixels=4096"),
    (
        "craft_qwen3_5",
        "qwen3_5",
        "max_num_frames=4,min_pixels=4096,max_pixels=4096,total_pixels=16384",
    ),
    ("craft_llava_onevision", "llava_onevision", "max_frames_num=4"),
    ("craft_internvl", "internvl", "num_frames=4"),  # chat class only, batch size 1
]
TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {docs}
  cache_dir: {cache}
test_split: test
output_type: generate_until
doc_to_visual: !function utils.doc_to_visual
doc_to_text: !function utils.doc_to_text
doc_to_target: answer
generation_kwargs:
  max_new_tokens: {tokens}
  temperature: 0
  do_sample: false{until}
process_results: !function utils.process_results
metric_list:
  - metric: exact
    aggregation: mean
    higher_is_better: true
"""
OPTION_PROMPT = "\nAnswer with the option's letter from the given choices directly."
TASK_UTILS = """
def doc_to_visual(doc):
    return [doc["video"]]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    return doc["question"] + SUFFIX


def process_results(doc, results):
    return {"exact": float(results[0].strip() == doc["answer"])}
"""


@pytest.fixture(scope="module")
def lmms_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny local task over two synthetic videos of different shapes; offline HF env."""
    import lmms_eval  # noqa: F401  (declared in the test group: a missing one fails)

    from craft_eval.fixtures import synthetic_frames, write_video

    root = tmp_path_factory.mktemp("lmms")
    videos = [
        write_video(root / "square.mp4", synthetic_frames(num_frames=8, size=(64, 64)), fps=4),
        write_video(root / "wide.mp4", synthetic_frames(8, size=(64, 128), seed=1), fps=4),
    ]
    rows = [
        {"id": i, "video": str(video), "question": f"What moves {i}?", "answer": "A"}
        for i, video in enumerate([videos[0], videos[1], videos[0]])
    ]
    task = write_task(root, rows)
    with offline_env(root) as env:
        yield {"root": root, "task": task, "videos": videos, "env": env}


def write_task(
    root: Path,
    rows: list[dict[str, Any]],
    name: str = "tiny_video",
    tokens: int = 2,
    until: list[str] | None = None,
    suffix: str = OPTION_PROMPT,
) -> Path:
    """The local lmms-eval task `name` over `rows` (JSONL docs) in `root / "task"` (another
    name: `root / "task_<name>"`): `tokens` new tokens at most, generation stopped at `until`
    (None: lmms-eval's default), each prompt the doc's question + `suffix`."""
    task = root / ("task" if name == "tiny_video" else f"task_{name}")
    task.mkdir()
    docs = task / "docs.jsonl"
    docs.write_text("".join(json.dumps(row) + "\n" for row in rows))
    stop = "" if until is None else f"\n  until: {json.dumps(until)}"
    yaml = TASK_YAML.format(
        name=name, docs=docs, cache=root / "datasets", tokens=tokens, until=stop
    )
    (task / f"{name}.yaml").write_text(yaml)
    (task / "utils.py").write_text(f"SUFFIX = {suffix!r}\n" + TASK_UTILS)
    return task


@contextlib.contextmanager
def offline_env(root: Path) -> Iterator[dict[str, str]]:
    """Hugging Face and W&B offline, their caches under `root`; restored afterwards."""
    env = {
        "HF_HOME": str(root / "hf"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def tiny_models(lmms_env: dict[str, Any]) -> Any:
    """`path(model_type)`: a tiny random VLM saved WITH its processor (built once)."""
    from craft_adapters.tiny import build_tiny_vlm

    built: dict[str, Path] = {}

    def path(model_type: str) -> Path:
        if model_type not in built:
            folder = lmms_env["root"] / model_type
            build_tiny_vlm(model_type, folder)
            assert (folder / "processor_config.json").exists() or any(
                folder.glob("*processor*.json")
            )
            built[model_type] = folder
        return built[model_type]

    return path


def _argv(
    plugin: str,
    model: Path,
    extra: str,
    method: str,
    task: Path,
    out: Path,
    name: str = "tiny_video",
) -> list[str]:
    args = f"pretrained={model},device=cpu,device_map=cpu,{extra},{method}"
    return [
        "--model",
        plugin,
        "--model_args",
        args,
        "--tasks",
        name,
        "--include_path",
        str(task),
        "--output_path",
        str(out),
        "--log_samples",
    ]


def _read(out: Path, name: str = "tiny_video") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The summary and the sample log (by doc_id) of task `name`'s run written under `out`."""
    results = sorted(out.rglob("*_results.json"))
    samples = sorted(out.rglob(f"*_samples_{name}.jsonl"))
    assert results and samples, f"lmms-eval wrote no results under {out}"
    with open(samples[-1]) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    return json.loads(results[-1].read_text()), sorted(lines, key=lambda s: s["doc_id"])


def _check(summary: dict[str, Any], samples: list[dict[str, Any]], ratio: float | None) -> None:
    assert len(samples) == 3
    throughput = summary["throughput"]
    for key in FIELDS:
        assert f"avg_craft_{key}" in throughput, throughput
    for sample in samples:
        counts = sample["token_counts"][0]
        assert set(FIELDS) <= set(counts), counts
        before, after = counts["visual_tokens_before"], counts["visual_tokens_after"]
        assert before > 0
        if ratio is None:
            assert after == before and counts["compression_ms"] == 0.0
        else:
            assert after < before and counts["compression_ms"] > 0.0
            assert counts["realized_ratio"] == pytest.approx(before / after, abs=1e-3)
    befores = [s["token_counts"][0]["visual_tokens_before"] for s in samples]
    assert befores[0] == befores[2]  # same video
    mean_before = sum(befores) / 3
    assert throughput["avg_craft_visual_tokens_before"] == pytest.approx(mean_before)


_INDEX: dict[str, Any] = {}


def _decode_with_pyav(monkeypatch: pytest.MonkeyPatch) -> None:
    """lmms-eval's `internvl_hf` hands the processor video PATHS, which transformers 5
    decodes with torchcodec only (it needs a system FFmpeg this machine lacks): without it,
    decode them with transformers' own `load_video` on its PyAV backend instead."""
    from transformers import video_processing_utils as vpu
    from transformers.utils.import_utils import is_torchcodec_usable

    if is_torchcodec_usable(decode="video"):
        return

    def fetch_videos(self: Any, url: Any, sample_indices_fn: Any = None) -> Any:
        if isinstance(url, list):
            return list(zip(*[fetch_videos(self, u, sample_indices_fn) for u in url]))
        return vpu.load_video(url, backend="pyav", sample_indices_fn=sample_indices_fn)

    monkeypatch.setattr(vpu.BaseVideoProcessor, "fetch_videos", fetch_videos)


@pytest.mark.slow
@pytest.mark.parametrize("plugin,model_type,extra", BACKBONES, ids=[b[1] for b in BACKBONES])
def test_lmms_eval_runs_every_backbone(
    plugin: str,
    model_type: str,
    extra: str,
    lmms_env: dict[str, Any],
    tiny_models: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Uncompressed then compressed through lmms-eval's CLI entry function (in process)."""
    from lmms_eval.cli.dispatch import main
    from lmms_eval.tasks import TaskManager

    real = TaskManager._get_task_and_group  # index lmms-eval's own 300+ task folders once

    def indexed(self: Any, task_dir: str) -> Any:
        if task_dir not in _INDEX:
            _INDEX[task_dir] = real(self, task_dir)
        return dict(_INDEX[task_dir])

    monkeypatch.setattr(TaskManager, "_get_task_and_group", indexed)
    if model_type == "internvl":
        _decode_with_pyav(monkeypatch)
    model = tiny_models(model_type)
    for method, ratio in (("method=none", None), ("method=tome,ratio=4", 4.0)):
        out = lmms_env["root"] / f"out-{model_type}-{ratio}"
        argv = _argv(plugin, model, extra, method, lmms_env["task"], out)
        monkeypatch.setattr(sys, "argv", ["lmms-eval", *argv])
        main()
        summary, samples = _read(out)
        _check(summary, samples, ratio)
        assert summary["config"]["model"] == plugin
        if ratio is not None:
            for sample in samples:
                counts = sample["token_counts"][0]
                before = counts["visual_tokens_before"]
                newline = 1 if model_type == "llava_onevision" else 0  # always kept
                assert counts["visual_tokens_after"] == max(1, (before - newline) // 4) + newline


@pytest.mark.slow
def test_lmms_eval_command_batch_of_two(lmms_env: dict[str, Any], tiny_models: Any) -> None:
    """The real `lmms-eval` command, CRAFT (untrained module) at ratio 4, batch size 2: the
    per-sample fields belong to the right documents (two video shapes, counted independently
    with qwen-vl-utils' resize rule)."""
    from qwen_vl_utils.vision_process import smart_resize

    plugin, model_type, extra = BACKBONES[0]
    out = lmms_env["root"] / "out-command"
    argv = _argv(
        plugin,
        tiny_models(model_type),
        extra,
        "method=craft,allow_untrained=true,ratio=4",
        lmms_env["task"],
        out,
    )
    script = Path(sys.executable).with_name("lmms-eval")
    env = {**os.environ, **lmms_env["env"]}
    proc = subprocess.run(
        [str(script), *argv, "--batch_size", "2"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary, samples = _read(out)
    _check(summary, samples, 4.0)
    # 4 frames -> 2 temporal groups; 2x2 patches of 14 px merge into one token
    expected = []
    for height, width in ((64, 64), (64, 128), (64, 64)):
        h, w = smart_resize(height, width, factor=28, min_pixels=3136, max_pixels=6272)
        expected.append(2 * (h // 28) * (w // 28))
    assert expected[0] != expected[1]
    got = [s["token_counts"][0]["visual_tokens_before"] for s in samples]
    assert got == expected
    assert [s["token_counts"][0]["visual_tokens_after"] for s in samples] == [
        max(1, n // 4) for n in expected
    ]


@pytest.mark.parametrize(
    "args,match",
    [
        (("craft", None, None, None), "exactly one budget"),
        (("craft", 8, 0.9, None), "exactly one budget"),
        (("craft", "eight", None, None), "model_args ratio='eight'"),
        (("none", 8, None, None), "need a method"),
        (("craft", 0.5, None, None), "model_args ratio must be a finite number >= 1"),
        (("craft", None, "-1", None), r"model_args threshold must lie in \(-1, 1\]"),
        (("craft", 4, None, "3"), "model_args min_tokens applies to the threshold mode only"),
    ],
)
def test_bad_model_args_name_the_argument(args: tuple[Any, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_budget(*args)


def test_budget_and_method_parsing() -> None:
    from craft_core import TokenBudget
    from craft_eval.methods.build import MODEL_ARGS

    assert parse_budget("none", None, None, None) is None
    assert parse_budget("tome", 8, None, None) == TokenBudget(ratio=8.0)
    assert parse_budget("craft", None, "0.9", "4") == TokenBudget(threshold=0.9, min_tokens=4)
    with pytest.raises(ValueError, match="model_args method=nope is unknown"):
        build_compressor("nope", spelling=MODEL_ARGS)
    with pytest.raises(ValueError, match="model_args checkpoint= needs a method"):
        build_compressor("none", {"checkpoint": "/ckpt"}, spelling=MODEL_ARGS)
    with pytest.raises(ValueError, match="model_args method=craft needs model_args checkpoint="):
        build_compressor("craft", spelling=MODEL_ARGS)
    with pytest.raises(ValueError, match="model_args checkpoint= is not used by tome"):
        build_compressor("tome", {"checkpoint": "/ckpt"}, spelling=MODEL_ARGS)


def test_plugin_classes_are_generated_from_the_registry() -> None:
    """One plugin model per backbone whose adapter names lmms-eval classes; every manifest
    class exists and extends lmms-eval's class with the mixin (chat classes not simple)."""
    import craft_eval.lmms.models as models
    from craft_adapters.registry import adapter_classes
    from craft_eval.lmms.compress import CraftLMMixin
    from craft_eval.lmms.plugin import ROUTED, manifests

    found = {m.model_id: m for m in manifests()}
    generated = {f"craft_{c.model_types[0]}" for c in adapter_classes() if c.lmms_classes}
    assert set(found) == generated | set(ROUTED)  # ROUTED: written with a video route
    assert {plugin for plugin, _, _ in BACKBONES} <= set(found)
    for manifest in found.values():
        for path, chat in ((manifest.simple_class_path, False), (manifest.chat_class_path, True)):
            if path is None:
                continue
            cls = getattr(models, path.rpartition(".")[2])
            assert cls.__module__ + "." + cls.__name__ == path
            assert issubclass(cls, CraftLMMixin) and cls.__mro__[2].__module__.startswith(
                "lmms_eval.models." + ("chat" if chat else "simple")
            )
            assert cls.is_simple is (not chat)
