"""Arithmetic: compute an integer expression exactly."""

from __future__ import annotations

import random

import corral as cr

from .answers import CONTENT_WEIGHT, FORMAT_WEIGHT, final_number, is_exactly

__all__ = ["Arithmetic", "ArithmeticTask", "OPS", "make_task"]

OPS = ("+", "-", "*")


class ArithmeticTask(cr.Task):
    expression: str
    answer: int
    level: int


def make_task(rng: random.Random, index: int) -> dict:
    level = 1 + index % 3  # 1: two small numbers, 2: larger numbers, 3: three terms
    hi = 10 if level == 1 else 100
    terms = 2 if level < 3 else 3
    numbers = [rng.randint(0, hi) for _ in range(terms)]
    ops = [rng.choice(OPS) for _ in range(terms - 1)]
    expression = str(numbers[0])
    for op, number in zip(ops, numbers[1:]):
        expression += f" {op} {number}"
    return {"expression": expression, "answer": _evaluate(numbers, ops), "level": level}


def _evaluate(numbers: list[int], ops: list[str]) -> int:
    # Left-to-right with * binding tighter, as Python does; computed without eval().
    terms: list[int] = [numbers[0]]
    signs: list[str] = []
    for op, number in zip(ops, numbers[1:]):
        if op == "*":
            terms[-1] *= number
        else:
            signs.append(op)
            terms.append(number)
    total = terms[0]
    for sign, term in zip(signs, terms[1:]):
        total = total + term if sign == "+" else total - term
    return total


@cr.environment(tasks=cr.Dataset.procedural(make_task, size=100_000).held_out(0.1),
                task_type=ArithmeticTask, max_turns=1)
class Arithmetic(cr.TextEnv):
    """Integer arithmetic with exact answers.

    `correct` (weight 0.8) reads the number the reply answers with (`9 - 6 = 3`, `**3**`,
    `\\boxed{3}` and "The answer is 3." all answer 3; `answers.final_number`); `format`
    (weight 0.2) pays the requested form, the number alone. Solved means correct
    (`pass_threshold` 0.8), whatever the form."""

    pass_threshold = CONTENT_WEIGHT

    def instruction(self, task: ArithmeticTask) -> str:
        return f"Compute {task.expression}. Reply with the number only."

    @cr.reward(weight=CONTENT_WEIGHT)
    def correct(self, task: ArithmeticTask, completion: str) -> float:
        return float(final_number(completion) == task.answer)

    @cr.reward(weight=FORMAT_WEIGHT)
    def format(self, completion: str) -> float:
        """The reply is the number alone, as asked."""
        return float(is_exactly(completion, r"-?\d+"))

    def solution(self, task: ArithmeticTask) -> str:
        return str(task.answer)

    def random_action(self, task: ArithmeticTask, rng: random.Random) -> str:
        return str(rng.randint(-100, 200))
