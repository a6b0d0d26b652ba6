"""Hover over a menu to reveal its entries, then click one."""

from __future__ import annotations

import random
from html import escape

import corral as cr
from corral.browser import BrowserEnv, Ref, html_page
from corral.envs.browser.common import MARK_JS, SIZE, WORDS, WebTask, mark_of, sample

__all__ = ["HoverReveal", "HoverRevealTask", "STYLE", "make_task"]

STYLE = (".menu{display:inline-block;position:relative;margin-right:24px}"
         ".menu .items{display:none;position:absolute;background:#eee;padding:4px}"
         ".menu:hover .items{display:block}")


class HoverRevealTask(WebTask):
    menus: list[str]
    entries: list[list[str]]
    menu: int
    target: str


def make_task(rng: random.Random, index: int) -> dict:
    words = sample(rng, WORDS, 3 + 9)
    entries = [words[3 + 3 * i:6 + 3 * i] for i in range(3)]
    menu = rng.randrange(3)
    return {"seed": index, "menus": [w.title() for w in words[:3]], "entries": entries,
            "menu": menu, "target": rng.choice(entries[menu])}


@cr.environment(tasks=cr.Dataset.procedural(make_task, SIZE), task_type=HoverRevealTask,
                sandbox=cr.Browser(), max_turns=5)
class HoverReveal(BrowserEnv):
    """Hover over a menu to reveal its entries, then click one."""

    def site(self, task: HoverRevealTask) -> dict[str, str]:
        menus = "".join(
            f"<div class='menu'><button>{escape(m)}</button><div class='items'>" + "".join(
                f"<button onclick=\"mark('picked', '{w}')\">{w}</button>" for w in words) +
            "</div></div>" for m, words in zip(task.menus, task.entries))
        return {"/": html_page("Menus", f"<h1>Menus</h1>{menus}", MARK_JS, STYLE)}

    def instruction(self, task: HoverRevealTask) -> str:
        return (f"In the menu \"{task.menus[task.menu]}\" (its entries show when the mouse is "
                f"over it), click \"{task.target}\".")

    @cr.reward
    async def picked(self, page, task: HoverRevealTask) -> float:
        return float(await mark_of(page, "picked") == task.target)

    def solution(self, task: HoverRevealTask) -> list[cr.ToolCall]:
        return [cr.ToolCall.of("hover", bid=Ref("button", task.menus[task.menu])),
                cr.ToolCall.of("click", bid=Ref("button", task.target))]
