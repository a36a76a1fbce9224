"""`craft-eval demo`: the paper in miniature on a laptop CPU, nothing downloaded.

1. writes held-out clips of the miniature world (`craft_world.make_clips`, split "test") in
   MVBench's format: object_existence ("Is there a red square?", squares that may be
   visible in only 2 of 8 frames) and moving_count ("How many squares are there?"),
2. loads the world's trained ~1M-parameter Qwen2.5-VL (`craft_world.load_backbone()`;
   uncompressed it answers > 95% of held-out questions) and the merge module trained on
   it by `craft-train distill` (`craft_world.craft_path()`),
3. runs every question through reader -> processor -> adapter -> compressor -> generate ->
   parser -> scorer: uncompressed, every registered method at 4x, 8x and 16x, and the
   trained CRAFT module ("craft-trained") at the same ratios,
4. prints accuracy with its binomial standard error, the first-token KL to the
   uncompressed model (`craft_eval.scoring.FirstTokenScorer`, a scorer of the run, +- its
   standard error), retention, tokens, prefill ms, the compression time next to the prefill
   time it saves (uncompressed prefill minus this one), KV MB and the FLOPs reduction; then,
   per ratio, the trained module against every other method on the same questions (paired KL difference +- its standard error);
   plots accuracy and retention vs ratio per method; writes the Markdown report and merge
   maps.

`--model PATH` evaluates another checkpoint on the same clips; `--backbone TYPE` a tiny
RANDOM model of that type (its accuracy is meaningless: a pipeline check only). Nothing is
deleted: runs already under OUTPUT/runs resume.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEMO_TASKS = "object_existence,moving_count"
DEMO_FRAMES = 8  # the world's clips: 8 frames at 2 fps
DEMO_RATIOS = (4.0, 8.0, 16.0)
TRAINED = "craft-trained"


def _line(text: str) -> None:
    print(text, flush=True)


def binomial_se(accuracy: float | None, n: int) -> float | None:
    """Standard error (points) of an accuracy in percent over `n` questions."""
    if accuracy is None or n <= 0:
        return None
    p = accuracy / 100.0
    return 100.0 * math.sqrt(p * (1.0 - p) / n)


def _load(model_path: str | None, backbone: str | None, out: Path, dev: Any) -> tuple[Any, ...]:
    """`(model, processor, tag, trained_checkpoint or None, description)`."""
    from craft_eval.backend import load_pretrained

    if model_path:
        model, processor = load_pretrained(model_path, dev)
        return model, processor, Path(model_path).name, None, f"loaded {model_path}"
    if backbone:
        from craft_adapters.tiny import build_tiny_vlm

        model, processor = build_tiny_vlm(backbone, out / "tiny-model")
        return model.to(dev).eval(), processor, f"tiny-{backbone}", None, "a tiny RANDOM model"
    import craft_world

    try:
        model, processor = craft_world.load_backbone()
    except FileNotFoundError as missing:  # a checkout whose world checkpoint is not built yet
        _line(f"craft-world's backbone is missing ({missing}); falling back to a tiny RANDOM model")
        from craft_world.backbone import world_config  # the world's architecture, at random

        return _load(None, world_config().model_type, out, dev)
    try:
        trained: str | None = str(craft_world.craft_path())
    except FileNotFoundError:
        trained = None
    return model.to(dev).eval(), processor, "world", trained, "the world's trained backbone"


def run_demo(
    *,
    model_path: str | None = None,
    backbone: str | None = None,
    ratio: float | None = None,
    ratios: Sequence[float] = DEMO_RATIOS,
    methods: list[str] | None = None,
    output: str | Path = "craft-demo",
    device: str | None = None,
    num_items: int = 40,
    seed: int = 0,
) -> int:
    """Run the demo; returns a process exit code: 0 when every configuration ran, 1 when a
    required piece is missing or any configuration failed (all, or some: the table shows
    the others and a last line names the failed ones).

    Args:
        ratio: evaluate this one ratio only (else `ratios`).
        num_items: held-out clips (questions per task).
    """
    start = time.perf_counter()
    if not _prerequisites():
        return 1
    if num_items < 1:
        raise ValueError(f"num_items must be positive, got {num_items}")
    grid = [float(ratio)] if ratio is not None else [float(r) for r in ratios]
    world = _world(model_path, backbone, Path(output), device, num_items, seed)
    n_items = 2 * num_items
    jobs = _jobs(world, methods, grid)
    _line(f"[3/4] {len(jobs)} configurations x {n_items} questions (ratios {grid})")
    from tqdm.auto import tqdm

    rows: list[dict[str, Any]] = []
    bar = tqdm(total=len(jobs) * n_items, unit="q", desc="demo", dynamic_ncols=True)
    for method, r in jobs:
        rows.append(_run_job(world, method, r))
        bar.update(n_items)
    bar.close()
    _finish(world, rows, n_items, Path(output))
    failed = [r for r in rows if "error" in r]
    _line(f"done in {time.perf_counter() - start:.0f} s")
    if failed:  # any failed configuration: the demo did not show what it promised
        which = ", ".join(f"{r['method']}@{r['ratio']}" for r in failed)
        _line(f"craft-eval demo: {len(failed)} of {len(rows)} configurations FAILED ({which})")
        return 1
    return 0


def _prerequisites() -> bool:
    """craft-adapters' pipeline and craft-world are there; else says what is missing."""
    from craft_eval.backend import adapters_status

    ok, missing = adapters_status()
    if not ok:
        _line(f"craft-eval demo cannot run the model pipeline: {missing}.")
        _line("Nothing was faked; install/finish craft-adapters and run it again.")
        return False
    try:
        import craft_world  # noqa: F401
    except ImportError:
        _line("craft-eval demo needs craft-world (the miniature world): pip install craft-world")
        return False
    return True


@dataclass
class _World:
    """What every configuration of one demo run shares."""

    model: Any
    tag: str
    trained: str | None  # the shipped trained module, or None
    measure: Any  # craft_eval.measure.Measure: the runs, the uncompressed model wrapped once
    first: Any  # the first question (its efficiency profile)


def _world(
    model_path: str | None, backbone: str | None, out: Path, device: str | None, n: int, seed: int
) -> _World:
    """Writes the held-out clips, loads the model, wraps it uncompressed (once)."""
    import torch

    import craft_world
    from craft_eval.measure import Measure
    from craft_eval.tasks import get_benchmark

    data = craft_world.make_clips(out / "data" / "mvbench", n, seed=seed, split="test")
    _line(f"[1/4] wrote {2 * n} held-out questions (MVBench format) + clips -> {data}")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model, processor, tag, trained, what = _load(model_path, backbone, out, dev)
    _line(f"[2/4] {what} ({model.config.model_type}) on {dev}")
    measure = Measure(
        model, processor, data, out / "runs" / tag, subset=DEMO_TASKS, max_frames=DEMO_FRAMES,
        tag=tag,
    )  # fmt: skip
    first = get_benchmark("mvbench").load(data, subset=DEMO_TASKS)[0]
    return _World(model, tag, trained, measure, first)


def _jobs(world: _World, methods: list[str] | None, grid: list[float]) -> list[tuple[str, Any]]:
    """`(method, ratio)`: uncompressed, every method at every ratio, the trained module."""
    from craft_eval.methods import list_methods

    names = methods or [m.name for m in list_methods()]
    jobs: list[tuple[str, float | None]] = [("none", None)]
    jobs += [(m, r) for r in grid for m in names]
    if world.trained is not None:
        jobs += [(TRAINED, r) for r in grid]
    return jobs


def _run_job(world: _World, method: str, ratio: float | None) -> dict[str, Any]:
    """One configuration: the benchmark run with the first-token scorer (resumable
    records; the trained module is CRAFT from the shipped checkpoint), then the efficiency
    profile of the first question. A failure is this row's error, never the demo's: the
    other methods' results still print."""
    from craft_core import TokenBudget
    from craft_eval.tasks import get_benchmark

    trained = method == TRAINED
    budget = None if ratio is None else TokenBudget(ratio=ratio)  # the demo's --ratio, once
    try:
        done = world.measure.run(
            method, budget, method="craft" if trained else method,
            checkpoint=world.trained if trained else None, merge_maps=1,
        )  # fmt: skip
        prompt = get_benchmark("mvbench").prompt(world.first)
        prof = done.backend.profile(world.first, prompt, repeats=3)
    except Exception as error:  # one method failing must not hide the others' results
        return {"method": method, "ratio": ratio, "error": f"{type(error).__name__}: {error}"}
    return {"method": method, "ratio": ratio, "scores": done.scores, "records": done.records,
            **prof}  # fmt: skip


def _finish(world: _World, rows: list[dict[str, Any]], n_items: int, out: Path) -> None:
    """The table, the paired comparisons, the report and the plot."""
    from craft_eval.report import write_report

    _print_table(rows, world.model, n_items)
    _print_paired(rows)
    report = write_report(world.measure.runs, out / "report")
    plot = plot_accuracy_and_retention(rows, out / "report" / "accuracy_retention_vs_ratio.png")
    if world.tag == "world":
        _line(
            "\nAccuracy: micro over both tasks, +- its binomial standard error. craft = an "
            "UNTRAINED module (G = 0.5); craft-trained = the shipped module trained by "
            "`craft-train distill` on the frozen world backbone."
        )
    if world.tag.startswith("tiny-"):
        _line("\nAccuracy here is MEANINGLESS: a tiny model with random weights.")
    _line("FLOPs reduction: analytical, language-model prefill, formula in the README.")
    _line(
        "prefill saved: the uncompressed prefill minus this one (same question, medians); "
        "compare it with compress ms, the time the compressor took to save it."
    )
    _line(f"plot:     {plot}")
    _line(f"report:   {report['markdown']}")
    for path in report["merge_maps"][:2]:
        _line(f"merge map: {path}")
    _line(f"records:  {world.measure.runs}  (JSONL per run; resumable)")


def _print_table(rows: list[dict[str, Any]], model: Any, n_items: int) -> None:
    from craft_eval.efficiency import flops_config

    text_config = flops_config(model.config.get_text_config().to_dict(), model.config.model_type)
    base = next((x for x in rows if x["method"] == "none" and "scores" in x), None)
    _line(f"\n[4/4] results ({n_items} questions; efficiency on the first one)\n")
    header = (
        f"{'method':<16} {'ratio':>5} {'video tokens':>13} {'prefill ms':>10} "
        f"{'compress ms':>11} {'prefill saved':>13} {'KV MB':>7} {'FLOPs red.':>10} "
        f"{'accuracy':>12} {'KL to unc.':>15} {'retention':>9}"
    )
    _line(header)
    _line("-" * len(header))
    for row in rows:
        rtext = "-" if row["ratio"] is None else f"{row['ratio']:g}x"
        if "error" in row:
            _line(f"{row['method']:<16} {rtext:>5} failed: {row['error']}")
            continue
        _line(_table_row(row, base, text_config, rtext))


def _table_row(
    row: dict[str, Any], base: dict[str, Any] | None, text_config: dict[str, Any], rtext: str
) -> str:
    """One method's line; sets row["accuracy" / "se" / "retention"] for the plot."""
    from craft_eval.efficiency import prefill_flops

    s, seq = row["scores"], row["prefill_len"]
    base_len = base["prefill_len"] if base else None
    base_acc = base["scores"]["micro_accuracy"] if base else None
    flops = (
        1 - prefill_flops(text_config, int(seq)) / prefill_flops(text_config, int(base_len))
        if seq and base_len
        else None
    )
    base_ms = base.get("prefill_ms") if base is not None else None
    saved = None  # the prefill time this compression saves (uncompressed minus this one)
    if base_ms is not None and row.get("prefill_ms") is not None and row["method"] != "none":
        saved = base_ms - row["prefill_ms"]
    acc = s["micro_accuracy"]
    se = binomial_se(acc, int(s["n_scored"]))
    acc_text = "-" if acc is None else f"{acc:.1f} +- {se:.1f}"
    keep = None if acc is None or not base_acc else 100.0 * acc / base_acc
    kl = s.get("first_token_kl_mean")
    kl_text = "-" if kl is None else f"{kl:.3f} +- {s['first_token_kl_se']:.3f}"
    row["accuracy"], row["se"], row["retention"] = acc, se, keep
    tokens = f"{_f(s['tokens_before_mean'], 0)} -> {_f(s['tokens_after_mean'], 0)}"
    return (
        f"{row['method']:<16} {rtext:>5} {tokens:>13} {_f(row['prefill_ms'], 1):>10} "
        f"{_f(row['compress_ms'], 1):>11} {_f(saved, 1):>13} {_f(row['kv_mb'], 3):>7} "
        f"{_f(None if flops is None else 100 * flops, 1, '%'):>10} {acc_text:>12} "
        f"{kl_text:>15} {_f(keep, 1, '%'):>9}"
    )


def _print_paired(rows: list[dict[str, Any]]) -> None:
    """Per ratio, the trained module minus every other method on the same questions."""
    from craft_eval.scoring import paired_records

    done = {(r["method"], r["ratio"]): r["records"] for r in rows if "records" in r}
    for (method, ratio), mine in done.items():
        if method != TRAINED:
            continue
        _line(f"\n{TRAINED} at {ratio:g}x vs each method, paired over the same questions "
              "(KL drop > 0: closer to the uncompressed answer; >= 3 SE to count):")  # fmt: skip
        for (other, r), theirs in done.items():
            if r != ratio or other == TRAINED:
                continue
            try:
                drop, se = paired_records(theirs, mine, "first_token_kl")
                gain, gain_se = paired_records(mine, theirs, "first_token_correct")
            except ValueError as why:  # records resumed from a run without the scorer
                _line(f"  vs {other:<16} not paired: {why}")
                continue
            _line(
                f"  vs {other:<16} KL drop {drop:+.3f} +- {se:.3f} ({drop / max(se, 1e-12):+5.1f} SE)"
                f"   accuracy {100 * gain:+5.1f} +- {100 * gain_se:.1f} points"
            )


def plot_accuracy_and_retention(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Two panels, one line per method: accuracy (+- SE bars) and retention vs ratio."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax_acc, ax_ret) = plt.subplots(1, 2, figsize=(11, 4.5))
    lines: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("accuracy") is not None and row["ratio"] is not None:
            lines.setdefault(row["method"], []).append(row)
    for method, pts in sorted(lines.items()):
        pts.sort(key=lambda p: p["ratio"])
        x = [p["ratio"] for p in pts]
        style = {"lw": 2.5, "color": "black"} if method == TRAINED else {"lw": 1, "alpha": 0.8}
        ax_acc.errorbar(x, [p["accuracy"] for p in pts], yerr=[p["se"] for p in pts],
                        marker="o", capsize=2, label=method, **style)  # fmt: skip
        ax_ret.plot(x, [p["retention"] for p in pts], marker="o", label=method, **style)
    base = next((r for r in rows if r["method"] == "none" and r.get("accuracy") is not None), None)
    if base is not None:
        ax_acc.axhline(base["accuracy"], ls="--", color="grey", label="uncompressed")
        ax_ret.axhline(100.0, ls="--", color="grey")
    for ax, label in ((ax_acc, "accuracy (%)"), (ax_ret, "retention (%)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("compression ratio")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    ax_acc.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _f(value: float | None, digits: int, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"
