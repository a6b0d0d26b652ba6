"""Click the button with the given label among several distractor buttons."""

from __future__ import annotations

import random
from html import escape

import corral as cr
from corral.browser import BrowserEnv, Ref, html_page
from corral.envs.browser.common import MARK_JS, SIZE, WORDS, WebTask, mark_of, sample

__all__ = ["ClickButton", "ClickButtonTask", "make_task"]


class ClickButtonTask(WebTask):
    labels: list[str]
    target: str


def make_task(rng: random.Random, index: int) -> dict:
    labels = sample(rng, WORDS, rng.randint(3, 7))
    return {"seed": index, "labels": labels, "target": rng.choice(labels)}


@cr.environment(tasks=cr.Dataset.procedural(make_task, SIZE), task_type=ClickButtonTask,
                sandbox=cr.Browser(), max_turns=4)
class ClickButton(BrowserEnv):
    """Click the button with the given label among distractors."""

    def site(self, task: ClickButtonTask) -> dict[str, str]:
        buttons = "".join(f"<button onclick=\"mark('clicked', this.textContent)\">"
                          f"{escape(label)}</button>" for label in task.labels)
        return {"/": html_page("Buttons", f"<h1>Buttons</h1><div>{buttons}</div>", MARK_JS)}

    def instruction(self, task: ClickButtonTask) -> str:
        return f"Click the button labelled \"{task.target}\"."

    @cr.reward
    async def clicked(self, page, task: ClickButtonTask) -> float:
        return float(await mark_of(page, "clicked") == task.target)

    def solution(self, task: ClickButtonTask) -> list[cr.ToolCall]:
        return [cr.ToolCall.of("click", bid=Ref("button", task.target))]
