"""Shared pieces of the built-in web task families: vocabulary, task base, state helpers."""

from __future__ import annotations

import random
from html import escape
from typing import Any, Sequence

import corral as cr
from corral.browser import SiteSession

__all__ = ["CITIES", "FIRST", "LAST", "MARK_JS", "PRODUCTS", "SIZE", "WORDS", "WebTask", "form",
           "mark_of", "person", "sample", "submitted", "text_field"]

WORDS = ("apple", "banana", "cherry", "delta", "echo", "falcon", "garnet", "harbor", "indigo",
         "jasper", "kettle", "lemon", "mango", "nectar", "orbit", "pepper", "quartz", "raven",
         "saffron", "tundra", "umber", "violet", "walnut", "xenon", "yarrow", "zephyr", "amber",
         "basil", "cobalt", "dune", "ember", "fjord", "glacier", "hazel", "iris", "juniper",
         "kiwi", "lotus", "maple", "nova", "olive", "pine", "quill", "river", "sage", "thistle")
FIRST = ("Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea",
         "Mo", "Nia", "Oto", "Pia", "Quin", "Rae", "Sol", "Tess", "Uma", "Vik", "Wen", "Yara")
LAST = ("Adler", "Baker", "Chen", "Diaz", "Evans", "Fischer", "Garcia", "Haas", "Ito", "Jones",
        "Kim", "Lopez", "Moreau", "Novak", "Okafor", "Patel", "Rossi", "Silva", "Tanaka", "Weber")
CITIES = ("Lisbon", "Oslo", "Quito", "Nairobi", "Hanoi", "Lima", "Perth", "Porto", "Riga",
          "Seoul", "Tunis", "Zagreb", "Dakar", "Bergen", "Cusco", "Kyoto")
PRODUCTS = ("Desk Lamp", "Water Bottle", "Notebook", "Backpack", "Headphones", "Coffee Mug",
            "Umbrella", "Sunglasses", "Wall Clock", "Plant Pot", "Yoga Mat", "Phone Stand",
            "Tea Kettle", "Bike Light", "Scarf", "Pencil Case", "Cutting Board", "Desk Fan")
SIZE = 10_000

# A page script helper: remember the first value of `key` on <body data-...> (the episode's
# outcome for single-page tasks; a later, different action cannot overwrite it).
MARK_JS = ("function mark(k, v) { if (!(k in document.body.dataset)) "
           "document.body.dataset[k] = v; }")


class WebTask(cr.Task):
    """A web task: its seed and the generated content."""

    seed: int


def sample(rng: random.Random, pool: Sequence[str], k: int) -> list[str]:
    """`k` distinct items of `pool` in random order."""
    return rng.sample(list(pool), k)


def person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


async def mark_of(page: Any, key: str) -> str | None:
    """The value `mark(key, ...)` stored on the page, or None."""
    if page is None:
        return None
    return await page.evaluate("k => document.body ? (document.body.dataset[k] ?? null) : null",
                               key)


def submitted(site: SiteSession | None, path: str) -> dict[str, Any] | None:
    """The form fields of the latest submission to `path`, or None."""
    if site is None:
        return None
    last = site.last(path)
    return last["form"] if last else None


def text_field(label: str, name: str, kind: str = "text", value: str = "",
               extra: str = "") -> str:
    """A labelled input (the label is its accessible name)."""
    val = f" value=\"{escape(value)}\"" if value else ""
    return (f"<p><label>{escape(label)} <input type=\"{kind}\" name=\"{name}\"{val} {extra}>"
            "</label></p>")


def form(inner: str, action: str = "/submit", button: str = "Submit") -> str:
    """A POST form ending in a submit button."""
    return (f"<form method=\"post\" action=\"{action}\">{inner}"
            f"<button type=\"submit\">{escape(button)}</button></form>")
