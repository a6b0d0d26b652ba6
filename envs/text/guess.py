"""Guess the number: a multi-turn game with higher/lower feedback."""

from __future__ import annotations

import math
import random
import re
from typing import Any

import corral as cr

from .answers import plain

__all__ = ["GuessNumber", "GuessTask", "NOT_A_GUESS", "make_task", "read_guess"]

# A guess is a reply that is an integer alone (`37`, `**37**.`) or names it as the guess
# (`Guess: 37`, `My guess is 37`); any other integer in prose is not taken as a guess.
_ALONE = re.compile(r"[-−]?\d+\.?")
_NAMED = re.compile(r"\bguess(?:\s+is)?\s*[:=]?\s*([-−]?\d+)\b", re.I)
NOT_A_GUESS = "No guess read: reply with one integer alone, or 'Guess: N'."


def read_guess(completion: str) -> int | None:
    """The integer a reply guesses (the documented forms above), else None."""
    text = plain(completion).strip()
    if _ALONE.fullmatch(text):
        return int(text.rstrip(".").replace("−", "-"))
    named = _NAMED.findall(text)
    return int(named[-1].replace("−", "-")) if named else None


class GuessTask(cr.Task):
    secret: int
    high: int


def make_task(rng: random.Random, index: int) -> dict:
    high = rng.choice([10, 50, 100])
    return {"secret": rng.randint(1, high), "high": high}


@cr.environment(tasks=cr.Dataset.procedural(make_task, size=100_000).held_out(0.1),
                task_type=GuessTask, max_turns=8)
class GuessNumber(cr.TextEnv):
    """Find a secret number with higher/lower feedback.

    A turn's guess must be in the documented form (`read_guess`: the integer alone, or
    'Guess: N'); a reply that only mentions numbers spends the turn without a guess."""

    def instruction(self, task: GuessTask) -> str:
        turns = self.max_turns
        return (f"I am thinking of an integer between 1 and {task.high}. Guess it: reply with "
                "one integer per turn (the number alone, or 'Guess: N') and I will say "
                f"'higher' or 'lower'. You have {turns} turns.")

    async def respond(self, task: GuessTask, completion: str, state: dict[str, Any]) -> str | None:
        guess = read_guess(completion)
        state["guesses"] = state.get("guesses", 0) + 1
        if guess is None:  # the turn is spent: prose that mentions numbers is no guess
            return NOT_A_GUESS
        if guess == task.secret:
            state["solved"] = True
            return None
        return "higher" if guess < task.secret else "lower"

    @cr.reward(weight=1.0)
    def solved(self, state: dict[str, Any]) -> float:
        return float(state.get("solved", False))

    @cr.reward(weight=0.1)
    def efficient(self, task: GuessTask, state: dict[str, Any]) -> float:
        """Bonus for finding it within the binary-search bound."""
        bound = math.ceil(math.log2(task.high)) + 1
        return float(state.get("solved", False) and state.get("guesses", 99) <= bound)

    def solution(self, task: GuessTask) -> list[str]:
        return [str(task.secret)]

    def random_action(self, task: GuessTask, rng: random.Random) -> str:
        return str(rng.randint(1, task.high))
