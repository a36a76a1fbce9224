"""What `craft-eval demo` prints and draws: a family's table and paired comparisons, the
ablation ladder craft-world stored, and the accuracy-vs-ratio figure (a panel per family).

A row is one configuration of one family, as `craft_eval.demo` made it: `{"method",
"ratio" (None: uncompressed), "scores", "records", "prefill_len", "prefill_ms",
"compress_ms", "kv_mb"}`, or `{"method", "ratio", "error"}` when it failed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

TRAINED = "craft-trained"
HEADLINE_RIVALS = ("divprune", "craft-selection")
"""What the headline pairs the trained module with: DivPrune and the best fixed rule (CRAFT's
mean rule, the stored ladder's best rung without training)."""
GOAL_SE, GOAL_POINTS = 3.0, 3.0  # issue 54: beat a rival by >= 3 paired SE and >= 3 points
LADDER_SOURCE = "packages/craft-world/docs/crowd.md"


def _line(text: str) -> None:
    print(text, flush=True)


def _f(value: float | None, digits: int, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def binomial_se(accuracy: float | None, n: int) -> float | None:
    """Standard error (points) of an accuracy in percent over `n` questions."""
    if accuracy is None or n <= 0:
        return None
    p = accuracy / 100.0
    return 100.0 * math.sqrt(p * (1.0 - p) / n)


def _accuracy(row: dict[str, Any]) -> tuple[float | None, float | None]:
    """`(accuracy %, its binomial SE)` of a row, `(None, None)` when it has none."""
    scores = row.get("scores") or {}
    acc = scores.get("micro_accuracy")
    return acc, binomial_se(acc, int(scores.get("n_scored", 0)))


def print_table(family: str, rows: list[dict[str, Any]], model: Any, n_items: int) -> None:
    """One family's results, a line per configuration."""
    from craft_eval.efficiency import flops_config

    text_config = flops_config(model.config.get_text_config().to_dict(), model.config.model_type)
    base = next((x for x in rows if x["method"] == "none" and "scores" in x), None)
    _line(f"\n[4/4] {family}: results ({n_items} questions; efficiency on the first one)\n")
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
    """One configuration's line."""
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
    acc, se = _accuracy(row)
    acc_text = "-" if acc is None else f"{acc:.1f} +- {se:.1f}"
    keep = None if acc is None or not base_acc else 100.0 * acc / base_acc
    kl = s.get("first_token_kl_mean")
    kl_text = "-" if kl is None else f"{kl:.3f} +- {s['first_token_kl_se']:.3f}"
    tokens = f"{_f(s['tokens_before_mean'], 0)} -> {_f(s['tokens_after_mean'], 0)}"
    return (
        f"{row['method']:<16} {rtext:>5} {tokens:>13} {_f(row['prefill_ms'], 1):>10} "
        f"{_f(row['compress_ms'], 1):>11} {_f(saved, 1):>13} {_f(row['kv_mb'], 3):>7} "
        f"{_f(None if flops is None else 100 * flops, 1, '%'):>10} {acc_text:>12} "
        f"{kl_text:>15} {_f(keep, 1, '%'):>9}"
    )


def print_paired(rows: list[dict[str, Any]]) -> None:
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


def headline_rows(
    table: list[dict[str, Any]], more: list[dict[str, Any]] | None, n: int
) -> list[dict[str, Any]]:
    """The headline's runs, one `{"method", "ratio", "records"}` (or `"error"`) row per
    configuration it pairs (uncompressed, `HEADLINE_RIVALS`, the trained module): the
    records of the corners table's first `n` questions, then those of its clips beyond the
    table's (`more`'s rows; None: none). Each folder numbers its questions from 0, so ids
    are prefixed "table:" and "more:". A configuration that failed in either is an error."""
    wanted = {"none", TRAINED, *HEADLINE_RIVALS}
    extra = {(r["method"], r["ratio"]): r for r in more or []}
    out: list[dict[str, Any]] = []
    for row in (r for r in table if r["method"] in wanted):
        key = (row["method"], row["ratio"])
        parts = [("table", row)] + ([("more", extra.get(key))] if more is not None else [])
        failed = [f"{name}: {r['error']}" if r else f"{name}: not run" for name, r in parts
                  if r is None or "error" in r]  # fmt: skip
        if failed:
            out.append({"method": key[0], "ratio": key[1], "error": "; ".join(failed)})
            continue
        records = [{**r, "id": f"table:{r['id']}"} for r in row["records"] if r["index"] < n]
        if more is not None:
            records += [{**r, "id": f"more:{r['id']}"} for r in extra[key]["records"]]
        out.append({"method": key[0], "ratio": key[1], "records": records})
    return out


def headline_results(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The headline's figures from its runs' records: per ratio the trained module ran at,
    per rival in `HEADLINE_RIVALS`, `{"ratio", "rival", "n" (paired questions), "kl_drop",
    "kl_se" (the rival's first-token KL minus the trained module's, mean and paired SE),
    "n_se" (kl_drop / kl_se), "points", "points_se" (first-token accuracy, trained minus rival, points), "meets"}`, or
    `{"ratio", "rival", "error"}` where the rival's run failed or the two runs did not answer
    the same questions."""
    done = {(r["method"], r["ratio"]): r["records"] for r in rows if "records" in r}
    out: list[dict[str, Any]] = []
    for (method, ratio), mine in done.items():
        if method != TRAINED:
            continue
        for rival in HEADLINE_RIVALS:
            entry: dict[str, Any] = {"ratio": ratio, "rival": rival}
            theirs = done.get((rival, ratio))
            try:
                if theirs is None:
                    raise ValueError("its run failed")
                entry.update(_paired(mine, theirs))
            except ValueError as why:
                entry["error"] = str(why)
            out.append(entry)
    return out


def _paired(mine: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, Any]:
    """The trained module's records against a rival's, paired by question id; ValueError
    unless both scored exactly the same questions."""
    from craft_eval.scoring import paired_records

    def scored(records: list[dict[str, Any]]) -> set[str]:
        return {r["id"] for r in records if r.get("first_token_kl") is not None
                and r.get("first_token_correct") is not None}  # fmt: skip

    a, b = scored(mine), scored(theirs)
    if a != b:
        raise ValueError(f"the runs scored different questions ({len(a)} and {len(b)}, "
                         f"{len(a ^ b)} not in both)")  # fmt: skip
    drop, se = paired_records(theirs, mine, "first_token_kl")
    gain, gain_se = paired_records(mine, theirs, "first_token_correct")
    n_se = drop / max(se, 1e-12)
    return {"n": len(a), "kl_drop": drop, "kl_se": se, "n_se": n_se, "points": 100 * gain,
            "points_se": 100 * gain_se,
            "meets": n_se >= GOAL_SE and 100 * gain >= GOAL_POINTS}  # fmt: skip


def _verdict(entry: dict[str, Any]) -> str:
    return "MEETS" if entry["meets"] else "does NOT meet"


def print_headline(results: list[dict[str, Any]]) -> None:
    """The headline: one line per ratio, the trained module against each rival."""
    sizes = sorted({r["n"] for r in results if "n" in r})
    counted = " / ".join(str(n) for n in sizes) or "no"
    _line(f"\nHEADLINE ({counted} held-out corners questions: the table's clips and more of its "
          f"seed; paired over the same questions): {TRAINED} vs DivPrune and the mean rule "
          f"(craft-selection). "
          f"KL drop > 0: closer to the uncompressed answer; accuracy: first-token, points. "
          f"Goal: >= {GOAL_SE:g} SE and >= {GOAL_POINTS:g} points.")  # fmt: skip
    if not results:
        _line(f"  no paired result: {TRAINED} did not run")
        return
    for ratio in dict.fromkeys(r["ratio"] for r in results):
        parts = []
        for e in (r for r in results if r["ratio"] == ratio):
            if "error" in e:
                parts.append(f"vs {e['rival']} not paired: {e['error']}")
                continue
            parts.append(
                f"vs {e['rival']} KL drop {e['kl_drop']:+.3f} +- {e['kl_se']:.3f} "
                f"({e['n_se']:+.1f} SE), accuracy {e['points']:+.1f} +- {e['points_se']:.1f} "
                f"points: {_verdict(e)}"
            )
        _line(f"  {ratio:g}x: " + "; ".join(parts))


def headline_markdown(results: list[dict[str, Any]]) -> str:
    """The headline as a Markdown section (appended to its report)."""
    sizes = " / ".join(str(n) for n in sorted({r["n"] for r in results if "n" in r})) or "no"
    lines = [
        f"## Headline: {TRAINED} vs DivPrune and the mean rule",
        "",
        f"{sizes} held-out corners questions, paired over the same questions; KL drop: the "
        f"rival's first-token KL to the uncompressed model minus {TRAINED}'s (nats); accuracy: "
        f"first-token, {TRAINED} minus the rival (points). Goal: >= {GOAL_SE:g} SE and >= "
        f"{GOAL_POINTS:g} points.",
        "",
        "| ratio | vs | questions | KL drop | SE | KL drop / SE | accuracy (points) | SE | goal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in results:
        if "error" in e:
            lines.append(f"| {e['ratio']:g}x | {e['rival']} | not paired: {e['error']} "
                         "| | | | | | |")  # fmt: skip
            continue
        lines.append(
            f"| {e['ratio']:g}x | {e['rival']} | {e['n']} | {e['kl_drop']:+.3f} | "
            f"{e['kl_se']:.3f} | {e['n_se']:+.1f} | {e['points']:+.1f} | {e['points_se']:.1f} "
            f"| {_verdict(e)} |"
        )
    return "\n".join(lines) + "\n"


def ladder_file() -> Path | None:
    """The ladder craft-world stored (`craft_world.ladder_path()`), or None where the
    installed craft-world has no such function or its file is missing."""
    import craft_world

    where = getattr(craft_world, "ladder_path", None)
    if where is None:
        return None
    try:
        path = Path(where())
    except FileNotFoundError:
        return None
    return path if path.is_file() else None


def read_ladder(path: str | Path) -> dict[str, Any]:
    """craft-world's ladder file (JSON): `{"family", "questions", "uncompressed", "ratios",
    "steps": [[label, key], ...], "results": {"<key>@<ratio>": {"accuracy", "accuracy_se",
    "kl", "kl_se"}}}`, accuracies in [0, 1]. Raises ValueError naming a missing or mistyped
    field."""
    ladder = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(ladder, dict):
        raise ValueError("not a JSON object")
    fields: dict[str, tuple[type, ...]] = {
        "family": (str,), "questions": (int,), "uncompressed": (int, float), "ratios": (list,),
        "steps": (list,), "results": (dict,),
    }  # fmt: skip
    for name, kinds in fields.items():
        if not isinstance(ladder.get(name), kinds):
            raise ValueError(
                f"field {name!r} missing or not {' or '.join(k.__name__ for k in kinds)}"
            )
    if not all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in ladder["ratios"]):
        raise ValueError(f"field 'ratios': {ladder['ratios']!r} are not all numbers")
    for step in ladder["steps"]:
        if not (
            isinstance(step, list) and len(step) == 2 and all(isinstance(s, str) for s in step)
        ):
            raise ValueError(f"field 'steps': {step!r} is not [label, key]")
    return ladder


def print_ladder(path: Path | None) -> None:
    """The stored ladder as a table: a line per step, accuracy +- SE (points) and
    first-token KL +- SE at each ratio; a one-line notice where there is none."""
    if path is None:
        _line("\nThe measured ablation ladder is not available (this craft-world ships none: "
              "craft_world.ladder_path()).")  # fmt: skip
        return
    try:
        ladder = read_ladder(path)
    except (OSError, ValueError) as why:
        _line(f"\nThe measured ablation ladder is not available ({path}: {why}).")
        return
    _line(f"\nThe paper's ablation ladder, measured on {ladder['questions']} held-out "
          f"{ladder['family']} questions ({LADDER_SOURCE})")  # fmt: skip
    _line(f"STORED measurements ({Path(path).name}, shipped with craft-world), not this run's; "
          f"uncompressed {100 * ladder['uncompressed']:.1f}.\n")  # fmt: skip
    steps = [(f"{label} ({key})", key) for label, key in ladder["steps"]]
    width = max(len("step"), *(len(s) for s, _ in steps))
    header = f"{'step':<{width}}" + "".join(
        f" {f'{r:g}x accuracy':>14} {f'{r:g}x KL to unc.':>16}" for r in ladder["ratios"]
    )
    _line(header)
    _line("-" * len(header))
    for text, key in steps:
        cells = [_ladder_cells(ladder["results"].get(f"{key}@{r:g}")) for r in ladder["ratios"]]
        _line(f"{text:<{width}}" + "".join(f" {a:>14} {k:>16}" for a, k in cells))


def _ladder_cells(entry: Any) -> tuple[str, str]:
    """`("86.3 +- 1.4", "1.254 +- 0.133")` of one result entry; "-" where a figure is absent."""
    entry = entry if isinstance(entry, dict) else {}

    def pair(value: Any, se: Any, scale: float, digits: int) -> str:
        if not isinstance(value, (int, float)) or not isinstance(se, (int, float)):
            return "-"
        return f"{scale * value:.{digits}f} +- {scale * se:.{digits}f}"

    return (
        pair(entry.get("accuracy"), entry.get("accuracy_se"), 100.0, 1),
        pair(entry.get("kl"), entry.get("kl_se"), 1.0, 3),
    )


def plot_families(rows: dict[str, list[dict[str, Any]]], path: str | Path) -> Path:
    """One figure, a panel per family: accuracy (+- SE bars) vs ratio, a line per method
    (craft-trained bold), the uncompressed accuracy dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(rows), figsize=(5.5 * len(rows), 4.5), squeeze=False)
    for ax, (family, fam_rows) in zip(axes[0], rows.items()):
        _plot_panel(ax, family, fam_rows)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_panel(ax: Any, family: str, rows: list[dict[str, Any]]) -> None:
    lines: dict[str, list[tuple[float, float, float]]] = {}
    for row in rows:
        acc, se = _accuracy(row)
        if acc is not None and se is not None and row["ratio"] is not None:
            lines.setdefault(row["method"], []).append((row["ratio"], acc, se))
    for method, pts in sorted(lines.items()):
        pts.sort()
        bold = {"lw": 2.5, "color": "black", "zorder": 3}  # drawn over the others
        style = bold if method == TRAINED else {"lw": 1, "alpha": 0.8}
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts],
                    marker="o", capsize=2, label=method, **style)  # fmt: skip
    base = next((r for r in rows if r["method"] == "none" and _accuracy(r)[0] is not None), None)
    if base is not None:
        ax.axhline(_accuracy(base)[0], ls="--", color="grey", label="uncompressed")
    ax.set_xscale("log", base=2)
    ticks = sorted({p[0] for pts in lines.values() for p in pts})
    ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
    ax.set_title(family)
    ax.set_xlabel("compression ratio")
    ax.set_ylabel("accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
