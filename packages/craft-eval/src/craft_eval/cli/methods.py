"""`craft-eval methods`: the registered compression methods."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    sub.add_parser("methods", help="list the registered compression methods")


def command(args: argparse.Namespace) -> int:
    from craft_eval.methods import list_methods

    rows = list_methods()
    width = max(len(m.name) for m in rows)
    print(f"{'name':<{width}}  kind   needs            description")
    for m in rows:
        needs = ", ".join(m.needs) or "-"
        print(f"{m.name:<{width}}  {m.kind:<5}  {needs:<15}  {m.description}")
        print(f"{'':<{width}}  {'':<5}  {'':<15}  saliency: {m.saliency}")
    return 0
