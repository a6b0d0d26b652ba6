"""Enter a date given in words into a date field and submit."""

from __future__ import annotations

import datetime
import random

import corral as cr
from corral.browser import BrowserEnv, Ref, html_page
from corral.envs.browser.common import SIZE, WebTask, form, submitted, text_field

__all__ = ["DateEntry", "DateEntryTask", "EVENTS", "make_task"]

EVENTS = ("Arrival", "Departure", "Birthday", "Meeting", "Deadline", "Appointment")


class DateEntryTask(WebTask):
    event: str
    date: str  # ISO


def make_task(rng: random.Random, index: int) -> dict:
    day = datetime.date(2020, 1, 1) + datetime.timedelta(days=rng.randint(0, 3000))
    return {"seed": index, "event": rng.choice(EVENTS), "date": day.isoformat()}


@cr.environment(tasks=cr.Dataset.procedural(make_task, SIZE), task_type=DateEntryTask,
                sandbox=cr.Browser(), max_turns=5)
class DateEntry(BrowserEnv):
    """Enter a date given in words into a date field and submit."""

    def site(self, task: DateEntryTask) -> dict[str, str]:
        field = text_field(f"{task.event} date", "date", "date")
        return {"/": html_page("Dates", f"<h1>{task.event}</h1>" + form(field))}

    def instruction(self, task: DateEntryTask) -> str:
        day = datetime.date.fromisoformat(task.date)
        return f"Set the {task.event.lower()} date to {day:%B} {day.day}, {day.year} and submit."

    @cr.reward
    def entered(self, site, task: DateEntryTask) -> float:
        return float(submitted(site, "/submit") == {"date": task.date})

    def solution(self, task: DateEntryTask) -> list[cr.ToolCall]:
        return [cr.ToolCall.of("fill", bid=Ref("textbox", f"{task.event} date"), text=task.date),
                cr.ToolCall.of("click", bid=Ref("button", "Submit"))]
