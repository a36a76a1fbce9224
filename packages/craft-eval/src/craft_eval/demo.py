"""`craft-eval demo`: the whole pipeline on a laptop CPU in about a minute, nothing downloaded.

1. writes a tiny benchmark in MVBench's distributed format (json/<task>.json + synthetic
   clips of a coloured square moving over a gradient, written with PyAV),
2. builds a tiny randomly initialised VLM of a supported backbone (craft_adapters.tiny),
   or loads `--model PATH`,
3. runs every item through reader -> processor -> adapter -> compressor -> generate ->
   parser -> scorer for the uncompressed model and every registered method at 8x,
4. prints tokens, realized ratio, prefill ms, KV-cache MB, FLOPs reduction and accuracy, and
   writes the report (Markdown table, accuracy-vs-compression plot, merge maps).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

DEMO_TASKS = "moving_direction,object_existence"
DEMO_FRAMES = 16  # frames the reader keeps (8 s clip at fps=2)


def _line(text: str) -> None:
    print(text, flush=True)


def run_demo(
    *,
    model_path: str | None = None,
    backbone: str = "qwen2_5_vl",
    ratio: float = 8.0,
    methods: list[str] | None = None,
    output: str | Path = "craft-demo",
    device: str | None = None,
    num_items: int = 2,
) -> int:
    """Run the demo; returns a process exit code (0 ok, 1 when a required piece is missing)."""
    import torch

    from craft_eval.backend import HFBackend, adapters_status, load_pretrained
    from craft_eval.efficiency import prefill_flops
    from craft_eval.fixtures import write_fixture
    from craft_eval.methods import list_methods
    from craft_eval.report import write_report
    from craft_eval.runner import RunConfig, run_benchmark
    from craft_eval.tasks import get_benchmark

    start = time.perf_counter()
    out = Path(output)
    ok, missing = adapters_status()
    if not ok:
        _line(f"craft-eval demo cannot run the model pipeline: {missing}.")
        _line("Nothing was faked; install/finish craft-adapters and run it again.")
        return 1

    runs = out / "runs"
    if runs.exists():  # a demo starts fresh (a real run would resume instead)
        shutil.rmtree(runs)
    data = write_fixture(
        "mvbench", out / "data" / "mvbench", num_items=num_items, num_frames=4 * DEMO_FRAMES
    )
    n_items = 2 * num_items
    _line(f"[1/4] wrote {n_items} questions in MVBench's format + synthetic clips -> {data}")

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if model_path:
        model, processor = load_pretrained(model_path, dev)
        tag = Path(model_path).name
        _line(f"[2/4] loaded {model_path} ({model.config.model_type}) on {dev}")
    else:
        from craft_adapters.tiny import build_tiny_vlm

        model, processor = build_tiny_vlm(backbone, out / "tiny-model")
        model = model.to(dev).eval()
        tag = f"tiny-{backbone}"
        _line(f"[2/4] built a tiny RANDOM {backbone} VLM (saved and reloaded) on {dev}")

    names = methods or [m.name for m in list_methods()]
    jobs: list[tuple[str, float | None]] = [("none", None)] + [(m, ratio) for m in names]
    _line(f"[3/4] evaluating {len(jobs)} configurations x {n_items} questions at {ratio:g}x")
    from tqdm.auto import tqdm

    mvbench = get_benchmark("mvbench")
    first = mvbench.load(data, subset=DEMO_TASKS)[0]  # the question the efficiency is measured on

    rows: list[dict[str, Any]] = []
    bar = tqdm(total=len(jobs) * n_items, unit="q", desc="demo", dynamic_ncols=True)
    for method, r in jobs:
        config = RunConfig(
            benchmark="mvbench",
            data_root=str(data),
            model=tag,
            method=method,
            ratio=r,
            subset=DEMO_TASKS,
            max_frames=DEMO_FRAMES,
        )
        run_dir = runs / tag / config.run_name()
        try:
            backend = HFBackend(
                model,
                processor,
                method=method,
                ratio=r,
                max_frames=DEMO_FRAMES,
                merge_map_dir=run_dir,
                merge_maps=1,
            )
            summary = run_benchmark(config, backend, run_dir, progress=False)
            assert summary is not None
            prof = backend.profile(first, mvbench.prompt(first), repeats=5)
        except Exception as error:  # one method failing must not hide the others' results
            rows.append({"method": method, "error": f"{type(error).__name__}: {error}"})
            bar.update(n_items)
            continue
        bar.update(n_items)
        rows.append({"method": method, "scores": summary["scores"], **prof})
    bar.close()

    text_config = model.config.get_text_config().to_dict()
    base_len = next(
        (x["prefill_len"] for x in rows if x["method"] == "none" and "scores" in x), None
    )
    _line(
        f"\n[4/4] results ({n_items} questions; efficiency on the first one, {rows[0].get('timing', '')})\n"
    )
    header = (
        f"{'method':<16} {'video tokens':>13} {'ratio':>6} {'prefill ms':>10} "
        f"{'compress ms':>11} {'KV MB':>7} {'FLOPs red.':>10} {'accuracy':>8}"
    )
    _line(header)
    _line("-" * len(header))
    for row in rows:
        method = row["method"]
        if "error" in row:
            _line(f"{method:<16} failed: {row['error']}")
            continue
        s = row["scores"]
        seq = row["prefill_len"]
        flops = (
            1 - prefill_flops(text_config, int(seq)) / prefill_flops(text_config, int(base_len))
            if seq and base_len
            else None
        )
        tokens = f"{_f(s['tokens_before_mean'], 0)} -> {_f(s['tokens_after_mean'], 0)}"
        _line(
            f"{method:<16} {tokens:>13} {_f(s['comp_ratio'], 1, 'x'):>6} "
            f"{_f(row['prefill_ms'], 1):>10} {_f(row['compress_ms'], 1):>11} "
            f"{_f(row['kv_mb'], 3):>7} {_f(None if flops is None else 100 * flops, 1, '%'):>10} "
            f"{_f(s['accuracy'], 1):>8}"
        )
    report = write_report(runs, out / "report")
    _line(
        "\nAccuracy here is MEANINGLESS: the model has random weights, its replies are random "
        "tokens (see the records) that rarely parse as an option letter."
        if not model_path
        else "\nAccuracy is over only the demo's synthetic questions."
    )
    if not model_path:
        _line(
            "CRAFT runs a fresh, untrained module (G = 0.5); pass a checkpoint to "
            "`craft-eval run --method craft --checkpoint DIR` for trained weights."
        )
    _line("FLOPs reduction: analytical, language-model prefill, formula in the README.")
    _line(f"report:   {report['markdown']}")
    _line(f"plot:     {report['plot']}")
    for path in report["merge_maps"][:3]:
        _line(f"merge map: {path}")
    if len(report["merge_maps"]) > 3:
        _line(f"(+{len(report['merge_maps']) - 3} more merge maps in {out / 'report'})")
    _line(f"records:  {runs}  (JSONL per run; resumable)")
    _line(f"done in {time.perf_counter() - start:.0f} s")
    return 0


def _f(value: float | None, digits: int, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"
