"""Answer extractors: turn a model's reply into an option letter, as each protocol does.

Each function takes the raw reply and the valid letters and returns a letter, or "" when
nothing usable was found (scored wrong). Extractors whose reference implementation picks a
RANDOM letter when nothing matches return None instead, and the caller applies the chosen
fallback (`random_fallback` below: lmms-eval's seeded random pick, or "").
"""

from __future__ import annotations

import random
import re

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

REASONING_TAGS = (("<think>", "</think>"), ("<analysis>", "</analysis>"))
"""lmms-eval 0.7.3's default `--reasoning_tags`: blocks removed before any parser runs."""

# lmms-eval 0.7.3 `tasks/_task_utils/mcq_extract.py`: phrases after which the first choice
# letter is a candidate (searched in the lower-cased reply, letters in the original).
_MCQ_PHRASES = (
    "the answer is",
    "answer is",
    "the correct answer is",
    "correct answer is",
    "the best answer is",
    "best answer is",
    "the correct option is",
    "correct option is",
    "the best option is",
    "best option is",
    "the choice is",
    "choice is",
    "the correct choice is",
    "correct choice is",
    "i choose",
    "i select",
    "i pick",
    "my answer is",
    "my choice is",
    "\uc635\uc158",
    "\uc815\ub2f5\uc740",
    "\ub2f5\uc740",
    "\ub2f5:",
    "\u7b54\u6848\u662f",
    "\u7b54\u6848\u4e3a",
    "\u9009",
    "\u7b54\u3048\u306f",
)
# format -> priority (higher wins; ties: the later position wins)
_MCQ_PRIORITY = {
    "start": 10,
    "end": 9,
    "phrase": 7,
    "parentheses": 6,
    "period": 5,
    "colon": 4,
    "right_paren": 3,
    "space": 2,
    "fallback": 0,
}


def _letter_class(choices: str) -> str:
    return "[" + re.escape(choices) + "]"


def strip_reasoning(reply: str | None) -> str:
    """What lmms-eval scores: `<think>...</think>` / `<analysis>...</analysis>` blocks removed
    (with only a closing tag, what follows its last occurrence), then whitespace stripped
    (lmms-eval 0.7.3 `api/reasoning.py:strip_reasoning_tags`)."""
    text = reply or ""
    for start_tag, end_tag in REASONING_TAGS:
        while start_tag in text and end_tag in text:
            start = text.find(start_tag)
            end = text.find(end_tag, start)
            if end == -1:
                break
            text = text[:start] + text[end + len(end_tag) :]
        if end_tag in text and start_tag not in text:
            text = text.rsplit(end_tag, 1)[-1]
    return text.strip()


def mc_extract(reply: str, choices: str = "ABCD") -> str:
    """lmms-eval 0.7.3's multiple-choice extractor (Video-MME, MLVU), re-stated from
    `tasks/_task_utils/mcq_extract.py:extract_mcq_answer`; pinned by test_lmms_parity.py.

    The reply is stripped of whitespace and outer `,.!?;:'"` and padded with spaces. Every
    choice letter found in a format is a candidate at its LAST occurrence: "(A)", "A.", "A:",
    "A)", "A " ; after an answer phrase ("the answer is", ...: first occurrence of the phrase,
    then the first occurrence of each letter after it); a standalone letter at the start or
    the end. Only when none matched: any occurrence of the letter. Highest priority wins
    (start > end > phrase > (A) > A. > A: > A) > "A " > any), ties go to the later position.
    Case-sensitive: only capitals count. Nothing: "".
    """
    if not reply or not reply.strip():
        return ""
    text = reply.strip()
    for ch in ",.!?;:'\"":
        text = text.strip(ch)
    text = f" {text} "
    found: list[tuple[int, int, str]] = []  # (priority, position, letter)

    def add(letter: str, position: int, kind: str) -> None:
        found.append((_MCQ_PRIORITY[kind], position, letter))

    for kind, template in (
        ("parentheses", "({})"),
        ("period", "{}."),
        ("colon", "{}:"),
        ("right_paren", "{})"),
        ("space", "{} "),
    ):
        for letter in choices:
            pattern = template.format(letter)
            if pattern in text:
                add(letter, text.rfind(pattern), kind)
    lowered = text.lower()
    for phrase in _MCQ_PHRASES:
        at = lowered.find(phrase)
        if at != -1:
            for letter in choices:
                position = text.find(letter, at + len(phrase))
                if position != -1:
                    add(letter, position, "phrase")
    core = text.strip()
    for letter in choices:
        if core.startswith(letter) and (len(core) == 1 or not core[1].isalpha()):
            add(letter, 0, "start")
        if core.endswith(letter) and (len(core) == 1 or not core[-2].isalpha()):
            add(letter, len(text) - 1, "end")
    if not found:
        for letter in choices:
            if letter in text:
                add(letter, text.rfind(letter), "fallback")
    if not found:
        return ""
    return max(found, key=lambda f: (f[0], f[1]))[2]


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
    """LongVideoBench (lmms-eval 0.7.3 `tasks/longvideobench/utils.py:
    parse_multi_choice_response`): answer prefixes removed, then the first character A-E
    anywhere (A-E whatever the item's option count; the `choices` argument is ignored for
    that reason); no such character: None (lmms-eval picks a random letter)."""
    s = (reply or "").strip()
    for prefix in ANSWER_PREFIXES:
        s = s.replace(prefix, "")
    match = re.search("[ABCDE]", s)
    return None if match is None else match.group(0)


_MV_PUNCT = (
    ";",
    "/",
    "[",
    "]",
    '"',
    "{",
    "}",
    "(",
    ")",
    "=",
    "+",
    "\\",
    "_",
    "-",
    ">",
    "<",
    "@",
    "`",
    ",",
    "?",
    "!",
)
_MV_PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)")
_MV_COMMA = re.compile(r"(\d)(\,)(\d)")


def _mvbench_punct(text: str) -> str:
    out = text
    for p in _MV_PUNCT:
        if p + " " in text or " " + p in text or _MV_COMMA.search(text) is not None:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _MV_PERIOD.sub("", out, count=int(re.UNICODE))  # lmms-eval passes re.UNICODE as count


def mvbench_extract(reply: str, choices: str = "ABCDE") -> str:
    """MVBench (lmms-eval 0.7.3 `tasks/mvbench/utils.py:mcq_acc`, its `process`): a reply
    "X. text" (X in A-E, any case) gives X; otherwise newlines/tabs become spaces,
    punctuation is removed (VQA-style), quotes and brackets stripped, the text lower-cased,
    and the first standalone a-e WORD gives its letter ("there is a cat" -> A). Nothing: "".
    Letters A-E whatever the option count (`choices` is ignored for that reason)."""
    head = re.match(r"^([A-E])\.\s*(.+)$", (reply or "").strip(), re.IGNORECASE)
    if head:
        return head.group(1).upper()
    s = (reply or "").replace("\n", " ").replace("\t", " ").strip()
    s = _mvbench_punct(s)
    s = s.strip("'").strip('"').strip(")").strip("(").strip().lower()
    word = re.search(r"\b([A-E])\b", s, re.IGNORECASE)
    return word.group(1).upper() if word else ""


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
    """EgoSchema (lmms-eval 0.7.3 `tasks/egoschema/utils.py:parse_multi_choice_response`,
    MMMU-style).

    Outer `,.!?;:'` stripped, the reply padded with spaces. Candidates ACCUMULATE over the
    forms "(A)", then "A ", then "A." (letters in option order; one letter may enter more
    than once); none and more than 5 words: the option TEXTS found (case-insensitive).
    One candidate: it; several: the one whose LAST occurrence comes first (the first such
    in candidate order on ties); none: None (lmms-eval picks a random letter).
    """
    response = reply or ""
    for ch in [",", ".", "!", "?", ";", ":", "'"]:
        response = response.strip(ch)
    response = " " + response + " "
    letters = list(options)
    forms: list[tuple[str, str]] = []  # (searched string, letter)
    for template in ("({})", "{} ", "{}."):
        forms += [(template.format(x), x) for x in letters if template.format(x) in response]
    if forms:
        positions = [response.rfind(form) for form, _ in forms]
        return forms[positions.index(min(positions))][1]
    if len(response.split()) <= 5:
        return None
    lowered = response.lower()
    texts = [x for x in letters if options[x].strip().lower() in lowered]
    if not texts:
        return None
    positions = [lowered.rfind(options[x].strip().lower()) for x in texts]
    return texts[positions.index(min(positions))]


def tempcompass_extract(reply: str, answer: str) -> str | None:
    """TempCompass multiple choice, the deterministic rules of lmms-eval 0.7.3
    (`tasks/tempcompass/utils.py:tempcompass_process_results_multi_choice`): the reply equals
    the full answer ("A. dunking a basketball") -> its letter; is one of A-D; or starts with
    "X." / "X)" (X in A-D) -> X. Anything else: None (lmms-eval asks an LLM judge; craft-eval
    scores it wrong, see docs/lmms-eval.md)."""
    s = reply or ""
    gold = answer or ""
    if gold and s == gold:
        return gold[0]
    if s in ("A", "B", "C", "D"):
        return s
    if s[:2] in ("A.", "B.", "C.", "D.", "A)", "B)", "C)", "D)"):
        return s[0]
    return None


def random_fallback(item_id: str, choices: str, seed: int = 0) -> str:
    """lmms-eval's random pick for an unparseable reply, made reproducible: seeded by
    (seed, item id), so it does not depend on evaluation order, sharding or resuming."""
    return random.Random(f"{seed}:{item_id}").choice(list(choices))
