"""Word sorting: sort a list of words alphabetically, or reverse their order."""

from __future__ import annotations

import random

import corral as cr

from .answers import final_answer

VOCABULARY = (
    "apple river stone cloud maple tiger lemon candle orbit piano garden silver window "
    "rocket forest pepper castle violet mirror bridge coffee dragon island jacket kettle "
    "ladder meadow nickel oyster parrot quartz saddle tunnel umbrella velvet walnut yogurt zebra"
).split()


class WordTask(cr.Task):
    words: list[str]
    operation: str  # "sort" | "reverse"


def make_task(rng: random.Random, index: int) -> dict:
    return {"words": rng.sample(VOCABULARY, k=rng.randint(3, 7)),
            "operation": rng.choice(["sort", "reverse"])}


def expected(task: WordTask) -> str:
    words = sorted(task.words) if task.operation == "sort" else list(reversed(task.words))
    return " ".join(words)


@cr.environment("corral/word-sort-v0",
                tasks=cr.Dataset.procedural(make_task, size=100_000).held_out(0.1),
                task_type=WordTask, max_turns=1, tags=["text", "strings", "single-turn"])
class WordSort(cr.TextEnv):
    """Sort or reverse a list of words."""

    def instruction(self, task: WordTask) -> str:
        how = "in alphabetical order" if task.operation == "sort" else "in reverse order"
        return (f"Write these words {how}, separated by single spaces: "
                f"{' '.join(task.words)}")

    @cr.reward(weight=1.0)
    def exact(self, task: WordTask, completion: str) -> float:
        return float(" ".join(final_answer(completion).replace(",", " ").split()) == expected(task))

    def solution(self, task: WordTask) -> str:
        return expected(task)

    def random_action(self, task: WordTask, rng: random.Random) -> str:
        return " ".join(rng.sample(task.words, len(task.words)))
