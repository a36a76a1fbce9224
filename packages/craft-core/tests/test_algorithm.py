"""Every eager runner against the round written once (`craft_core.algorithm.compress`): the
same kept tokens, owners, rounds and rows, bit for bit, on the 216 reference cases, for each
pairing strategy and both row stores (autograd on and off). `test_reference.py` checks the
plain loop's tokens against an independent integer re-statement of algorithm.md; the
compiled runner is checked against the same pins (`test_compiled.py`)."""

from __future__ import annotations

import pytest
import torch
from core_testkit import (
    Case,
    case_id,
    equals_the_plain_round,
    reference_cases,
    run_reference_case,
)

from craft_core import resolve_budget
from craft_core.algorithm import compress, pair, select


@pytest.mark.parametrize("pairing", ["incremental", "full", "dense"])
def test_every_runner_equals_the_plain_round(pairing: str) -> None:
    wrong = []
    for case in reference_cases():
        if case.options["pairing"] != "full":
            continue  # each case once (the pairing is ours to choose here)
        compressor, x, coords, out = run_reference_case(case, pairing=pairing)
        if not equals_the_plain_round(out, compressor, x, coords, case.budget):
            wrong.append(case_id(case))
    assert not wrong, wrong


def test_the_plain_round_can_fail() -> None:
    # A planted change (a row scaled) must not pass for the compressor's answer.
    case: Case = reference_cases()[-1]
    compressor, x, coords, out = run_reference_case(case)
    x = x.clone()
    x[3] *= 1.001
    budget = resolve_budget(case.n, **case.budget)
    _, _, rows, _ = compress(compressor, x, coords, budget)
    assert not torch.equal(out.features.detach(), rows)


def test_select_drops_chains_and_keeps_one_target_per_source() -> None:
    # Tokens 0..3, norms 2, 3, 4, 1; room = min(4 - 0, 4 // 2) = 2 edges: 0 -- 1 (target 1)
    # and 1 -- 2 (target 2), where 1 is a target and a source: a chain, dropped.
    norms = torch.tensor([2.0, 3.0, 4.0, 1.0], dtype=torch.float64)
    args = ([0, 1, 2, 3], [1, 2, 1, 1], [0.9, 0.8, 0.8, 0.7], norms)
    assert select(*args, 0, None) == [(1, 0, 0.9)]
    assert select(*args, 3, None) == [(1, 0, 0.9)]  # room min(4 - 3, 2) = 1
    assert select(*args, 0, 0.95) == []  # nothing reaches the threshold
    # Tokens 0..5: 0 -- 2 twice (a mutual pair: one edge) and 1 -- 2, all with source 2: it
    # keeps its best edge only.
    norms = torch.tensor([5.0, 4.0, 1.0, 3.0, 2.0, 1.0], dtype=torch.float64)
    edges = select(
        [0, 1, 2, 3, 4, 5], [2, 2, 0, 4, 3, 4], [0.9, 0.8, 0.9, 0.5, 0.5, 0.4], norms, 0, None
    )
    assert edges == [(0, 2, 0.9)]


def test_pairing_in_row_blocks_equals_one_product() -> None:
    # Integer rows: every product is exact, and repeated rows make ties (to the smallest
    # position). Blocks of 7 rows (a last one short) must give the one-product answer.
    rows = torch.randint(-3, 4, (20, 5), generator=torch.Generator().manual_seed(0))
    embed = torch.cat([rows, rows[:9]]).double()
    whole = pair(embed, block=embed.shape[0])
    for block in (1, 7, 16):
        assert all(torch.equal(a, b) for a, b in zip(pair(embed, block=block), whole))
