"""Choose the given option from a dropdown and submit."""

from __future__ import annotations

import random
from html import escape

import corral as cr
from corral.browser import BrowserEnv, Ref, html_page
from corral.envs.browser.common import CITIES, SIZE, WebTask, form, sample, submitted

__all__ = ["Dropdown", "DropdownTask", "make_task"]


class DropdownTask(WebTask):
    options: list[str]
    target: str


def make_task(rng: random.Random, index: int) -> dict:
    options = sample(rng, CITIES, rng.randint(4, 10))
    return {"seed": index, "options": options, "target": rng.choice(options)}


@cr.environment(tasks=cr.Dataset.procedural(make_task, SIZE), task_type=DropdownTask,
                sandbox=cr.Browser(), max_turns=5)
class Dropdown(BrowserEnv):
    """Choose the given option from a dropdown and submit."""

    def site(self, task: DropdownTask) -> dict[str, str]:
        options = "<option value=''>-- choose --</option>" + "".join(
            f"<option value=\"{escape(c)}\">{escape(c)}</option>" for c in task.options)
        select = f"<p><label>Destination <select name='city'>{options}</select></label></p>"
        return {"/": html_page("Travel", "<h1>Book a trip</h1>" + form(select))}

    def instruction(self, task: DropdownTask) -> str:
        return f"Select \"{task.target}\" as the destination and submit."

    @cr.reward
    def chosen(self, site, task: DropdownTask) -> float:
        return float(submitted(site, "/submit") == {"city": task.target})

    def solution(self, task: DropdownTask) -> list[cr.ToolCall]:
        return [cr.ToolCall.of("select", bid=Ref("combobox", "Destination"), option=task.target),
                cr.ToolCall.of("click", bid=Ref("button", "Submit"))]
