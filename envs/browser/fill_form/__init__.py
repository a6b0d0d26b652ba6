"""Fill in a contact form with the given values and submit it."""

from __future__ import annotations

import random

import corral as cr
from corral.browser import BrowserEnv, Ref, html_page
from corral.envs.browser.common import (CITIES, FIRST, LAST, SIZE, WebTask, form, submitted,
                                        text_field)

__all__ = ["FIELDS", "FillForm", "FillFormTask", "make_task"]

FIELDS = (("First name", "first"), ("Last name", "last"), ("Email", "email"), ("City", "city"))


class FillFormTask(WebTask):
    values: dict[str, str]
    order: list[int]


def make_task(rng: random.Random, index: int) -> dict:
    first, last = rng.choice(FIRST), rng.choice(LAST)
    values = {"first": first, "last": last, "city": rng.choice(CITIES),
              "email": f"{first.lower()}.{last.lower()}{rng.randint(1, 99)}@example.org"}
    return {"seed": index, "values": values, "order": rng.sample(range(len(FIELDS)), len(FIELDS))}


@cr.environment(tasks=cr.Dataset.procedural(make_task, SIZE), task_type=FillFormTask,
                sandbox=cr.Browser(), max_turns=8)
class FillForm(BrowserEnv):
    """Fill in a contact form with the given values and submit it."""

    def site(self, task: FillFormTask) -> dict[str, str]:
        fields = "".join(text_field(FIELDS[i][0], FIELDS[i][1],
                                    "email" if FIELDS[i][1] == "email" else "text")
                         for i in task.order)
        return {"/": html_page("Contact", "<h1>Contact details</h1>" + form(fields))}

    def instruction(self, task: FillFormTask) -> str:
        wanted = ", ".join(f"{label}: {task.values[name]}" for label, name in FIELDS)
        return f"Fill in the form with {wanted}, then submit it."

    @cr.reward
    def submitted_values(self, site, task: FillFormTask) -> float:
        return float(submitted(site, "/submit") == task.values)

    def solution(self, task: FillFormTask) -> list[cr.ToolCall]:
        calls = [cr.ToolCall.of("fill", bid=Ref("textbox", label), text=task.values[name])
                 for label, name in FIELDS]
        return [*calls, cr.ToolCall.of("click", bid=Ref("button", "Submit"))]
