"""Scroll a list that loads more entries as it is scrolled, until an entry appears; pick it."""

from __future__ import annotations

import json
import random

import corral as cr
from corral.browser import BrowserEnv, Ref, html_page
from corral.envs.browser.common import MARK_JS, SIZE, WORDS, WebTask, mark_of

__all__ = ["BATCH", "FEED_JS", "ScrollFind", "ScrollFindTask", "make_task"]

BATCH = 20
FEED_JS = MARK_JS + """
let shown = 0;
function more() {
  const list = document.getElementById('feed');
  for (const name of ENTRIES.slice(shown, shown + %d)) {
    const b = document.createElement('button');
    b.textContent = name;
    b.onclick = () => mark('picked', name);
    const li = document.createElement('li'); li.appendChild(b); list.appendChild(li);
  }
  shown += %d;
}
more();
window.addEventListener('scroll', () => {
  if (window.scrollY + window.innerHeight >= document.documentElement.scrollHeight - 100) more();
});"""


class ScrollFindTask(WebTask):
    entries: list[str]
    target: int


def make_task(rng: random.Random, index: int) -> dict:
    entries = [f"{rng.choice(WORDS)} {i:03d}" for i in range(120)]
    return {"seed": index, "entries": entries, "target": rng.randrange(BATCH * 2, 110)}


@cr.environment(tasks=cr.Dataset.procedural(make_task, SIZE), task_type=ScrollFindTask,
                sandbox=cr.Browser(), max_turns=10)
class ScrollFind(BrowserEnv):
    """Scroll a list that loads more entries as it is scrolled, until an entry appears."""

    def site(self, task: ScrollFindTask) -> dict[str, str]:
        script = f"const ENTRIES = {json.dumps(task.entries)};" + FEED_JS % (BATCH, BATCH)
        return {"/": html_page("Feed", "<h1>Feed</h1><ul id='feed'></ul>", script,
                               "li{height:40px}")}

    def instruction(self, task: ScrollFindTask) -> str:
        return (f"Click the entry \"{task.entries[task.target]}\". The list loads more entries "
                "when you scroll to its end.")

    @cr.reward
    async def picked(self, page, task: ScrollFindTask) -> float:
        return float(await mark_of(page, "picked") == task.entries[task.target])

    def solution(self, task: ScrollFindTask) -> list[cr.ToolCall]:
        scrolls = task.target // BATCH
        return [*[cr.ToolCall.of("scroll", dx=0, dy=100_000)] * scrolls,
                cr.ToolCall.of("click", bid=Ref("button", task.entries[task.target]))]
