"""Choose the given radio button and submit."""

from __future__ import annotations

import random

import corral as cr
from corral.browser import BrowserEnv, Ref, html_page
from corral.envs.browser.common import SIZE, WORDS, WebTask, form, sample, submitted

__all__ = ["Radio", "RadioTask", "make_task"]


class RadioTask(WebTask):
    choices: list[str]
    target: str


def make_task(rng: random.Random, index: int) -> dict:
    choices = sample(rng, WORDS, rng.randint(3, 6))
    return {"seed": index, "choices": choices, "target": rng.choice(choices)}


@cr.environment(tasks=cr.Dataset.procedural(make_task, SIZE), task_type=RadioTask,
                sandbox=cr.Browser(), max_turns=5)
class Radio(BrowserEnv):
    """Choose the given radio button and submit."""

    def site(self, task: RadioTask) -> dict[str, str]:
        radios = "".join(f"<p><label><input type='radio' name='choice' value='{w}'> {w}</label>"
                         "</p>" for w in task.choices)
        body = "<h1>Survey</h1>" + form(f"<fieldset><legend>Favourite</legend>{radios}"
                                         "</fieldset>")
        return {"/": html_page("Survey", body)}

    def instruction(self, task: RadioTask) -> str:
        return f"Choose \"{task.target}\" and submit."

    @cr.reward
    def chosen(self, site, task: RadioTask) -> float:
        return float(submitted(site, "/submit") == {"choice": task.target})

    def solution(self, task: RadioTask) -> list[cr.ToolCall]:
        return [cr.ToolCall.of("check", bid=Ref("radio", task.target)),
                cr.ToolCall.of("click", bid=Ref("button", "Submit"))]
