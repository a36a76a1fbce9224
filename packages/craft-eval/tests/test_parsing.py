"""Table-driven tests of every benchmark's answer parser, with realistic replies.

The lmms-eval rows were checked against lmms-eval 0.7.3's own functions; test_lmms_parity.py
pins the parsers to them on a much larger corpus."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from craft_eval.tasks import get_benchmark
from craft_eval.tasks.base import Item
from craft_eval.tasks.parsing import (
    first_letter_extract,
    mc_extract,
    mmmu_extract,
    mvbench_extract,
    mvbench_original_extract,
    random_fallback,
    strip_reasoning,
    tempcompass_extract,
)

# Video-MME / MLVU: lmms-eval's multiple-choice extractor, choices A-D.
MC_CASES = [
    ("C", "C"),
    ("b", ""),  # lmms-eval's extractor is case-sensitive: only capitals count
    ("B.", "B"),
    ("(B)", "B"),
    ("The answer is (B).", "B"),
    ("The answer is B", "B"),
    ("B. Candles.", "B"),
    ("C. Berries", "C"),
    ("I think C", "C"),
    ("I think the answer is D.", "D"),
    ("Answer: A", "A"),
    ("answer: C", "C"),
    ("The correct option is (A) Apples.", "A"),
    ("Option D is correct.", "D"),
    ("D) The three kinds are of the same number.", "D"),
    ("Best option: (C)", "C"),
    ("A", "A"),
    ("  D  ", "D"),
    ("**B**", "B"),
    ("", ""),
    ("   ", ""),
    ("I cannot determine this from the video.", ""),
    ("none of the above", ""),
    ("E", ""),  # not a valid choice for a 4-option benchmark
    (
        "The video shows a man decorating a Christmas tree with apples, candles and berries, "
        "and there appear to be more berries than anything else, so the answer is C.",
        "C",
    ),
    ("Based on the video, (B) seems right, but (C) is also possible.", "C"),
    ("B\n\nThe video shows candles.", "B"),
    ("C. Berries.\nExplanation: the berries outnumber the rest.", "C"),
]


ORIGINAL_VIDEOMME_CASES = [
    ("The best answer is C.", "C"),
    ("C", "C"),
    ("Berries (C)", "B"),  # the original takes the FIRST A-D character: the B of "Berries"
    ("so it is A", "A"),
    ("", ""),
    ("there are more berries than candles and apples in the video here", ""),
]


MVBENCH_CASES = [
    ("(A) Ate the medicine.", "A"),
    ("A. Ate the medicine.", "A"),
    ("B) Tidied up the blanket.", "B"),
    ("C", "C"),
    ("(D)", "D"),
    ("The answer is (C).", "C"),
    ("Best option: (B) Tidied up the blanket.", "B"),
    ("Put down the cup/glass/bottle.", ""),
    ("", ""),
    ("a", "A"),  # lmms-eval's MVBench scorer is case-insensitive
    ("there is a cat", "A"),  # ... even for the article "a"
    ("I would say D, because the person reaches for the box.", "D"),
]


MVBENCH_ORIGINAL_CASES = [
    ("A) Ate the medicine.", "A"),
    ("B) Tidied up the blanket.", "B"),
    ("C", "C"),
    ("(D) Took the box.", "D"),
    ("d) took the box", "D"),
    ("Took the box.", ""),
    ("", ""),
]


EGO_OPTIONS = {
    "A": "C is cooking a meal.",
    "B": "C is cleaning the kitchen.",
    "C": "C is repairing a bicycle.",
    "D": "C is reading a book.",
    "E": "C is painting a wall.",
}
EGOSCHEMA_CASES = [
    ("(B)", "B"),
    ("B", "B"),
    ("B.", "B"),
    ("The answer is (D).", "D"),
    # candidates accumulate over the forms: "C " (the camera wearer) at 4 and "D." at 1;
    # the earliest last occurrence wins
    ("D. C is reading a book.", "D"),
    ("D.", "D"),
    ("Option A is the best.", "A"),
    ("(A) or (C)? I think (C)", "A"),  # last occurrences: (A) at 0, (C) later -> earliest wins
    ("", None),
    ("I am not sure what happens in this video at all", None),
]


def test_egoschema_matches_option_text_in_long_replies() -> None:
    options = {"A": "cooking a meal", "B": "fixing a bicycle", "C": "reading a book"}
    assert mmmu_extract("the person in the video is fixing a bicycle in a garage", options) == "B"
    assert mmmu_extract("fixing a bicycle", options) is None  # 5 words or fewer: no text match
    several = "first cooking a meal, then reading a book, and cooking a meal again at the end"
    assert mmmu_extract(several, options) == "C"  # last occurrence earliest: "reading a book"


TEMPCOMPASS_CASES = [
    ("A. dunking a basketball", "A"),
    ("A", "A"),
    ("b", None),  # lmms-eval: not A-D -> LLM judge (None here; scored wrong offline)
    ("B. dribbling a basketball", "B"),
    ("C) passing a basketball", "C"),
    ("E. something else", None),
    ("The man is dunking a basketball.", None),
    ("The answer is A.", None),
    ("", None),
]


def _item(bench: str, n: int = 5, answer: str = "B") -> Item:
    return Item(
        benchmark=bench,
        id="q1",
        video="v.mp4",
        question="q",
        options=[f"opt{i}" for i in range(n)],
        answer=answer,
    )


LVB_CASES = [
    ("E", "E"),
    ("The best answer is E.", "E"),
    ("Best option: B", "B"),
    ("(C) He puts on a black bathrobe.", "C"),
    ("He is shirtless.", None),  # "H" is not an option letter and no A-E appears
    ("", None),
]


@pytest.mark.parametrize(("reply", "expected"), LVB_CASES)
@pytest.mark.parametrize("fallback", ["random", "empty"])
def test_longvideobench_parse_and_fallback(reply: str, expected: str | None, fallback: str) -> None:
    bench = get_benchmark("longvideobench")
    item = _item("longvideobench")
    got = bench.parse(reply, item, fallback=fallback)
    if expected is not None:
        assert got == expected
    elif fallback == "empty":
        assert got == ""
    else:  # seeded random letter: valid, and the same every time
        assert got in "ABCDE"
        assert got == bench.parse(reply, item, fallback=fallback)
        assert got == random_fallback(item.id, "ABCDE")


def test_random_fallback_depends_only_on_item() -> None:
    picks = {random_fallback(f"q{i}", "ABCDE") for i in range(50)}
    assert len(picks) > 1  # really random over items
    assert random_fallback("q7", "ABCDE") == random_fallback("q7", "ABCDE")


def test_protocol_description_names_fallback() -> None:
    info = get_benchmark("egoschema").describe_protocol("lmms-eval", "empty")
    assert info["fallback"] == "empty"
    assert info["reference"] == "lmms-eval 0.7.3"
    with pytest.raises(ValueError, match="fallback"):
        get_benchmark("videomme").describe_protocol("lmms-eval", "random")
    with pytest.raises(ValueError, match="protocol"):
        get_benchmark("tempcompass").describe_protocol("original")


REASONING_CASES = [
    ("<think>A or C?</think> C", "C"),
    ("<think>\nhmm\n</think>\n\n(B)", "(B)"),
    ("</think>D", "D"),  # the template opened the block: keep what follows the close
    ("<think>unclosed A", "<think>unclosed A"),
    ("<analysis>x</analysis>B ", "B"),
    ("  B  ", "B"),
    (None, ""),
]

# one test for every table above: parser (bound to its choices) -> its cases
PARSERS = {
    "mc": (lambda reply: mc_extract(reply, "ABCD"), MC_CASES),
    "videomme-original": (
        lambda reply: first_letter_extract(reply, "ABCD"),
        ORIGINAL_VIDEOMME_CASES,
    ),
    "mvbench": (lambda reply: mvbench_extract(reply, "ABCD"), MVBENCH_CASES),
    "mvbench-original": (
        lambda reply: mvbench_original_extract(reply, "ABCD"),
        MVBENCH_ORIGINAL_CASES,
    ),
    "egoschema": (lambda reply: mmmu_extract(reply, EGO_OPTIONS), EGOSCHEMA_CASES),
    "tempcompass": (
        lambda reply: tempcompass_extract(reply, "A. dunking a basketball"),
        TEMPCOMPASS_CASES,
    ),
    "strip-reasoning": (strip_reasoning, REASONING_CASES),
}


@pytest.mark.parametrize(
    ("parse", "reply", "expected"),
    [
        pytest.param(parse, reply, expected, id=f"{name}-{i}")
        for name, (parse, cases) in PARSERS.items()
        for i, (reply, expected) in enumerate(cases)
    ],
)
def test_parser_table(
    parse: Callable[[str | None], str | None], reply: str | None, expected: str | None
) -> None:
    assert parse(reply) == expected
