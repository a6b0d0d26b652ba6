"""Search a catalogue for an item, then open the item's page from the results."""

from __future__ import annotations

import random
import re
from html import escape
from urllib.parse import urlsplit

import corral as cr
from corral.browser import BrowserEnv, Ref, Request, html_page
from corral.envs.browser.common import PRODUCTS, SIZE, WORDS, WebTask

__all__ = ["SEARCH_FORM", "Search", "SearchTask", "make_task", "slug"]

SEARCH_FORM = ("<form method='get' action='/search' role='search'><input type='search' name='q' "
               "aria-label='Search'> <button type='submit'>Search</button></form>")


class SearchTask(WebTask):
    items: list[str]
    target: str


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def make_task(rng: random.Random, index: int) -> dict:
    items = sorted({f"{rng.choice(WORDS).title()} {rng.choice(PRODUCTS)}" for _ in range(24)})
    return {"seed": index, "items": items, "target": rng.choice(items)}


@cr.environment(tasks=cr.Dataset.procedural(make_task, SIZE), task_type=SearchTask,
                sandbox=cr.Browser(), max_turns=6)
class Search(BrowserEnv):
    """Search a catalogue for an item, then open the item's page from the results."""

    def site(self, task: SearchTask) -> dict:
        def results(request: Request) -> str:
            query = request.arg("q").strip().lower()
            hits = [i for i in task.items if query and query in i.lower()]
            rows = "".join(f"<li><a href='/item/{slug(i)}'>{escape(i)}</a></li>" for i in hits)
            body = (SEARCH_FORM + f"<h1>Results for {escape(query)!s}</h1>" +
                    (f"<ul>{rows}</ul>" if hits else "<p>No results.</p>"))
            return html_page("Search results", body)

        pages: dict = {"/": html_page("Catalogue", "<h1>Catalogue</h1>" + SEARCH_FORM),
                       "/search": results}
        for item in task.items:
            pages[f"/item/{slug(item)}"] = html_page(item, f"<h1>{escape(item)}</h1>"
                                                     "<p>In stock.</p>")
        return pages

    def instruction(self, task: SearchTask) -> str:
        return f"Find \"{task.target}\" with the search box and open its page."

    @cr.reward
    def opened(self, page, task: SearchTask) -> float:
        return float(page is not None and urlsplit(page.url).path == f"/item/{slug(task.target)}")

    def solution(self, task: SearchTask) -> list[cr.ToolCall]:
        return [cr.ToolCall.of("fill", bid=Ref("searchbox", "Search"), text=task.target),
                cr.ToolCall.of("click", bid=Ref("button", "Search")),
                cr.ToolCall.of("click", bid=Ref("link", task.target))]
