"""The eager runner (`batched.py`) against the round written once (`craft_core.algorithm.
compress`): the same kept tokens, owners, rounds and rows, bit for bit, on the 216 reference
cases (autograd on and off), alone and shuffled into batches of other videos.
`test_reference.py` checks the plain loop's tokens against an independent integer
re-statement of algorithm.md; the compiled runner is checked against the same pins
(`test_compiled.py`)."""

from __future__ import annotations

import random

import torch
from core_testkit import (
    Case,
    case_id,
    equals_the_plain_round,
    make_tokens,
    reference_cases,
    reference_gate,
    run_reference_case,
)

from craft_core import CompressionResult, CraftCompressor, resolve_budget
from craft_core.algorithm import compress, pair, select


def test_the_batched_runner_equals_the_plain_round() -> None:
    wrong = []
    for case in reference_cases():
        compressor, x, coords, out = run_reference_case(case)
        if not equals_the_plain_round(out, compressor, x, coords, case.budget):
            wrong.append(case_id(case))
    assert not wrong, wrong


def _compressor_of(case: Case) -> CraftCompressor:
    """The compressor of a group of cases: seeded by its first case (the reference gate for
    `reduce="gate"`)."""
    torch.manual_seed(case.seed)
    compressor = CraftCompressor(case.config, **case.options)
    if case.config.reduce == "gate":
        reference_gate(compressor, case.seed)
    return compressor


def _batch_results(
    compressor: CraftCompressor, cases: list[Case], order: list[int]
) -> dict[str, CompressionResult]:
    """The cases `order` (one config and budget) compressed in ONE `compress_many` call."""
    hidden = cases[0].config.hidden_size
    videos = [make_tokens(cases[i].seed, cases[i].n, hidden) for i in order]
    with torch.set_grad_enabled(cases[0].grad):
        outs = compressor.compress_many(
            [v[0] for v in videos], [v[1] for v in videos], **cases[0].budget
        )
    return {case_id(cases[i]): out for i, out in zip(order, outs)}


def test_batches_in_any_composition_and_order_equal_one_video_alone() -> None:
    """Batch invariance: the 216 reference cases shuffled into batches (cases of one config
    and budget share a compressor), each video's tokens, owners, rounds and rows equal to
    compressing it alone (`exact` precision). On the other CPU instruction paths the
    `core_paths` nox session runs this test again (`ATEN_CPU_CAPABILITY=default` and
    `MKL_CBWR=AVX2`, both set)."""
    groups: dict[tuple, list[Case]] = {}
    for case in reference_cases():
        key = (
            case.config.reduce,
            case.config.weighting,
            str(case.budget),
            case.options["sim_block"],
        )
        groups.setdefault(key, []).append(case)
    shuffle = random.Random(0)
    wrong = []
    for cases in groups.values():
        compressor = _compressor_of(cases[0])
        alone = {}
        for case in cases:
            x, coords = make_tokens(case.seed, case.n, case.config.hidden_size)
            with torch.set_grad_enabled(cases[0].grad):
                alone[case_id(case)] = compressor(x, coords, **case.budget)
        order = list(range(len(cases)))
        shuffle.shuffle(order)
        # One batch of every case, then the shuffled cases in batches of 1-5.
        batches = [order]
        start = 0
        while start < len(order):
            size = shuffle.randint(1, 5)
            batches.append(order[start : start + size])
            start += size
        for batch in batches:
            for name, out in _batch_results(compressor, cases, batch).items():
                want = alone[name]
                same = (
                    torch.equal(out.kept_index, want.kept_index)
                    and torch.equal(out.assignment, want.assignment)
                    and out.rounds == want.rounds
                    and torch.equal(out.features.detach(), want.features.detach())
                )
                if not same:
                    wrong.append((name, len(batch)))
    assert not wrong, wrong[:10]


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
