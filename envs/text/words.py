"""Word sorting: sort a list of words alphabetically, or reverse their order."""

from __future__ import annotations

import random

import corral as cr

from .answers import CONTENT_WEIGHT, FORMAT_WEIGHT, words_in

__all__ = ["VOCABULARY", "WordSort", "WordTask", "answer_words", "expected", "make_task"]

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


def answer_words(task: WordTask, completion: str) -> list[str]:
    """The task's words as the reply's answer lists them: the last `len(task.words)` of the
    task's words found in its answer region, case, commas, numbering and line breaks
    ignored (`1. Apple\\n2. River` lists apple, river)."""
    found = words_in(completion, set(task.words))
    return found[-len(task.words):]


@cr.environment(tasks=cr.Dataset.procedural(make_task, size=100_000).held_out(0.1),
                task_type=WordTask, max_turns=1)
class WordSort(cr.TextEnv):
    """Sort or reverse a list of words.

    `exact` (weight 0.8) compares the words the reply's answer lists, in order, normalised
    (`answer_words`); `format` (weight 0.2) pays the requested form: the task's words alone,
    separated by single spaces. Solved means the right order (`pass_threshold` 0.8)."""

    pass_threshold = CONTENT_WEIGHT

    def instruction(self, task: WordTask) -> str:
        how = "in alphabetical order" if task.operation == "sort" else "in reverse order"
        return (f"Write these words {how}, separated by single spaces: "
                f"{' '.join(task.words)}")

    @cr.reward(weight=CONTENT_WEIGHT)
    def exact(self, task: WordTask, completion: str) -> float:
        return float(" ".join(answer_words(task, completion)) == expected(task))

    @cr.reward(weight=FORMAT_WEIGHT)
    def format(self, task: WordTask, completion: str) -> float:
        """The reply is the task's words alone, in some order, separated by single spaces."""
        return float(sorted(completion.strip().split(" ")) == sorted(task.words))

    def solution(self, task: WordTask) -> str:
        return expected(task)

    def random_action(self, task: WordTask, rng: random.Random) -> str:
        return " ".join(rng.sample(task.words, len(task.words)))
