"""Copy the text of one field into another and submit."""

from __future__ import annotations

import random
from html import escape

import corral as cr
from corral.browser import BrowserEnv, Ref, html_page
from corral.envs.browser.common import SIZE, WORDS, WebTask, form, submitted, text_field

__all__ = ["CopyText", "CopyTextTask", "make_task"]


class CopyTextTask(WebTask):
    text: str


def make_task(rng: random.Random, index: int) -> dict:
    return {"seed": index, "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5)))}


@cr.environment(tasks=cr.Dataset.procedural(make_task, SIZE), task_type=CopyTextTask,
                sandbox=cr.Browser(), max_turns=5)
class CopyText(BrowserEnv):
    """Copy the text of one field into another and submit."""

    def site(self, task: CopyTextTask) -> dict[str, str]:
        fields = (f"<p><label>Source <input name='source' readonly value=\"{escape(task.text)}\">"
                  "</label></p>" + text_field("Destination", "destination"))
        return {"/": html_page("Copy", "<h1>Copy the text</h1>" + form(fields))}

    def instruction(self, task: CopyTextTask) -> str:
        return "Copy the text of the Source field into the Destination field, then submit."

    @cr.reward
    def copied(self, site, task: CopyTextTask) -> float:
        sent = submitted(site, "/submit")
        return float(sent is not None and sent.get("destination") == task.text)

    def solution(self, task: CopyTextTask) -> list[cr.ToolCall]:
        return [cr.ToolCall.of("fill", bid=Ref("textbox", "Destination"), text=task.text),
                cr.ToolCall.of("click", bid=Ref("button", "Submit"))]
