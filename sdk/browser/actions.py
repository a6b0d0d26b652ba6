"""Browser actions on bids, with errors that say what went wrong, and the action-string parser.

Each action is one small script in the page (`observe.ACT_JS`) that finds the element and
checks it (present? shown? enabled? editable? covered by something else?), followed for
pointer actions by real mouse input at the element's centre. So a bad bid fails at once with a
reason (missing: never shown; stale: shown earlier, gone now; hidden; disabled; covered by
another element) instead of a bare timeout, and nothing waits on Playwright's 30 s defaults.
A failure raises `ActionError` (an `AgentError`: shown to the agent, recorded as the last
action error); a crashed page or browser raises `BrowserError` (an infrastructure error).
Every call into the page goes through `BrowserSandbox.call` (`action_timeout`; navigations
under Playwright's `navigation_timeout`): a page that does not answer raises `PageUnresponsive`.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Mapping
from urllib.parse import urljoin

from playwright.async_api import Error as PlaywrightError

from ..errors import AgentError, BrowserError
from ..tools import ToolSpec
from ..toolcalls import ToolCallParseError
from ..types import ToolCall
from ..sandbox.browser.observe import ACT_JS, BID_PATTERN
from ..sandbox.browser.sandbox import BrowserSandbox, origin_of
from ..sandbox.browser.site import BLANK_PATH

__all__ = ["ALIASES", "ActionError", "CAN_GO_BACK_JS", "check", "click", "fill", "go_back", "goto",
           "hover", "looks_like_actions", "parse_actions", "press", "require_browser", "scroll",
           "select", "tab_focus"]


class ActionError(AgentError):
    """A browser action could not be done; the message names the element and the reason."""


def _reason(bid: str, info: dict[str, Any], sb: BrowserSandbox) -> str:
    """Why the element cannot take the action, in words."""
    state = info["state"]
    what = f"element {bid} ({info.get('tag', '?')}{' ' + info['type'] if info.get('type') else ''})"
    if state == "missing":
        if bid in sb.issued:
            return (f"element {bid} is stale: it was on the page earlier but is gone now (the page "
                    "changed); use a bid from the latest observation")
        return (f"element {bid} is missing: no element on this page has that bid; use a bid from "
                "the latest observation")
    reasons = {
        "hidden": "is hidden: it is not displayed, so it cannot be used until something reveals it",
        "disabled": "is disabled",
        "not-editable": "is not a text field; use click, check or select for it",
        "readonly": "is read-only",
        "bad-value": "did not accept that text (date fields take YYYY-MM-DD, number fields digits)",
        "not-select": "is not a dropdown (<select>)",
        "not-checkable": "is not a checkbox or radio button",
        "radio-uncheck": "is a radio button: it cannot be unticked, choose another option instead",
        "offscreen": "is outside the page and cannot be scrolled into view",
        "covered": f"is covered by another element ({info.get('by')}) and cannot be clicked",
    }
    if state == "no-option":
        labels = ", ".join(repr(o) for o in info.get("options", []))
        return f"element {bid} has no option {info.get('missing')!r}; options: {labels}"
    return f"{what} {reasons.get(state, state)}"


async def _act(sb: BrowserSandbox, bid: str, op: str, arg: Any = None) -> dict[str, Any]:
    """Run `op` on the element (`ACT_JS`); returns its answer or raises ActionError."""
    bid = str(bid).strip()
    if not BID_PATTERN.match(bid):
        raise ActionError(f"'{bid}' is not an element id: bids look like 'a12' and are shown in "
                          "brackets in the observation")
    try:
        info = await sb.call(sb.page.evaluate(ACT_JS, [bid, op, arg]), f"{op} on {bid}")
    except PlaywrightError as exc:
        sb.check()
        raise ActionError(f"could not reach element {bid}: the page was changing "
                          f"({_first_line(exc)}); observe again and retry") from None
    if info["state"] not in ("done", "point"):
        raise ActionError(_reason(bid, info, sb))
    return info


async def _pointer(sb: BrowserSandbox, info: dict[str, Any], click: bool) -> None:
    if info["state"] != "point":
        return
    mouse = sb.page.mouse
    try:
        if click:
            await sb.call(mouse.click(info["x"], info["y"]), "a mouse click")
        else:
            await sb.call(mouse.move(info["x"], info["y"]), "a mouse move")
    except PlaywrightError as exc:
        sb.check()
        raise ActionError(f"the mouse action failed: {_first_line(exc)}") from None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


async def click(sb: BrowserSandbox, bid: str) -> str:
    await _pointer(sb, await _act(sb, bid, "click"), click=True)
    return f"clicked {bid}"


async def fill(sb: BrowserSandbox, bid: str, text: str) -> str:
    await _act(sb, bid, "fill", text)
    return f"filled {bid}"


async def select(sb: BrowserSandbox, bid: str, option: str | list[str]) -> str:
    await _act(sb, bid, "select", option)
    return f"selected {option!r} in {bid}"


async def check(sb: BrowserSandbox, bid: str, checked: bool = True) -> str:
    await _pointer(sb, await _act(sb, bid, "check", checked), click=True)
    return f"{'checked' if checked else 'unchecked'} {bid}"


async def hover(sb: BrowserSandbox, bid: str) -> str:
    await _pointer(sb, await _act(sb, bid, "hover"), click=False)
    return f"hovering over {bid}"


async def press(sb: BrowserSandbox, key: str, bid: str | None = None) -> str:
    if bid:
        await _act(sb, bid, "focus")
    try:
        await sb.call(sb.page.keyboard.press(key), f"pressing {key!r}")
    except PlaywrightError as exc:
        sb.check()
        raise ActionError(f"cannot press {key!r}: {_first_line(exc)} (keys look like 'Enter', "
                          "'a', 'Control+k', 'Shift+Tab')") from None
    return f"pressed {key}" + (f" on {bid}" if bid else "")


async def scroll(sb: BrowserSandbox, dx: float, dy: float) -> str:
    try:
        await sb.call(sb.page.evaluate("([x, y]) => window.scrollBy(x, y)", [dx, dy]),
                      "scrolling")
    except PlaywrightError as exc:
        sb.check()
        raise ActionError(f"scroll failed: {_first_line(exc)}") from None
    return f"scrolled by ({dx:g}, {dy:g})"


async def goto(sb: BrowserSandbox, url: str) -> str:
    if "://" not in url and not url.startswith(("about:", "data:", "blob:")):
        url = urljoin(sb.page.url, url)  # a path (`/cart`), as a link's href is read
    if not sb.allows(url):
        allowed = ", ".join(sorted(sb.allowed)) or "none"
        sb.blocked.append(url)
        raise ActionError(f"navigation to {url} is blocked: origin {origin_of(url)} is not "
                          f"allowed in this task (allowed: {allowed})")
    try:
        await sb.page.goto(url, wait_until="domcontentloaded",
                           timeout=sb.spec.navigation_timeout * 1000)
    except PlaywrightError as exc:
        sb.check()
        raise ActionError(f"could not open {url}: {_first_line(exc)}") from None
    return f"opened {url}"


# Whether the tab can go back to a page of the episode: a warm pooled page waited on the task
# server's blank page before the episode's start page, and that entry is not the episode's.
CAN_GO_BACK_JS = f"""() => {{
  const nav = window.navigation;
  if (!nav) return history.length > 1;
  if (!nav.canGoBack) return false;
  const i = nav.currentEntry.index;  // among this origin's adjacent entries
  return i < 1 || new URL(nav.entries()[i - 1].url).pathname !== {BLANK_PATH!r};
}}"""


async def go_back(sb: BrowserSandbox) -> str:
    page = sb.page
    if not await sb.call(page.evaluate(CAN_GO_BACK_JS), "a history check"):
        raise ActionError("there is no previous page in this tab's history")
    try:
        await page.go_back(wait_until="domcontentloaded",
                           timeout=sb.spec.navigation_timeout * 1000)
    except PlaywrightError as exc:
        sb.check()
        raise ActionError(f"go_back failed: {_first_line(exc)}") from None
    return f"went back to {page.url}"


async def tab_focus(sb: BrowserSandbox, index: int) -> str:
    if not 0 <= index < len(sb.pages):
        raise ActionError(f"there is no tab {index}; open tabs are 0..{len(sb.pages) - 1}")
    page = await sb.focus(index)
    return f"switched to tab {index} ({page.url})"


# --- BrowserGym-style action strings ------------------------------------------------------------
# BrowserGym names that differ from Corral's tools, and how their positional arguments map.
ALIASES: dict[str, tuple[str, tuple[str, ...], dict[str, Any]]] = {
    "select_option": ("select", ("bid", "option"), {}),
    "keyboard_press": ("press", ("key",), {}),
    "uncheck": ("check", ("bid",), {"checked": False}),
}
_CALL_START = re.compile(r"^\s*([A-Za-z_]\w*)\s*\(")
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)


def looks_like_actions(text: str, tools: Mapping[str, ToolSpec]) -> bool:
    """Whether `text` (or a fenced block in it) starts with a call of a known action."""
    body = _action_body(text)
    match = _CALL_START.match(body)
    return bool(match and (match.group(1) in tools or match.group(1) in ALIASES))


def _action_body(text: str) -> str:
    fenced = _FENCE.search(text)
    return (fenced.group(1) if fenced else text).strip()


def parse_actions(text: str, tools: Mapping[str, ToolSpec]
                  ) -> list[ToolCall | ToolCallParseError]:
    """BrowserGym-style calls, one per line (`click("a12")`, `fill('a3', "hi")`), as ToolCalls.

    Safe: the text is parsed with `ast`, never evaluated; each argument must be a literal
    (`ast.literal_eval`). Positional arguments map to the tool's parameters in order. Unknown
    names and non-literal arguments come back as `ToolCallParseError`s.
    """
    body = _action_body(text)
    try:
        tree = ast.parse(body, mode="exec")
    except SyntaxError as exc:
        return [ToolCallParseError(body, f"not a valid action call: {exc.msg}")]
    calls: list[ToolCall | ToolCallParseError] = []
    for stmt in tree.body:
        source = ast.get_source_segment(body, stmt) or ""
        if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                and isinstance(stmt.value.func, ast.Name)):
            calls.append(ToolCallParseError(source, "each line must be one call like "
                                                    "click(\"a12\")"))
            continue
        calls.append(_one_call(stmt.value, source, tools))
    return calls


def _one_call(node: ast.Call, source: str, tools: Mapping[str, ToolSpec]
              ) -> ToolCall | ToolCallParseError:
    name = node.func.id  # type: ignore[attr-defined]
    try:
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    except (ValueError, SyntaxError, TypeError):
        return ToolCallParseError(source, "arguments must be literals (strings, numbers, "
                                          "True/False, lists)")
    if len(kwargs) != len(node.keywords):
        return ToolCallParseError(source, "**kwargs are not allowed")
    extra: dict[str, Any] = {}
    if name in ALIASES:
        name, params, extra = ALIASES[name]
    elif name == "press" and len(args) == 2:  # BrowserGym's press(bid, key_comb)
        params = ("bid", "key")
    elif name in tools:
        params = tuple(tools[name].args_model.model_fields)
    else:
        known = ", ".join(sorted(tools))
        return ToolCallParseError(source, f"unknown action '{name}'; actions: {known}")
    if len(args) > len(params):
        return ToolCallParseError(source, f"{name} takes at most {len(params)} positional "
                                          f"arguments ({', '.join(params)})")
    arguments = {**dict(zip(params, args)), **extra, **kwargs}
    return ToolCall(name=name, arguments=arguments)


def require_browser(sandbox: Any) -> BrowserSandbox:
    """The episode's sandbox as a BrowserSandbox (raises BrowserError when there is none)."""
    if not isinstance(sandbox, BrowserSandbox):
        raise BrowserError("this episode has no browser sandbox; call reset() first")
    return sandbox
