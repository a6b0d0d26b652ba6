"""Reading an agent's final answer out of free text, the same way for every text env.

Real instruct models answer `9 - 6 = 3`, `**10**`, `The answer is \\boxed{42}.` or a sentence
ending in the number, where a prompt asked for "the number only". The text envs score the
content of such an answer the way the field's math verifiers do (the last number, or what an
explicit answer marker points at) and pay the requested form as a separate reward
(`is_exactly`), so RL still teaches the format and an evaluation shows both.

The answer region, in order of precedence: the last `\\boxed{...}`; the last
`<answer>...</answer>`; the text after the last "answer:" / "answer is" / "final answer";
else the whole reply (`answer_region`). Math-Verify (PyPI) parses the same way but needs
`signal.alarm` for its time-out, which fails off the main thread where rewards may run, so
these few rules are Corral's own.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["CONTENT_WEIGHT", "FORMAT_WEIGHT", "answer_region", "final_number", "is_exactly",
           "plain", "words_in"]

# The weights of a text env's two rewards: the answer's content and the requested form. An
# env's `pass_threshold` is CONTENT_WEIGHT: a right answer in another form is solved, and the
# form earns the rest of the full reward of 1.
CONTENT_WEIGHT, FORMAT_WEIGHT = 0.8, 0.2

_MARKER = re.compile(r"(?:final\s+answer|answer)\s*(?:is|:|=)\s*:?", re.I)
_TAG = re.compile(r"<answer>(.*?)</answer>", re.I | re.S)
# a number: a sign only where it cannot be a binary minus (not in `10-3`), thousands
# separators, decimals
_NUMBER = re.compile(r"(?<![\w.)])[-−]?\d+(?:,\d{3})*(?:\.\d+)?(?!\d)")
_MARKUP = re.compile(r"\*\*|__|`|\$|\\\(|\\\)|\\\[|\\\]")
_WORD = re.compile(r"[a-z]+")


def _boxed(text: str) -> str | None:
    """The contents of the last `\\boxed{...}` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return text[i + 1:]


def plain(text: str) -> str:
    """`text` without Markdown emphasis, code ticks and LaTeX math delimiters."""
    return _MARKUP.sub("", text)


def answer_region(completion: str) -> tuple[str, bool]:
    """(the part of the reply that holds the answer, whether an explicit marker pointed at
    it): a `\\boxed{}`, an `<answer>` tag or the text after an "answer is"/"answer:" marker
    (True), else the whole reply (False)."""
    boxed = _boxed(completion)
    if boxed is not None:
        return plain(boxed).strip(), True
    tags = _TAG.findall(completion)
    if tags:
        return plain(tags[-1]).strip(), True
    markers = list(_MARKER.finditer(completion))
    if markers:
        return plain(completion[markers[-1].end():]).strip(), True
    return plain(completion).strip(), False


def _value(token: str) -> Fraction:
    return Fraction(token.replace("−", "-").replace(",", ""))


def final_number(completion: str) -> Fraction | None:
    """The number a reply answers with: the first number of its marked answer (`\\boxed{}`,
    `<answer>`, "the answer is ..."), else the last number in the reply, in both cases after
    the last `=` if there is one; None if it has none.
    `1,234`, `-5`, `3.0` and `**7**` read as 1234, -5, 3 and 7."""
    region, marked = answer_region(completion)
    region = region.rpartition("=")[2]  # `12 + 7 = 19`: what follows the last `=`
    numbers = _NUMBER.findall(region)
    if not numbers:
        return None
    return _value(numbers[0] if marked else numbers[-1])


def is_exactly(completion: str, pattern: str) -> bool:
    """Whether the whole reply, stripped of surrounding whitespace, matches `pattern` (the
    requested format, paid as its own reward)."""
    return re.fullmatch(pattern, completion.strip()) is not None


def words_in(completion: str, vocabulary: set[str]) -> list[str]:
    """The words of the reply's answer region that are in `vocabulary`, lower-cased, in
    order (punctuation, numbering, commas and line breaks between them ignored)."""
    region, _ = answer_region(completion)
    return [w for w in _WORD.findall(region.lower()) if w in vocabulary]
