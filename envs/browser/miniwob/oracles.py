"""Oracles for common MiniWoB++ tasks: the actions that solve a task, from its utterance.

Each oracle reads what it needs from the page's utterance (`core.getUtterance()`) and names
elements by role and name, or by CSS selector where the page gives a control no accessible
name (`Ref(css="#username")`); the env resolves them to bids when the actions are played.
Tasks without an oracle are validated without one ("solvability unchecked (no oracle)").
"""

from __future__ import annotations

import re
from typing import Callable

import corral as cr
from corral.browser import Ref

__all__ = ["ORACLES", "Oracle", "choose_list", "click", "click_button", "click_checkboxes",
           "click_dialog_2", "click_link", "click_option", "click_tab", "enter_password",
           "enter_text", "fill", "focus_text_2", "login_user"]

Oracle = Callable[[str], list[cr.ToolCall]]


def _quoted(utterance: str) -> list[str]:
    return re.findall(r'"([^"]*)"', utterance)


def click(ref: Ref) -> cr.ToolCall:
    return cr.ToolCall.of("click", bid=ref)


def fill(ref: Ref, text: str) -> cr.ToolCall:
    return cr.ToolCall.of("fill", bid=ref, text=text)


def click_button(utterance: str) -> list[cr.ToolCall]:
    """Click on the "ok" button."""
    return [click(Ref("button", _quoted(utterance)[0]))]


def click_link(utterance: str) -> list[cr.ToolCall]:
    """Click on the link "elit"."""
    return [click(Ref(css="#area .alink", name=_quoted(utterance)[0]))]


def enter_text(utterance: str) -> list[cr.ToolCall]:
    """Enter "Kasey" into the text field and press Submit."""
    return [fill(Ref(css="#tt"), _quoted(utterance)[0]), click(Ref("button", "Submit"))]


def focus_text_2(utterance: str) -> list[cr.ToolCall]:
    """Focus into the 2nd input textbox."""
    nth = ["1st", "2nd", "3rd"].index(re.search(r"(\d(?:st|nd|rd))", utterance).group(1))
    return [click(Ref("textbox", nth=nth))]


def click_checkboxes(utterance: str) -> list[cr.ToolCall]:
    """Select ko, ZgsH and click Submit. (or: Select nothing and click Submit.)"""
    names = re.match(r"Select (.*) and click Submit\.", utterance).group(1)
    picks = [] if names == "nothing" else names.split(", ")
    return [*(cr.ToolCall.of("check", bid=Ref("checkbox", name)) for name in picks),
            click(Ref("button", "Submit"))]


def click_option(utterance: str) -> list[cr.ToolCall]:
    """Select Vx and click Submit."""
    name = re.match(r"Select (.*) and click Submit\.", utterance).group(1)
    return [cr.ToolCall.of("check", bid=Ref("radio", name)), click(Ref("button", "Submit"))]


def choose_list(utterance: str) -> list[cr.ToolCall]:
    """Select Kiribati from the list and click Submit."""
    item = re.match(r"Select (.*) from the list and click Submit\.", utterance).group(1)
    return [cr.ToolCall.of("select", bid=Ref(css="#options"), option=item),
            click(Ref("button", "Submit"))]


def click_dialog_2(utterance: str) -> list[cr.ToolCall]:
    """Click the button in the dialog box labeled "OK"."""
    label = _quoted(utterance)[0]
    return [click(Ref(css=".ui-dialog-titlebar-close") if label == "x" else Ref("button", label))]


def login_user(utterance: str) -> list[cr.ToolCall]:
    """Enter the username "kanesha" and the password "Eo" into the text fields and press login."""
    user, password = _quoted(utterance)[:2]
    return [fill(Ref(css="#username"), user), fill(Ref(css="#password"), password),
            click(Ref("button", "Login"))]


def enter_password(utterance: str) -> list[cr.ToolCall]:
    """Enter the password "Hw" into both text fields and press submit."""
    password = _quoted(utterance)[0]
    return [fill(Ref(css="#password"), password), fill(Ref(css="#verify"), password),
            click(Ref("button", "Submit"))]


def click_tab(utterance: str) -> list[cr.ToolCall]:
    """Click on Tab #2."""
    return [click(Ref("tab", re.search(r"Tab #\d", utterance).group(0)))]


ORACLES: dict[str, Oracle] = {
    "click-test": lambda u: [click(Ref("button", "Click Me!"))],
    "click-test-2": lambda u: [click(Ref("button", "ONE"))],
    "click-button": click_button,
    "click-link": click_link,
    "enter-text": enter_text,
    "focus-text": lambda u: [click(Ref(css="#tt"))],
    "focus-text-2": focus_text_2,
    "click-checkboxes": click_checkboxes,
    "click-option": click_option,
    "choose-list": choose_list,
    "click-dialog": lambda u: [click(Ref(css=".ui-dialog-titlebar-close"))],
    "click-dialog-2": click_dialog_2,
    "login-user": login_user,
    "enter-password": enter_password,
    "click-tab": click_tab,
}
