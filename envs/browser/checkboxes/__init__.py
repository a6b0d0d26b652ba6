"""Tick exactly the listed checkboxes and submit."""

from __future__ import annotations

import random

import corral as cr
from corral.browser import BrowserEnv, Ref, html_page
from corral.envs.browser.common import SIZE, WORDS, WebTask, form, sample, submitted

__all__ = ["Checkboxes", "CheckboxesTask", "make_task"]


class CheckboxesTask(WebTask):
    items: list[str]
    targets: list[str]


def make_task(rng: random.Random, index: int) -> dict:
    items = sample(rng, WORDS, rng.randint(4, 8))
    return {"seed": index, "items": items,
            "targets": sorted(rng.sample(items, rng.randint(1, len(items) - 1)))}


@cr.environment(tasks=cr.Dataset.procedural(make_task, SIZE), task_type=CheckboxesTask,
                sandbox=cr.Browser(), max_turns=10)
class Checkboxes(BrowserEnv):
    """Tick exactly the listed checkboxes and submit."""

    def site(self, task: CheckboxesTask) -> dict[str, str]:
        boxes = "".join(f"<p><label><input type='checkbox' name='pick' value='{w}'> {w}</label>"
                        "</p>" for w in task.items)
        return {"/": html_page("Choices", "<h1>Pick items</h1>" + form(boxes))}

    def instruction(self, task: CheckboxesTask) -> str:
        return f"Tick exactly these boxes: {', '.join(task.targets)}; then submit."

    @cr.reward
    def ticked(self, site, task: CheckboxesTask) -> float:
        sent = submitted(site, "/submit")
        if sent is None:
            return 0.0
        picked = sent.get("pick", [])
        picked = sorted([picked] if isinstance(picked, str) else picked)
        return float(picked == task.targets)

    def solution(self, task: CheckboxesTask) -> list[cr.ToolCall]:
        calls = [cr.ToolCall.of("check", bid=Ref("checkbox", w)) for w in task.targets]
        return [*calls, cr.ToolCall.of("click", bid=Ref("button", "Submit"))]
