"""'Did you mean …?' hints for ids, tool names and fields (difflib, as Gymnasium does)."""

from __future__ import annotations

import difflib
from typing import Iterable

__all__ = ["closest"]


def closest(name: str, candidates: Iterable[str], n: int = 3) -> str:
    """A sentence suggesting the candidates closest to `name`, or '' if none is close."""
    matches = difflib.get_close_matches(name, list(candidates), n=n, cutoff=0.6)
    if not matches:
        return ""
    return " Did you mean " + " or ".join(f"'{m}'" for m in matches) + "?"
