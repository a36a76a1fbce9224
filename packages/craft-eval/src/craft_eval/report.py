"""Reports: a Markdown results table, the accuracy-vs-compression plot and merge maps.

write_report("runs/", "runs/report")  ->  report.md, accuracy_vs_compression.png,
                                           merge_map_*.png (from saved merge-map data)
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from statistics import mean
from typing import Any

import numpy as np

from craft_eval.scoring import retention


class BadSummary(ValueError):
    """A summary.json that cannot be read as a run's summary; the message names the file."""


def collect_runs(root: str | Path, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """Every summary.json under `root` (one per run), with its directory under "_dir".

    A file that is not a run's summary raises `BadSummary` naming it; when a `skipped` list
    is given, the file is left out instead and its "path: reason" appended to the list."""
    out = []
    for path in sorted(Path(root).rglob("summary.json")):
        try:
            summary = read_summary(path)
        except BadSummary as error:
            if skipped is None:
                raise
            skipped.append(str(error))
            continue
        summary["_dir"] = str(path.parent)
        out.append(summary)
    return out


def read_summary(path: Path) -> dict[str, Any]:
    """One run's summary.json, with the fields the report reads checked (BadSummary)."""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadSummary(f"{path}: not a readable JSON summary ({error})") from None
    config = summary.get("config") if isinstance(summary, dict) else None
    scores = summary.get("scores") if isinstance(summary, dict) else None
    if not isinstance(config, dict) or not isinstance(scores, dict):
        raise BadSummary(f"{path}: no 'config' and 'scores' objects (not a run summary)")
    for field in ("model", "method", "benchmark"):
        if not isinstance(config.get(field), str):
            raise BadSummary(f"{path}: config.{field} is missing or not text")
    for field in ("ratio", "threshold"):
        value = config.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise BadSummary(f"{path}: config.{field} is not a number")
    for field in ("accuracy", "comp_ratio"):
        value = scores.get(field)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise BadSummary(f"{path}: scores.{field} is not a finite number")
    protocol = summary.get("protocol")
    if not isinstance(protocol, dict) or not {"protocol", "reference"} <= set(protocol):
        raise BadSummary(f"{path}: no 'protocol' object with protocol and reference")
    return summary  # type: ignore[no-any-return]


def _key(summary: dict[str, Any]) -> tuple[str, str, float | None, float | None]:
    c = summary["config"]
    return c["model"], c["method"], c.get("ratio"), c.get("threshold")


def _label(key: tuple[str, str, float | None, float | None], with_model: bool) -> str:
    model, method, ratio, threshold = key
    if method == "none":
        label = "uncompressed"
    elif ratio is not None:
        label = f"{method} @ {ratio:g}x"
    else:
        label = f"{method} @ s>={threshold:g}"
    return f"{model}: {label}" if with_model else label


def results_table(summaries: list[dict[str, Any]]) -> str:
    """Markdown: one row per method x budget, one column per benchmark (headline accuracy),
    then the average, the realized ratio ("Comp.", per video averaged) and retention against
    the uncompressed run of the same model (`acc / acc_base`, averages over the benchmarks
    both runs have)."""
    benches = sorted({s["config"]["benchmark"] for s in summaries})
    by_key: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = defaultdict(dict)
    for s in summaries:
        by_key[_key(s)][s["config"]["benchmark"]] = s
    models = sorted({key[0] for key in by_key})
    partial = False
    lines = [
        "| method | " + " | ".join(benches) + " | avg | Comp. | retention |",
        "| --- | " + " | ".join("---" for _ in benches) + " | --- | --- | --- |",
    ]

    def order(key: tuple[Any, ...]) -> tuple[str, int, str, float, float]:
        model, method, ratio, threshold = key
        return (model, 0 if method == "none" else 1, method, ratio or 0.0, threshold or 0.0)

    for key in sorted(by_key, key=order):
        runs = by_key[key]
        accs = [runs[b]["scores"]["accuracy"] if b in runs else None for b in benches]
        present = [b for b, a in zip(benches, accs) if a is not None]
        avg = _avg(accs)
        partial = partial or len(present) < len(benches)
        comps = [runs[b]["scores"].get("comp_ratio") for b in present]
        comp = _avg([c for c in comps if c is not None])
        # retention over the benchmarks that this row and its model's base run both have
        base = by_key.get((key[0], "none", None, None), {})
        shared = [b for b in present if b in base]
        ret = retention(
            _avg([runs[b]["scores"]["accuracy"] for b in shared]),
            _avg([base[b]["scores"]["accuracy"] for b in shared]),
        )
        cells = [_fmt(a) for a in accs] + [
            _fmt(avg) + ("*" if avg is not None and len(present) < len(benches) else ""),
            "-" if comp is None else f"{comp:.1f}x",
            "-" if ret is None else f"{ret:.1f}%",
        ]
        lines.append(f"| {_label(key, len(models) > 1)} | " + " | ".join(cells) + " |")
    protocols = sorted(
        {
            f"{s['config']['benchmark']}: {s['protocol']['protocol']} ({s['protocol']['reference']})"
            for s in summaries
        }
    )
    if partial:
        lines += ["", "\\* average over the benchmarks this row has."]
    lines += ["", "Protocols: " + "; ".join(protocols) + "."]
    return "\n".join(lines)


def _avg(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return mean(present) if present else None


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def plot_accuracy_vs_compression(summaries: list[dict[str, Any]], path: str | Path) -> Path:
    """PNG: average accuracy over the benchmarks (y) against the realized ratio (x, log2),
    one line per method; the uncompressed run as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    grouped: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for s in summaries:
        grouped[_key(s)].append(s)
    base = None
    first_model = min(k[0] for k in grouped) if grouped else ""
    for key, runs in grouped.items():
        acc = _avg([r["scores"]["accuracy"] for r in runs])
        comp = _avg([r["scores"].get("comp_ratio") for r in runs])
        if acc is None:
            continue
        name = key[1] if key[0] == first_model else f"{key[0]}: {key[1]}"
        if key[1] == "none":
            if key[0] == first_model:
                base = acc
        elif comp is not None:
            points[name].append((comp, acc))
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for method, pts in sorted(points.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
    if base is not None:
        ax.axhline(base, linestyle="--", color="black", label="uncompressed")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("realized compression ratio (Comp., per video averaged)")
    ax.set_ylabel("accuracy (%), mean over benchmarks")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def save_merge_data(
    path: str | Path,
    frames: np.ndarray,
    coords: Any,
    assignment: Any,
    kept_index: Any,
    title: str = "",
) -> Path:
    """Store what a merge map needs (frames uint8 [F,H,W,3], token coords, assignment)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        path,
        frames=np.asarray(frames, dtype=np.uint8),
        coords=np.asarray(_numpy(coords), dtype=np.int64),
        assignment=np.asarray(_numpy(assignment), dtype=np.int64),
        kept_index=np.asarray(_numpy(kept_index), dtype=np.int64),
        title=np.asarray(title),
    )
    return path


def _numpy(x: Any) -> Any:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else x


PANEL_SIDE, PANEL_GAP, DOT = 256, 6, 4  # a merge map's panel (pixels), gap, dot side
# matplotlib's "tab20" colours (RGB): written out, so the pixels need no matplotlib import
_TAB20 = np.array([
    (31, 119, 180), (174, 199, 232), (255, 127, 14), (255, 187, 120), (44, 160, 44),
    (152, 223, 138), (214, 39, 40), (255, 152, 150), (148, 103, 189), (197, 176, 213),
    (140, 86, 75), (196, 156, 148), (227, 119, 194), (247, 182, 210), (127, 127, 127),
    (199, 199, 199), (188, 189, 34), (219, 219, 141), (23, 190, 207), (158, 218, 229),
], dtype=np.float32) / 255.0  # fmt: skip


def merge_map_image(
    frames: np.ndarray,
    coords: np.ndarray,
    assignment: np.ndarray,
    kept_index: np.ndarray,
    *,
    max_panels: int = 8,
) -> tuple[np.ndarray, list[int]]:
    """The merge map's pixels: `(image [H, W, 3] float in [0, 1], the temporal positions
    shown)`, one panel per position side by side (`PANEL_GAP` white columns between).

    In a panel every patch that was merged is tinted by the colour of the output token it
    went into (same colour across panels = merged over time); a representative gets a
    white dot (`DOT` pixels square) at its patch's centre; patches that stayed alone keep
    their pixels. Small frames are enlarged by an integer factor (nearest pixel) to about
    `PANEL_SIDE` pixels.

    `frames [F, h, w, 3]` uint8; `coords [N, 3]` `(t, h, w)` of token i on the backbone's
    token grid (relative values: they are shifted to start at 0); `assignment [N]` each
    token's output row; `kept_index [K]` the representatives.
    """
    coords = coords - coords.min(axis=0, keepdims=True)
    t_n, h_n, w_n = (int(v) + 1 for v in coords.max(axis=0))
    sizes = np.bincount(assignment, minlength=int(assignment.max()) + 1)
    colours = _TAB20[np.random.default_rng(0).integers(0, 20, size=sizes.shape[0])]
    f_n = frames.shape[0]
    if t_n <= max_panels:
        panels = list(range(t_n))
    else:
        panels = [int(t) for t in np.linspace(0, t_n - 1, max_panels).astype(int)]
    scale = max(1, PANEL_SIDE // max(frames.shape[1:3]))
    kept = {int(k) for k in kept_index}
    images = []
    for t in panels:
        frame = frames[min(f_n - 1, int(t * f_n / t_n))].astype(np.float32) / 255.0
        frame = frame.repeat(scale, axis=0).repeat(scale, axis=1)
        fh, fw = frame.shape[:2]
        overlay = frame.copy()
        for i in np.nonzero(coords[:, 0] == t)[0]:
            _, hi, wi = coords[i]
            y0, y1 = int(hi * fh / h_n), int((hi + 1) * fh / h_n)
            x0, x1 = int(wi * fw / w_n), int((wi + 1) * fw / w_n)
            if sizes[assignment[i]] > 1:
                overlay[y0:y1, x0:x1] = 0.45 * frame[y0:y1, x0:x1] + 0.55 * colours[assignment[i]]
            if int(i) in kept:
                cy, cx = (y0 + y1) // 2 - DOT // 2, (x0 + x1) // 2 - DOT // 2
                overlay[max(cy, 0) : cy + DOT, max(cx, 0) : cx + DOT] = 1.0
        images.append(overlay)
    gap = np.ones((images[0].shape[0], PANEL_GAP, 3), dtype=np.float32)
    row = [part for image in images for part in (image, gap)][:-1]
    return np.concatenate(row, axis=1), panels


def render_merge_map(
    frames: np.ndarray,
    coords: np.ndarray,
    assignment: np.ndarray,
    kept_index: np.ndarray,
    path: str | Path,
    *,
    title: str = "",
    max_panels: int = 8,
) -> Path:
    """PNG of `merge_map_image` (same arguments) under a title line: `title`, the panels'
    temporal positions and `N -> K tokens`. One image drawn at its own pixel size (no axes,
    no layout pass): a demo renders a dozen of these."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    image, panels = merge_map_image(frames, coords, assignment, kept_index, max_panels=max_panels)
    n_in, n_out = assignment.shape[0], len({int(k) for k in kept_index})
    header, dpi = 28, 100
    fig = plt.figure(figsize=(image.shape[1] / dpi, (image.shape[0] + header) / dpi), dpi=dpi)
    fig.figimage(image, xo=0, yo=0, origin="upper")
    shown = ", ".join(str(t) for t in panels)
    fig.text(0.005, 1 - 0.5 * header / (image.shape[0] + header), va="center", fontsize=9,
             s=f"{title}  {n_in} -> {n_out} tokens ({n_in / max(1, n_out):.1f}x);  "
               f"t = {shown}, left to right")  # fmt: skip
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _save(fig: Any, path: str | Path) -> Path:
    """Lay out, write (creating the folder) and close `fig`; the written path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(root: str | Path, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Table + plot + merge maps for every run under `root`; returns the written paths and,
    under "skipped", the summary files left out as unreadable ("path: reason" each)."""
    root = Path(root)
    skipped: list[str] = []
    summaries = collect_runs(root, skipped)
    if not summaries:
        why = f" ({len(skipped)} unreadable: {skipped[0]})" if skipped else ""
        raise FileNotFoundError(f"no usable summary.json under {root}{why}")
    out = Path(out_dir) if out_dir else root / "report"
    out.mkdir(parents=True, exist_ok=True)
    table = results_table(summaries)
    (out / "report.md").write_text("# CRAFT evaluation report\n\n" + table + "\n", encoding="utf-8")
    plot = plot_accuracy_vs_compression(summaries, out / "accuracy_vs_compression.png")
    maps = []
    for npz in sorted(root.rglob("merge_map*.npz")):
        data = np.load(npz, allow_pickle=False)  # a results folder may come from anyone
        name = f"{npz.parent.parent.name}_{npz.parent.name}_{npz.stem}.png".replace("/", "_")
        maps.append(
            render_merge_map(
                data["frames"],
                data["coords"],
                data["assignment"],
                data["kept_index"],
                out / name,
                title=str(data["title"]),
            )
        )
    return {
        "table": table,
        "markdown": out / "report.md",
        "plot": plot,
        "merge_maps": maps,
        "skipped": skipped,
    }
