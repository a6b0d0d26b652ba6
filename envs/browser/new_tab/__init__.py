"""Open a page in a new tab, read a code there, switch back and enter it."""

from __future__ import annotations

import random

import corral as cr
from corral.browser import BrowserEnv, Ref, html_page
from corral.envs.browser.common import SIZE, WebTask, form, submitted, text_field

__all__ = ["NewTab", "NewTabTask", "make_task"]


class NewTabTask(WebTask):
    code: str


def make_task(rng: random.Random, index: int) -> dict:
    return {"seed": index, "code": str(rng.randint(1000, 99999))}


@cr.environment(tasks=cr.Dataset.procedural(make_task, SIZE), task_type=NewTabTask,
                sandbox=cr.Browser(), max_turns=7)
class NewTab(BrowserEnv):
    """Open a page in a new tab, read a code there, switch back and enter it."""

    def site(self, task: NewTabTask) -> dict[str, str]:
        body = ("<h1>Verify</h1><p><a href='/code' target='_blank'>Show my code</a> "
                "(opens in a new tab)</p>" + form(text_field("Code", "code"), button="Verify"))
        return {"/": html_page("Verify", body),
                "/code": html_page("Your code", f"<h1>Your code</h1><p>{task.code}</p>")}

    def instruction(self, task: NewTabTask) -> str:
        return ("Open \"Show my code\" (it opens a new tab), read the code, go back to the first "
                "tab, enter the code and press Verify.")

    @cr.reward
    def verified(self, site, task: NewTabTask) -> float:
        return float(submitted(site, "/submit") == {"code": task.code})

    def solution(self, task: NewTabTask) -> list[cr.ToolCall]:
        return [cr.ToolCall.of("click", bid=Ref("link", "Show my code")),
                cr.ToolCall.of("tab_focus", index=0),
                cr.ToolCall.of("fill", bid=Ref("textbox", "Code"), text=task.code),
                cr.ToolCall.of("click", bid=Ref("button", "Verify"))]
