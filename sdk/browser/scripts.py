"""Rewards read from the page's own JavaScript state (`js_reward`), for pages that keep score
themselves (MiniWoB's `core.endEpisode`, a game's `window.score`)."""

from __future__ import annotations

from typing import Any, Callable

from ..errors import VerifierError
from ..tools import reward

__all__ = ["js_reward"]


def js_reward(expression: str, *, name: str, weight: float = 1.0) -> Callable[..., Any]:
    """A reward read from the page after the episode: the number the JavaScript `expression`
    evaluates to in the active tab (`true`/`false` count 1/0, `null`/`undefined` 0; anything
    else is a verifier error). Declare it as a class attribute of a `BrowserEnv`:

        raw = js_reward("window.score", name="score")
        seconds = js_reward("window.elapsed", name="seconds", weight=0)   # recorded only
    """

    async def read(page: Any) -> float:
        if page is None:  # no page to read (the episode's sandbox is gone)
            return 0.0
        value = await page.evaluate(expression)
        if value is None:
            return 0.0
        if isinstance(value, (bool, int, float)):
            return float(value)
        raise VerifierError(f"reward {name!r}: {expression} is {value!r}, not a number")

    read.__name__ = read.__qualname__ = name
    read.__doc__ = f"The page's `{expression}`."
    return reward(read, weight=weight, name=name)
