"""`craft-eval demo`: the paper in miniature on a laptop CPU, nothing downloaded.

1. writes held-out clips of the miniature world's two families (`craft_world.make_clips`,
   split "test") in MVBench's format, each in its own folder under OUTPUT/data:
   "squares" (object_existence "Is there a red square?", squares that may be visible in
   only 2 of 8 frames, and moving_count "How many squares are there?": 2 questions a clip)
   and "corners" (moving_direction "Is there a red dot in a top-left corner?" among more
   small tiles than a selector keeps at 8-16x: 1 question a clip),
2. loads, once for both, the world's trained ~1M-parameter Qwen2.5-VL
   (`craft_world.load_backbone()`) and the merge module trained on it by craft-train
   (`craft_world.craft_path()`),
3. runs, per family, every question through reader -> processor -> adapter -> compressor ->
   generate -> parser -> scorer: uncompressed, each method (default `DEMO_METHODS`: the
   selection-only baselines and CRAFT's fixed rules) at 8x and 16x, and the trained CRAFT
   module ("craft-trained") at the same ratios; each family's runs under
   OUTPUT/runs/<model>/<family>,
4. the headline comparison: on a larger set of held-out corners clips (`headline_items`,
   default `HEADLINE_ITEMS`: clips 0.. of the same seed) only what it needs: uncompressed,
   `HEADLINE_RIVALS` (DivPrune and the mean rule, always in the table) and craft-trained at
   each ratio. The corners table's clips are its first ones (their records are reused); the
   clips beyond them are written under OUTPUT/data/corners-more, their runs under
   OUTPUT/runs/<model>/corners-more. At 40 questions the table's paired differences are ~1
   SE, at 160 ~5,
5. prints per family the table (`craft_eval.demo_report`), the trained module against every
   other method paired over the same questions, after the corners table the paper's
   ablation ladder as craft-world stored it (`craft_world.ladder_path()`: measurements on
   600 questions, not this run's); then the headline, one paired line per ratio (trained vs
   each rival: KL drop +- SE, n SE, accuracy points +- paired SE, and whether it meets >= 3
   SE and >= 3 points), computed from the headline runs' records; plots accuracy vs ratio, a
   panel per family; writes a Markdown report per family (the headline's with its paired
   table) and merge maps.

`--model PATH` evaluates another checkpoint on the same clips; `--backbone TYPE` a tiny
RANDOM model of that type (its accuracy is meaningless: a pipeline check only). Nothing is
deleted: runs already under OUTPUT/runs resume.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from craft_eval.demo_jobs import Family, World, make_family, run_job
from craft_eval.demo_report import HEADLINE_RIVALS, TRAINED, binomial_se

__all__ = [
    "DEMO_FAMILIES",
    "DEMO_METHODS",
    "DEMO_RATIOS",
    "FAMILY_TASKS",
    "HEADLINE_ITEMS",
    "HEADLINE_RIVALS",
    "binomial_se",
    "run_demo",
]

FAMILY_TASKS = {"squares": "object_existence,moving_count", "corners": "moving_direction"}
"""The MVBench tasks each family of the world files its questions under."""
FAMILY_QUESTIONS = {"squares": 2, "corners": 1}  # questions per clip
DEMO_FAMILIES = ("squares", "corners")
DEMO_RATIOS = (8.0, 16.0)
DEMO_METHODS = (
    "divprune", "visionzip", "fastvid",  # selection only
    "flashvid-llm", "holitom-llm",  # the newest peers, each with its stage inside the LM
    "craft-selection",  # CRAFT's mean rule (the best fixed rule of the stored ladder)
)  # fmt: skip
"""The table's rivals of the trained module; `--methods all` runs every registered method
(uniform, CRAFT's target rule and untrained gate, the peers without their stage in the LM):
25 configurations instead of 15, about twice the demo's time."""
HEADLINE = "corners-headline"  # the headline's report folder name
MORE = "corners-more"  # the data and runs folder of the headline's clips beyond the table's
HEADLINE_ITEMS = 160
"""Corners clips (1 question each) of the headline comparison, 7 configurations at 8x and
16x: at the stored ladder's effect sizes (600 questions: 8.8 SE vs DivPrune at 8x) about 4.5
paired SE, where the table's 40 give about 2 (seed 0, measured: 4.2 to 5.2 SE vs DivPrune and
the mean rule; on the first 40 clips, 1.0 to 1.1)."""


def _line(text: str) -> None:
    print(text, flush=True)


def _load(model_path: str | None, backbone: str | None, out: Path, dev: Any) -> tuple[Any, ...]:
    """`(model, processor, tag, trained_checkpoint or None, description, source)`: `source`
    is the folder the model was loaded from (None: craft-world's shipped backbone), where a
    demo worker loads the same weights."""
    from craft_eval.backend import load_pretrained

    if model_path:
        model, processor = load_pretrained(model_path, dev)
        return model, processor, Path(model_path).name, None, f"loaded {model_path}", model_path
    if backbone:
        from craft_adapters.tiny import build_tiny_vlm

        folder = out / "tiny-model"
        model, processor = build_tiny_vlm(backbone, folder)  # saved there, loaded back
        what = "a tiny RANDOM model"
        return model.to(dev).eval(), processor, f"tiny-{backbone}", None, what, str(folder)
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
    what = "the world's trained backbone"
    return model.to(dev).eval(), processor, "world", trained, what, None


def run_demo(
    *,
    model_path: str | None = None,
    backbone: str | None = None,
    ratio: float | None = None,
    ratios: Sequence[float] = DEMO_RATIOS,
    methods: Sequence[str] | None = None,
    families: Sequence[str] = DEMO_FAMILIES,
    output: str | Path = "craft-demo",
    device: str | None = None,
    num_items: int = 40,
    seed: int = 0,
    headline_items: int = HEADLINE_ITEMS,
    workers: int = 1,
) -> int:
    """Run the demo; returns a process exit code: 0 when every configuration ran, 1 when a
    required piece is missing or any configuration failed (all, or some: the tables show
    the others and a last line names the failed ones).

    Args:
        ratio: evaluate this one ratio only (else `ratios`).
        methods: registered method names (default `DEMO_METHODS`).
        families: world families, keys of `FAMILY_TASKS`.
        num_items: held-out clips per family.
        headline_items: held-out corners clips of the headline comparison (0: none); it runs
            when the corners family does and the world ships a trained module.
        workers: processes the configurations are shared out between (`demo_pool`); 1:
            all in this one.
    """
    start = time.perf_counter()
    if not _prerequisites():
        return 1
    _check_sizes(num_items, headline_items, families, workers)
    grid = [float(ratio)] if ratio is not None else [float(r) for r in ratios]
    world = _world(model_path, backbone, Path(output), device, num_items, seed, tuple(families))
    methods = list(DEMO_METHODS if methods is None else methods)
    heads = bool(headline_items) and "corners" in families and world.trained is not None
    if heads:  # the headline pairs the trained module with its rivals on the table's clips too
        methods += [m for m in HEADLINE_RIVALS if m not in methods]
    jobs = _jobs(world.trained, methods, grid)
    more = None
    if heads and headline_items > num_items:
        more = _more_clips(world, Path(output), num_items, headline_items - num_items, seed)
    more_jobs = _jobs(world.trained, HEADLINE_RIVALS, grid) if more is not None else []
    total = sum(len(jobs) * fam.n_items for fam in world.families)
    total += len(more_jobs) * (more.n_items if more is not None else 0)
    sizes = ", ".join(f"{fam.name} {fam.n_items}" for fam in world.families)
    _line(f"[3/4] {len(jobs)} configurations x questions ({sizes}) at ratios {grid}"
          + (f"; headline {headline_items} corners: the table's + {len(more_jobs)} x "
             f"{more.n_items} more" if more else ""))  # fmt: skip
    rows, more_rows = _run_all(world, jobs, more, more_jobs, total, workers)
    headline = None
    if heads:
        from craft_eval.demo_report import headline_rows

        headline = headline_rows(rows["corners"], more_rows, min(headline_items, num_items))
    _finish(world, rows, Path(output), headline, more_rows)
    done = {**rows, **({MORE: more_rows} if more_rows is not None else {})}
    _line(f"done in {time.perf_counter() - start:.0f} s")
    return _exit_code(done)


def _check_sizes(
    num_items: int, headline_items: int, families: Sequence[str], workers: int = 1
) -> None:
    """The demo's sizes, families and workers, refused before anything is written."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if num_items < 1:
        raise ValueError(f"num_items must be positive, got {num_items}")
    if headline_items < 0:
        raise ValueError(f"headline_items must be >= 0, got {headline_items}")
    unknown = [f for f in families if f not in FAMILY_TASKS]
    if unknown or not families:
        raise ValueError(f"families must be some of {list(FAMILY_TASKS)}, got {list(families)}")


def _run_all(
    world: World,
    jobs: list[tuple[str, float | None]],
    more: Family | None,
    more_jobs: list[tuple[str, float | None]],
    total: int,
    workers: int = 1,
) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]] | None]:
    """Every family's configurations, then those of the headline's clips beyond the corners
    table's (`more`; None: none; no profile, no merge maps), under one progress bar of
    `total` questions; in this process, or shared out between `workers` (`demo_pool`).
    Returns the families' rows and `more`'s (None without it)."""
    from tqdm.auto import tqdm

    fams = {fam.name: fam for fam in world.families} | ({MORE: more} if more else {})
    todo = [(fam.name, m, r, True) for fam in world.families for m, r in jobs]
    todo += [(MORE, m, r, False) for m, r in more_jobs] if more is not None else []
    bar = tqdm(total=total, unit="q", desc="demo", dynamic_ncols=True)
    if workers == 1:
        done = []
        for name, method, r, profile in todo:
            done.append(run_job(world, fams[name], method, r, profile=profile))
            bar.update(fams[name].n_items)
    else:
        from craft_eval import demo_pool

        done = demo_pool.run_parallel(_worker_spec(world, fams, workers), todo, workers,
                                      lambda name: bar.update(fams[name].n_items))  # fmt: skip
    bar.close()
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in fams}
    for (name, *_), row in zip(todo, done, strict=True):
        rows[name].append(row)
    more_rows = rows.pop(MORE) if more is not None else None
    return rows, more_rows


def _worker_spec(world: World, fams: dict[str, Family], workers: int) -> Any:
    """The `demo_pool.WorkerSpec` that rebuilds this world in a worker process."""
    from craft_eval import demo_pool

    families = tuple(
        (name, str(f.measure.data_root), str(f.measure.runs), f.measure.subset, f.n_items,
         f.first is not None)
        for name, f in fams.items()
    )  # fmt: skip
    device = str(next(world.model.parameters()).device)
    return demo_pool.WorkerSpec(world.source, device, world.tag, world.trained, families,
                                demo_pool.threads_per_worker(workers))  # fmt: skip


def _exit_code(done: dict[str, list[dict[str, Any]]]) -> int:
    """0, or 1 naming every failed configuration: the demo did not show what it promised."""
    failed = [f"{name}:{r['method']}@{r['ratio']}" for name, fr in done.items() for r in fr
              if "error" in r]  # fmt: skip
    if not failed:
        return 0
    count = sum(len(fr) for fr in done.values())
    _line(f"craft-eval demo: {len(failed)} of {count} configurations FAILED ({', '.join(failed)})")
    return 1


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


def _world(
    model_path: str | None,
    backbone: str | None,
    out: Path,
    device: str | None,
    n: int,
    seed: int,
    families: tuple[str, ...],
) -> World:
    """Writes each family's held-out clips, loads the model once, wraps it uncompressed
    once per family (its KL reference)."""
    import torch

    import craft_world

    roots = {}
    for name in families:
        roots[name] = craft_world.make_clips(out / "data" / name, n, seed=seed, family=name)
        _line(f"[1/4] wrote {FAMILY_QUESTIONS[name] * n} held-out {name} questions "
              f"(MVBench format) + clips -> {roots[name]}")  # fmt: skip
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model, processor, tag, trained, what, source = _load(model_path, backbone, out, dev)
    _line(f"[2/4] {what} ({model.config.model_type}) on {dev}")
    fams = [
        make_family(name, FAMILY_QUESTIONS[name] * n, model, processor, data,
                    out / "runs" / tag / name, tasks=FAMILY_TASKS[name], tag=tag)
        for name, data in roots.items()
    ]  # fmt: skip
    return World(model, tag, trained, fams, processor, source)


def _more_clips(world: World, out: Path, start: int, n: int, seed: int) -> Family:
    """The headline's corners clips beyond the table's: clips `start .. start + n - 1` of the
    same seed (`make_clips(..., start=start)`; the table's are clips 0 .. start - 1), in their
    own data and runs folders, on the model already loaded."""
    import craft_world

    data = craft_world.make_clips(out / "data" / MORE, n, seed=seed, start=start,
                                  family="corners")  # fmt: skip
    _line(f"[1/4] wrote {FAMILY_QUESTIONS['corners'] * n} more held-out corners questions for "
          f"the headline comparison (clips {start}..{start + n - 1}) -> {data}")  # fmt: skip
    return make_family(MORE, FAMILY_QUESTIONS["corners"] * n, world.model, world.processor,
                       data, _more_runs(out, world.tag), tasks=FAMILY_TASKS["corners"],
                       tag=world.tag, profile=False)  # fmt: skip


def _more_runs(out: Path, tag: str) -> Path:
    return out / "runs" / tag / MORE


def _jobs(
    trained: str | None, methods: Sequence[str], grid: list[float]
) -> list[tuple[str, float | None]]:
    """`(method, ratio)`: uncompressed, every method at every ratio, the trained module."""
    jobs: list[tuple[str, float | None]] = [("none", None)]
    jobs += [(m, r) for r in grid for m in methods]
    if trained is not None:
        jobs += [(TRAINED, r) for r in grid]
    return jobs


def _finish(
    world: World,
    rows: dict[str, list[dict[str, Any]]],
    out: Path,
    headline: list[dict[str, Any]] | None = None,
    more: list[dict[str, Any]] | None = None,
) -> None:
    """Per family the table, the paired comparisons and the report (after corners, the
    stored ladder); the headline's paired lines, its table appended to the report of the
    runs on its clips beyond the table's (`more`'s rows; without them, to the corners
    report); then the plot, a panel per family."""
    from craft_eval import demo_report
    from craft_eval.report import write_report

    reports = {}
    for fam in world.families:
        demo_report.print_table(fam.name, rows[fam.name], world.model, fam.n_items)
        demo_report.print_paired(rows[fam.name])
        if fam.name == "corners":
            demo_report.print_ladder(demo_report.ladder_file())
        if any("scores" in r for r in rows[fam.name]):
            reports[fam.name] = write_report(fam.measure.runs, out / "report" / fam.name)
    if headline is not None:
        results = demo_report.headline_results(headline)
        demo_report.print_headline(results)
        section = demo_report.headline_markdown(results)
        if more is not None and any("scores" in r for r in more):
            reports[HEADLINE] = write_report(_more_runs(out, world.tag), out / "report" / HEADLINE)
            section = ("The runs above: the headline's clips beyond the corners table's (the "
                       "table's own are in ../corners).\n\n" + section)  # fmt: skip
        report = reports.get(HEADLINE, reports.get("corners"))
        if report is not None:
            with open(report["markdown"], "a", encoding="utf-8") as md:
                md.write("\n" + section)
    plot = demo_report.plot_families(rows, out / "report" / "accuracy_vs_ratio.png")
    if world.tag == "world":
        _line(
            "\nAccuracy: micro over the family's questions, +- its binomial standard error. "
            "craft = an UNTRAINED module (G = 0.5); craft-trained = the shipped module trained "
            "by craft-train on the frozen world backbone."
        )
    if world.tag.startswith("tiny-"):
        _line("\nAccuracy here is MEANINGLESS: a tiny model with random weights.")
    _line("FLOPs reduction: analytical, language-model prefill, formula in docs/efficiency.md.")
    _line(
        "prefill saved: the uncompressed prefill minus this one (same question, medians); "
        "compare it with compress ms, the time the compressor took to save it."
    )
    _line(f"plot:     {plot}")
    for report in reports.values():
        _line(f"report:   {report['markdown']}")
        for path in report["merge_maps"][:1]:
            _line(f"merge map: {path}")
    _line(f"records:  {Path(out) / 'runs' / world.tag}  (JSONL per run, a folder per family; "
          "resumable)")  # fmt: skip
