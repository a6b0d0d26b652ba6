"""Text spaces: observations and actions of LLM environments are strings.

`TextSpace` observations also travel through the shared memory of Gymnasium's `AsyncVectorEnv`
(its `shared_memory=True` default): the functions registered below for `TextSpace` replace
Gymnasium's `Text` ones, which index into the space's charset and are read only once.
"""

from __future__ import annotations

import multiprocessing
import string
from collections.abc import Sequence
from typing import Any, overload

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import (create_shared_memory, read_from_shared_memory,
                                    write_to_shared_memory)

__all__ = ["SharedTexts", "TextSpace"]

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


class SharedTexts(Sequence[str]):
    """The strings of `n` `TextSpace` observations in shared memory (an `AsyncVectorEnv`'s
    buffer), decoded when read: Gymnasium reads its buffer once, when the vector env is made,
    and relies on the result being a live view (as a numpy array is); a tuple of `str` decoded
    then would stay blank for good. `copy.deepcopy` (what the vector env hands out by default)
    gives a plain tuple."""

    def __init__(self, buffer: Any, n: int, width: int) -> None:
        self._rows = np.frombuffer(buffer.get_obj(), dtype=np.uint32).reshape(n, width + 1)

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...

    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        row = self._rows[index]
        return row[1:1 + int(row[0])].tobytes().decode("utf-32-le")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[str, ...]:
        return tuple(self)

    def __repr__(self) -> str:
        return repr(tuple(self))


@create_shared_memory.register(TextSpace)
def _create_text_buffer(space: TextSpace, n: int = 1, ctx: Any = multiprocessing) -> Any:
    # one row per env: the length, then up to max_length code points (as Gymnasium's own Text
    # buffer: 4 bytes a character), for any Unicode text, not only the space's charset
    return ctx.Array("I", n * (space.max_length + 1), lock=True)


@read_from_shared_memory.register(TextSpace)
def _read_text_buffer(space: TextSpace, shared_memory: Any, n: int = 1) -> SharedTexts:
    return SharedTexts(shared_memory, n, space.max_length)


@write_to_shared_memory.register(TextSpace)
def _write_text_buffer(space: TextSpace, index: int, value: str, shared_memory: Any) -> None:
    codes = np.frombuffer(value.encode("utf-32-le"), dtype=np.uint32)
    if len(codes) > space.max_length:
        raise ValueError(f"an observation of {len(codes)} characters does not fit the "
                         f"observation space's max_length {space.max_length}")
    width = space.max_length + 1
    row = np.frombuffer(shared_memory.get_obj(), dtype=np.uint32)[index * width:(index + 1) * width]
    row[0] = len(codes)
    row[1:1 + len(codes)] = codes
