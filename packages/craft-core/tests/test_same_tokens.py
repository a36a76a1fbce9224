"""craft-core 0.4 selects the same tokens as 0.3.0, bit for bit, on every CPU path.

`tokens_0_3_0.json` holds, for each of the 216 reference cases of `test_reference.py`, a
digest of 0.3.0's `(kept_index, assignment, rounds)` and (for the `target`/`mean` fusions,
whose rows are sums and products only) of the output rows' bytes, written by 0.3.0 on this
project's development CPU and identical there under `ATEN_CPU_CAPABILITY=default` and
`MKL_CBWR=AVX2`. The gate's rows go through matmuls whose last bits depend on the CPU path,
so only their selection is pinned. `nox -s core_paths` runs this under both settings.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from core_testkit import case_id, make_tokens, reference_cases, reference_gate

from craft_core import CraftCompressor, CraftConfig

PINNED = json.loads((Path(__file__).parent / "tokens_0_3_0.json").read_text())


def digests(config: CraftConfig, seed: int, n: int, budget: dict, grad: bool) -> list[str]:
    torch.manual_seed(seed)
    compressor = CraftCompressor(config)
    if config.reduce == "gate":  # a trained-looking gate, not the constant 0.5 of a fresh one
        reference_gate(compressor, seed)
    x, coords = make_tokens(seed, n, config.hidden_size)
    with torch.set_grad_enabled(grad):
        out = compressor(x, coords, **budget)
    selection = json.dumps([out.kept_index.tolist(), out.assignment.tolist(), out.rounds])
    rows = out.features.detach().contiguous().numpy().tobytes()
    return [
        hashlib.sha256(selection.encode()).hexdigest()[:16],
        hashlib.sha256(rows).hexdigest()[:16],
    ]


def test_every_reference_case_selects_what_0_3_0_selected() -> None:
    all_cases = reference_cases()
    assert len(all_cases) == len(PINNED) == 216
    wrong_selection, wrong_rows = [], []
    for case in all_cases:
        key = case_id(case)
        config, seed, n, budget, grad = case
        selection, rows = digests(config, seed, n, budget, grad)
        if selection != PINNED[key][0]:
            wrong_selection.append(key)
        if PINNED[key][1] is not None and rows != PINNED[key][1]:
            wrong_rows.append(key)
    assert not wrong_selection, wrong_selection
    assert not wrong_rows, wrong_rows


@pytest.mark.parametrize("pinned", [0, 1])
def test_the_pin_can_fail(pinned: int) -> None:
    # A changed input must not match its pin: one token scaled by 1.5.
    case = reference_cases()[40 + pinned]
    config, seed, n, budget, _ = case
    key = case_id(case)
    torch.manual_seed(seed)
    x, coords = make_tokens(seed, n, config.hidden_size)
    x[0] = x[0] * 1.5
    with torch.no_grad():
        out = CraftCompressor(config)(x, coords, **budget)
    rows = hashlib.sha256(out.features.contiguous().numpy().tobytes()).hexdigest()[:16]
    assert rows != PINNED[key][1]


def test_dense_pairing_selects_what_0_3_0_selected() -> None:
    # The small-N path (every exact similarity in one matrix) against the same pins.
    wrong = []
    for case in reference_cases():
        config, seed, n, budget, grad = case
        if config.pairing != "incremental":
            continue
        key = case_id(case)
        dense = config.model_copy(update={"pairing": "dense"})
        selection, rows = digests(dense, seed, n, budget, grad)
        if selection != PINNED[key][0] or (PINNED[key][1] is not None and rows != PINNED[key][1]):
            wrong.append(key)
    assert not wrong, wrong
