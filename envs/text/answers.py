"""Reading an agent's final answer out of free text, the same way for every text env."""

from __future__ import annotations

import re

_ANSWER = re.compile(r"answer\s*[:=]\s*(.+)", re.I)


def final_answer(completion: str) -> str:
    """The text after the last 'Answer:' if present, else the last non-empty line; stripped of
    surrounding whitespace, quotes and a trailing period."""
    matches = _ANSWER.findall(completion)
    if matches:
        text = matches[-1]
    else:
        lines = [line for line in completion.strip().splitlines() if line.strip()]
        text = lines[-1] if lines else ""
    return text.strip().strip("`\"'").rstrip(".").strip()
