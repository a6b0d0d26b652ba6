"""BrowserGym-style action strings are parsed with ast, never evaluated."""

from __future__ import annotations

from corral.browser import BrowserEnv
from corral.browser.actions import looks_like_actions, parse_actions
from corral.toolcalls import ToolCallParseError
from corral.tools import collect
from corral.types import ToolCall

TOOLS, _ = collect(BrowserEnv)


def calls(text: str) -> list:
    return parse_actions(text, TOOLS)


def test_positional_and_keyword_arguments_map_to_tool_parameters() -> None:
    assert calls('click("a12")') == [ToolCall(name="click", arguments={"bid": "a12"})]
    assert calls("fill('a3', \"hello, world\")") == [
        ToolCall(name="fill", arguments={"bid": "a3", "text": "hello, world"})]
    assert calls("scroll(0, -300.5)") == [
        ToolCall(name="scroll", arguments={"dx": 0, "dy": -300.5})]
    assert calls('check("a4", checked=False)') == [
        ToolCall(name="check", arguments={"bid": "a4", "checked": False})]
    assert calls("go_back()") == [ToolCall(name="go_back", arguments={})]


def test_several_lines_and_fenced_blocks() -> None:
    text = 'I will log in.\n```python\nfill("a1", "ada")\nclick("a2")\n```\n'
    assert looks_like_actions(text, TOOLS)
    assert [c.name for c in calls(text)] == ["fill", "click"]


def test_browsergym_names_are_mapped() -> None:
    assert calls('select_option("a5", "Oslo")') == [
        ToolCall(name="select", arguments={"bid": "a5", "option": "Oslo"})]
    assert calls('keyboard_press("Control+k")') == [
        ToolCall(name="press", arguments={"key": "Control+k"})]
    assert calls('press("a7", "Enter")') == [
        ToolCall(name="press", arguments={"bid": "a7", "key": "Enter"})]
    assert calls('uncheck("a3")') == [
        ToolCall(name="check", arguments={"bid": "a3", "checked": False})]


def test_code_is_never_run() -> None:
    for text in ('click(__import__("os").system("touch /tmp/pwned"))', "click(open('/etc/passwd'))",
                 'click("a1" + "2")', "click(x)"):
        (result,) = calls(text)
        assert isinstance(result, ToolCallParseError)
        assert "literals" in result.reason


def test_bad_calls_explain_themselves() -> None:
    (unknown,) = calls('teleport("a1")')
    assert isinstance(unknown, ToolCallParseError) and "unknown action 'teleport'" in unknown.reason
    (many,) = calls('click("a1", "a2")')
    assert isinstance(many, ToolCallParseError) and "at most 1 positional" in many.reason
    (syntax,) = calls('click("a1"')
    assert isinstance(syntax, ToolCallParseError) and "not a valid action call" in syntax.reason
    (stmt,) = calls("x = 1")
    assert isinstance(stmt, ToolCallParseError)
    assert not looks_like_actions("I think the answer is 42.", TOOLS)
    assert not looks_like_actions("print('hi')", TOOLS)
