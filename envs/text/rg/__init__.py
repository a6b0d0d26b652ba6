"""reasoning-gym's procedural generators as text envs: `corral/rg-<name>-v0`.

One env class serves every generator (the manifest gives each id its `name`); the tasks are
`cr.Dataset.from_reasoning_gym(name, size=, seed=)` with a held-out eval split, the prompt is the
generator's question under reasoning-gym's own default system prompt, and the reward is the
generator's own `score_answer` of the text inside the last `<answer>...</answer>` (the whole
reply when it has none). Needs the `reasoning` extra (`pip install 'corral[reasoning]'`);
`reasoning_gym` is imported when an env is made, not when the catalog is listed.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import corral as cr
from corral.dataset import reasoning_gym_dataset, score_reasoning_gym
from corral.errors import AuthoringError

__all__ = ["ReasoningGymEnv", "extract_answer"]

log = logging.getLogger(__name__)


def extract_answer(completion: str) -> str:
    """The answer reasoning-gym's scorers judge: the last `<answer>` block (its own
    `extract_answer`), else the whole reply stripped."""
    from reasoning_gym.utils import extract_answer as rg_extract

    found = rg_extract(completion)
    return completion.strip() if found is None else found


class ReasoningGymEnv(cr.TextEnv):
    """One reasoning-gym generator: `name` (e.g. 'leg_counting'), `size` tasks from `seed`,
    `config` for the generator's own config fields, `eval_fraction` of them held out."""

    max_turns = 1
    reward_bounds = (0.0, 1.0)

    def __init__(self, *, name: str, size: int = 1000, seed: int = 0,
                 config: dict[str, Any] | None = None, eval_fraction: float = 0.1,
                 **kwargs: Any) -> None:
        if "tasks" not in kwargs:
            kwargs["tasks"] = cr.Dataset.from_reasoning_gym(
                name, size=size, seed=seed, **(config or {})).held_out(eval_fraction)
        super().__init__(**kwargs)
        self.rg_name = name
        from reasoning_gym.utils import SYSTEM_PROMPTS

        self.system_prompt = SYSTEM_PROMPTS["default"]

    def instruction(self, task: cr.Task) -> str:
        return task.question

    @cr.reward(weight=1.0)
    def correct(self, task: cr.Task, completion: str) -> float:
        try:
            return score_reasoning_gym(task, extract_answer(completion))
        except Exception as exc:  # some scorers raise on a malformed answer: a wrong answer,
            # not the env's bug (prime_factorization's int('$'))
            log.debug("%s: score_answer raised %s; scored 0", self.rg_name, exc)
            return 0.0

    def solution(self, task: cr.Task) -> str:
        if task.answer is None:  # a puzzle with many right answers: the generator keeps none
            raise AuthoringError(f"reasoning-gym's {self.rg_name} keeps no answer for its "
                                 "tasks (many are right), so there is no oracle")
        return f"<answer>{task.answer}</answer>"

    def random_action(self, task: cr.Task, rng: random.Random) -> str:
        return f"<answer>{rng.randint(0, 100)}</answer>"

    @property
    def generator(self) -> Any:
        """The reasoning-gym dataset object behind the tasks (its config, its category)."""
        rg = self.tasks[0]["rg"]
        return reasoning_gym_dataset(rg["name"], rg["size"], rg["seed"], rg["config"])
