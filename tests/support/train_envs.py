"""A text env with a graded reward, so a random tiny model already has learnable signal
(the built-in envs need a trained model before any group's rewards differ)."""

import corral as cr


@cr.environment("traintest/digits-v0", tasks=[{"n": n} for n in range(64)], max_turns=1)
def digits(task):
    """Say some digits."""
    return f"Write digits, as many as you can. Start with {task.n}."


@digits.reward
def digit_share(task, completion: str) -> float:
    """The share of characters that are digits."""
    return sum(c.isdigit() for c in completion) / max(1, len(completion))


@digits.solution
def all_digits(task):
    """The oracle: digits only (reward 1.0)."""
    return "0123456789"


@cr.environment("traintest/nan-v0", tasks=[{"n": n} for n in range(2)], max_turns=1)
def nan_digits(task):
    """Say some digits (task 0's verifier is broken: it returns NaN)."""
    return f"Write digits, as many as you can. Start with {task.n}."


@nan_digits.reward
def broken_share(task, completion: str) -> float:
    """The share of digit characters; NaN for task 0."""
    if task.n == 0:
        return float("nan")
    return sum(c.isdigit() for c in completion) / max(1, len(completion))
