"""Text spaces: observations and actions of LLM environments are strings."""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium import spaces

_PRINTABLE = string.ascii_letters + string.digits + string.punctuation + " \n"


class TextSpace(spaces.Text):
    """Any Python string of at most `max_length` characters.

    Gymnasium's `Text` only admits characters from a fixed charset; model output and terminal
    output are arbitrary Unicode, so membership here checks type and length only. Sampling
    draws printable ASCII, which is all a random agent needs.
    """

    def __init__(self, max_length: int = 1 << 20, seed: int | np.random.Generator | None = None):
        super().__init__(max_length=max_length, min_length=0, charset=_PRINTABLE, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        length = int(self.np_random.integers(0, min(self.max_length, 64) + 1))
        chars = self.np_random.choice(list(_PRINTABLE), size=length)
        return "".join(chars)

    def __repr__(self) -> str:
        return f"TextSpace(max_length={self.max_length})"
