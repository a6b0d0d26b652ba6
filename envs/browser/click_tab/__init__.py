"""Switch to an in-page tab, then click a link shown on it."""

from __future__ import annotations

import random
from html import escape

import corral as cr
from corral.browser import BrowserEnv, Ref, html_page
from corral.envs.browser.common import MARK_JS, SIZE, WORDS, WebTask, mark_of, sample

__all__ = ["ClickTab", "ClickTabTask", "TABS_JS", "make_task"]

TABS_JS = MARK_JS + """
function show(i) {
  document.querySelectorAll('[role=tab]')
    .forEach((t, j) => t.setAttribute('aria-selected', i === j));
  document.querySelectorAll('[role=tabpanel]').forEach((p, j) => p.hidden = i !== j);
}"""


class ClickTabTask(WebTask):
    tabs: list[str]
    links: list[list[str]]
    tab: int
    target: str


def make_task(rng: random.Random, index: int) -> dict:
    n = rng.randint(3, 5)
    words = sample(rng, WORDS, n + 3 * n)
    links = [words[n + 3 * i:n + 3 * i + 3] for i in range(n)]
    tab = rng.randrange(1, n)
    return {"seed": index, "tabs": [w.title() for w in words[:n]], "links": links, "tab": tab,
            "target": rng.choice(links[tab])}


@cr.environment(tasks=cr.Dataset.procedural(make_task, SIZE), task_type=ClickTabTask,
                sandbox=cr.Browser(), max_turns=5)
class ClickTab(BrowserEnv):
    """Switch to an in-page tab, then click a link shown on it."""

    def site(self, task: ClickTabTask) -> dict[str, str]:
        tabs = "".join(f"<button role='tab' aria-selected='{str(i == 0).lower()}' "
                       f"onclick='show({i})'>{escape(t)}</button>"
                       for i, t in enumerate(task.tabs))
        panels = "".join(
            f"<div role='tabpanel'{'' if i == 0 else ' hidden'}>" + "".join(
                f"<p><a href='#' onclick=\"mark('clicked', '{w}'); return false\">{w}</a></p>"
                for w in words) + "</div>" for i, words in enumerate(task.links))
        body = f"<h1>Sections</h1><div role='tablist'>{tabs}</div>{panels}"
        return {"/": html_page("Tabs", body, TABS_JS)}

    def instruction(self, task: ClickTabTask) -> str:
        return f"Open the tab \"{task.tabs[task.tab]}\" and click the link \"{task.target}\"."

    @cr.reward
    async def clicked(self, page, task: ClickTabTask) -> float:
        return float(await mark_of(page, "clicked") == task.target)

    def solution(self, task: ClickTabTask) -> list[cr.ToolCall]:
        return [cr.ToolCall.of("click", bid=Ref("tab", task.tabs[task.tab])),
                cr.ToolCall.of("click", bid=Ref("link", task.target))]
