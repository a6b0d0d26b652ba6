"""`Ref`: an element named for an oracle by role and accessible name, or by CSS selector,
resolved to a bid when the action is played.

Oracles cannot know bids before the page is observed, so their `ToolCall`s name elements:

    Ref("button", "Submit")            # the first button named Submit (exact, else contained)
    Ref("button", "OK", nth=1)         # the second of several buttons named OK
    Ref("textbox", nth=2)              # the third text field
    Ref(css="#username")               # the first element the CSS selector matches
    Ref(css="#area .alink", name="x")  # ... whose text is "x" (exact, else contained)

Role-and-name refs are looked up in the latest observation; CSS refs in the page itself, and an
element they find that the observation left out (a `<span>` with a click handler) gets a bid
then. A `Ref` is a `str` so actions stay JSON-able: its text (`@button:Submit`, or a JSON object
after the `@` when it has `nth` or `css`) is read back as the Ref where a bid is expected (an
oracle's actions sent over the env server's protocol).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["RESOLVE_CSS_JS", "Ref"]


class Ref(str):
    """An element by role and accessible name (the `nth` match, from 0) or by CSS selector."""

    role: str | None
    name: str | None
    nth: int
    css: str | None

    def __new__(cls, role: str | None = None, name: str | None = None, *, nth: int = 0,
                css: str | None = None) -> "Ref":
        if nth < 0:
            raise ValueError(f"Ref nth must be 0 or more, got {nth}")
        if css is not None and role is not None:
            raise ValueError("a Ref names an element by role or by CSS selector, not both")
        if nth == 0 and css is None:
            text = f"@{role or '*'}:{name or ''}"
        else:
            fields = {"role": role, "name": name, "nth": nth, "css": css}
            text = "@" + json.dumps({k: v for k, v in fields.items() if v not in (None, 0)},
                                    separators=(",", ":"))
        obj = super().__new__(cls, text)
        obj.role, obj.name, obj.nth, obj.css = role, name, nth, css
        return obj

    @classmethod
    def of(cls, value: Any) -> "Ref | None":
        """`value` as a Ref: a Ref, or a Ref's text (`@button:Submit`, `@{"css":"#id"}`);
        else None (a bid is never `@...`)."""
        if isinstance(value, Ref):
            return value
        if not isinstance(value, str) or not value.startswith("@"):
            return None
        if value.startswith("@{"):
            try:
                fields = json.loads(value[1:])
                return cls(fields.get("role"), fields.get("name"), nth=int(fields.get("nth", 0)),
                           css=fields.get("css"))
            except (ValueError, TypeError, AttributeError):
                return None
        if ":" in value:
            role, _, name = value[1:].partition(":")
            return cls(None if role == "*" else role or None, name or None)
        return None

    def describe(self) -> str:
        """The Ref in words, for errors: `the CSS selector '#a' named 'x' (match #2)`."""
        what = f"the CSS selector {self.css!r}" if self.css else f"role {self.role or 'any'}"
        named = f" named {self.name!r}" if self.name is not None else ""
        return f"{what}{named}" + (f" (match #{self.nth})" if self.nth else "")


# The `nth` element matching a CSS selector (and, with a name, whose text is it: exact, else
# contained), given a bid if the walker left it out. Returns {bid, next} or {count} / {error}.
RESOLVE_CSS_JS = r"""
([css, name, nth, start]) => {
  let found;
  try { found = Array.from(document.querySelectorAll(css)); }
  catch (e) { return {error: 'is not a valid CSS selector (' + e.message + ')'}; }
  if (name !== null) {
    const norm = s => (s || '').replace(/\s+/g, ' ').trim();
    const text = el => norm(el.getAttribute('aria-label') || el.textContent || el.value);
    const exact = found.filter(el => text(el) === norm(name));
    found = exact.length > nth ? exact : found.filter(el => text(el).includes(norm(name)));
  }
  const el = found[nth];
  if (!el) return {count: found.length};
  let bid = el.getAttribute('data-corral-bid');
  let next = Math.max(window.__corralNext || 0, start);
  if (!bid) { bid = 'a' + (next++); el.setAttribute('data-corral-bid', bid); }
  window.__corralNext = next;
  return {bid, next};
}
"""
