"""Guess the number: a multi-turn game with higher/lower feedback."""

from __future__ import annotations

import math
import random
import re
from typing import Any

import corral as cr

_NUMBER = re.compile(r"-?\d+")


class GuessTask(cr.Task):
    secret: int
    high: int


def make_task(rng: random.Random, index: int) -> dict:
    high = rng.choice([10, 50, 100])
    return {"secret": rng.randint(1, high), "high": high}


@cr.environment("corral/guess-number-v0",
                tasks=cr.Dataset.procedural(make_task, size=100_000).held_out(0.1),
                task_type=GuessTask, max_turns=8, tags=["text", "game", "multi-turn"])
class GuessNumber(cr.TextEnv):
    """Find a secret number with higher/lower feedback."""

    def instruction(self, task: GuessTask) -> str:
        turns = self.max_turns
        return (f"I am thinking of an integer between 1 and {task.high}. Guess it: reply with "
                f"one number per turn and I will say 'higher' or 'lower'. You have {turns} turns.")

    async def respond(self, task: GuessTask, completion: str, state: dict[str, Any]) -> str | None:
        numbers = _NUMBER.findall(completion)
        state["guesses"] = state.get("guesses", 0) + 1
        if not numbers:
            return "Reply with a single integer."
        guess = int(numbers[-1])
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
