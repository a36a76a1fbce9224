"""Answer extractors: turn a model's reply into an option letter, as each protocol does.

Each function takes the raw reply and the valid letters and returns a letter, or "" when
nothing usable was found (scored wrong). Extractors whose reference implementation picks a
RANDOM letter when nothing matches return None instead, and the caller applies the chosen
fallback (`random_fallback` below: lmms-eval's seeded random pick, or "").
"""

from __future__ import annotations

import random
import re
import string

ANSWER_PREFIXES = (
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option is",
    "The correct option is",
    "Best answer:",
    "Best option:",
)

# "the answer is"-style phrases that may come right before a letter (case-insensitive).
_ANSWER_PHRASE = (
    r"(?:(?:the\s+)?(?:best|correct|right|final)?\s*(?:answer|option|choice)\s*"
    r"(?:is|would\s+be|should\s+be|:)|answer\s*:|option\s*:)"
)
_OUTER_PUNCT = string.punctuation.replace("(", "").replace(")", "") + " \t\n\r"


def _letter_class(choices: str) -> str:
    return "[" + re.escape(choices) + "]"


def mc_extract(reply: str, choices: str = "ABCD") -> str:
    """lmms-eval's multiple-choice extractor (Video-MME, MLVU), see benchmarks.md.

    After stripping outer punctuation and whitespace, candidate letters are found by these
    patterns, in order of preference: (0) the reply is / starts with a standalone letter;
    (1) it ends with one; (2) a letter right after an "the answer is"-style phrase;
    (3) "(A)"; (4) "A."; (5) "A:"; (6) "A)"; (7) "A "; (8) any standalone letter.
    The most preferred pattern that matches wins; among its matches the LAST position wins.
    Only upper-case letters count, except a reply that is a single letter ("b").
    """
    s = (reply or "").strip().strip(_OUTER_PUNCT)
    if not s:
        return ""
    if len(s) == 1 and s.upper() in choices:
        return s.upper()
    c = _letter_class(choices)
    alone = rf"(?<![A-Za-z0-9])({c})(?![A-Za-z0-9])"
    patterns = [
        rf"^({c})(?![A-Za-z0-9])",
        rf"(?<![A-Za-z0-9])({c})$",
        rf"(?i:{_ANSWER_PHRASE})\s*[\(\[]?\s*({c})(?![A-Za-z0-9])",
        rf"\(({c})\)",
        rf"(?<![A-Za-z0-9])({c})\.",
        rf"(?<![A-Za-z0-9])({c}):",
        rf"(?<![A-Za-z0-9(])({c})\)",
        rf"(?<![A-Za-z0-9])({c}) ",
        alone,
    ]
    for pattern in patterns:
        matches = list(re.finditer(pattern, s))
        if matches:
            return matches[-1].group(1)
    return ""


def first_letter_extract(reply: str, choices: str = "ABCD") -> str:
    """The original Video-MME script's extractor (`extract_characters_regex`): remove answer
    prefixes; more than 10 words with no letter gives ""; else the FIRST letter character."""
    s = (reply or "").strip()
    for prefix in ANSWER_PREFIXES:
        s = s.replace(prefix, "")
    c = _letter_class(choices)
    match = re.search(c, s)
    if match is None:
        return ""
    return match.group(0)


def lvb_extract(reply: str, choices: str = "ABCDE") -> str | None:
    """LongVideoBench (lmms-eval): remove answer prefixes; with no letter, or more than 10
    words and no letter, lmms-eval picks a random letter (None here); else the first letter
    character A-E."""
    s = (reply or "").strip()
    for prefix in ANSWER_PREFIXES:
        s = s.replace(prefix, "")
    c = _letter_class(choices)
    match = re.search(c, s)
    if match is None:
        return None
    return match.group(0)


def mvbench_extract(reply: str, choices: str = "ABCDE") -> str:
    """MVBench (lmms-eval): a reply of the form "A. text" (or "(A) text", "A) text") takes
    that letter; otherwise punctuation and brackets are stripped and the first standalone
    letter among the words is taken; nothing gives ""."""
    s = (reply or "").strip()
    c = _letter_class(choices)
    head = re.match(rf"^[\(\[]?({c})[\.\)\]:](?:\s|$)", s)
    if head:
        return head.group(1)
    cleaned = re.sub(r"[^\w\s]", " ", s)
    for word in cleaned.split():
        if len(word) == 1 and word in choices:
            return word
    return ""


def mvbench_original_extract(reply: str, choices: str = "ABCDE", forced_prefix: str = "(") -> str:
    """The original MVBench `check_ans`: the reply continues "Best option:(", so "(" + reply
    is split on spaces and its first word (dots removed) names the option, e.g. "(B)"."""
    s = (reply or "").strip()
    if forced_prefix and not s.startswith(forced_prefix):
        s = forced_prefix + s
    first = s.split(" ")[0].replace(".", "").lower()
    match = re.fullmatch(rf"\(?([{choices.lower()}])\)?.*", first)
    return match.group(1).upper() if match else ""


def mmmu_extract(reply: str, options: dict[str, str]) -> str | None:
    """EgoSchema (lmms-eval, MMMU-style `parse_multi_choice_response`).

    Looks for "(A)", then "A " , then "A." (letters in option order); if none and the reply
    has more than 5 words, for the option TEXTS (case-insensitive); several candidates: the
    one whose LAST occurrence comes EARLIEST; nothing: None (lmms-eval picks at random).
    """
    response = reply or ""
    for ch in [",", ".", "!", "?", ";", ":", "'"]:
        response = response.strip(ch)
    response = " " + response + " "
    letters = list(options)
    candidates: list[str] = []
    with_brackets = False
    by_index = True
    for letter in letters:
        if f"({letter})" in response:
            candidates.append(letter)
            with_brackets = True
    if not candidates:
        candidates = [x for x in letters if f"{x} " in response]
    if not candidates:
        candidates = [x for x in letters if f"{x}." in response]
    if not candidates and len(response.split()) > 5:
        lowered = response.lower()
        candidates = [x for x in letters if options[x] and options[x].lower() in lowered]
        by_index = not candidates
    if not candidates:
        return None
    if len(candidates) == 1:
        return candidates[0]
    positions = []
    for letter in candidates:
        if not by_index:
            positions.append(response.lower().rfind(options[letter].lower()))
        elif with_brackets:
            positions.append(response.rfind(f"({letter})"))
        else:
            positions.append(response.rfind(f" {letter} "))
    return candidates[min(range(len(candidates)), key=lambda i: positions[i])]


def tempcompass_extract(reply: str, answer: str) -> str:
    """TempCompass multiple choice, offline rules (`--disable_llm`): the reply equals the
    full answer ("A. dunking a basketball"), or is a single letter, or starts with "X." /
    "X)"; then that letter. Anything else gives "" (the official code would ask an LLM)."""
    s = (reply or "").strip()
    gold = (answer or "").strip()
    if gold and s == gold:
        return gold[0]
    if len(s) == 1 and s.isalpha():
        return s.upper()
    match = re.match(r"^([A-Za-z])[\.\)]", s)
    if match:
        return match.group(1).upper()
    return ""


def random_fallback(item_id: str, choices: str, seed: int = 0) -> str:
    """lmms-eval's random pick for an unparseable reply, made reproducible: seeded by
    (seed, item id), so it does not depend on evaluation order, sharding or resuming."""
    return random.Random(f"{seed}:{item_id}").choice(list(choices))
