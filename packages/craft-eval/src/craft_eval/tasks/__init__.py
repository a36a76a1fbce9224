"""The six video benchmarks: loaders (data as distributed), prompts, parsers, scoring rules.

from craft_eval.tasks import get_benchmark
bench = get_benchmark("mvbench")
items = bench.load("/data/MVBench")
prompt = bench.prompt(items[0])               # lmms-eval 0.7.3 protocol by default
letter = bench.parse("(B) the cup", items[0])
"""

from __future__ import annotations

from craft_eval.tasks.base import LETTERS, Benchmark, Item, Prompt
from craft_eval.tasks.egoschema import EgoSchema, write_submission
from craft_eval.tasks.longvideobench import LongVideoBench
from craft_eval.tasks.mlvu import MLVU
from craft_eval.tasks.mvbench import MVBench
from craft_eval.tasks.tempcompass import TempCompass
from craft_eval.tasks.videomme import VideoMME

BENCHMARKS: dict[str, Benchmark] = {
    b.name: b for b in (VideoMME(), LongVideoBench(), MVBench(), EgoSchema(), MLVU(), TempCompass())
}


def get_benchmark(name: str) -> Benchmark:
    """The benchmark called `name` (videomme, longvideobench, mvbench, egoschema, mlvu,
    tempcompass)."""
    key = name.lower().replace("-", "").replace("_", "")
    for bench_name, bench in BENCHMARKS.items():
        if bench_name == key:
            return bench
    raise KeyError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")


__all__ = [
    "BENCHMARKS",
    "LETTERS",
    "MLVU",
    "Benchmark",
    "EgoSchema",
    "Item",
    "LongVideoBench",
    "MVBench",
    "Prompt",
    "TempCompass",
    "VideoMME",
    "get_benchmark",
    "write_submission",
]
