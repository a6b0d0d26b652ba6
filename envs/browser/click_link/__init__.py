"""Follow the link with the given text to its page."""

from __future__ import annotations

import random
from html import escape
from urllib.parse import urlsplit

import corral as cr
from corral.browser import BrowserEnv, Ref, html_page
from corral.envs.browser.common import SIZE, WORDS, WebTask, sample

__all__ = ["ClickLink", "ClickLinkTask", "make_task"]


class ClickLinkTask(WebTask):
    links: list[str]
    target: str


def make_task(rng: random.Random, index: int) -> dict:
    links = sample(rng, WORDS, rng.randint(4, 9))
    return {"seed": index, "links": links, "target": rng.choice(links)}


@cr.environment(tasks=cr.Dataset.procedural(make_task, SIZE), task_type=ClickLinkTask,
                sandbox=cr.Browser(), max_turns=4)
class ClickLink(BrowserEnv):
    """Follow the link with the given text to its page."""

    def site(self, task: ClickLinkTask) -> dict[str, str]:
        items = "".join(f"<li><a href=\"/page/{w}\">{escape(w.title())}</a></li>"
                        for w in task.links)
        pages = {"/": html_page("Links", f"<h1>Places</h1><ul>{items}</ul>")}
        for w in task.links:
            pages[f"/page/{w}"] = html_page(w.title(), f"<h1>{escape(w.title())}</h1>"
                                            "<p>You arrived.</p>")
        return pages

    def instruction(self, task: ClickLinkTask) -> str:
        return f"Open the page of the link \"{task.target.title()}\"."

    @cr.reward
    def arrived(self, page, task: ClickLinkTask) -> float:
        return float(page is not None and urlsplit(page.url).path == f"/page/{task.target}")

    def solution(self, task: ClickLinkTask) -> list[cr.ToolCall]:
        return [cr.ToolCall.of("click", bid=Ref("link", task.target.title()))]
