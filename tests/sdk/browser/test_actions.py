"""Observations and actions in real Chromium: bids, states, and errors that name their cause."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import corral as cr
from corral.agents import play
from corral.browser import BrowserSandbox
from corral.errors import BrowserError
from playwright.async_api import Error as PlaywrightError

from .conftest import AWKWARD_ENV, elements


async def act(env: Any, name: str, **arguments: Any) -> str:
    observation, *_ = await env.astep(cr.ToolCall(name=name, arguments=arguments))
    return observation


async def test_observation_lists_roles_names_values_and_states(awkward: Any) -> None:
    obs = awkward.last_observation
    rows = {n.name: n for n in obs.nodes if n.bid}
    assert rows["Go"].role == "button" and rows["Off"].states == "disabled"
    assert rows["Fixed"].role == "textbox" and rows["Fixed"].value == "x"
    assert "readonly" in rows["Fixed"].states
    assert rows["Fruit"].role == "combobox" and rows["Fruit"].value == "Apple"
    assert rows["Agree"].role == "checkbox" and rows["Agree"].states == "unchecked"
    assert rows["Two"].role == "link"
    text = obs.render()
    assert f"[{rows['Go'].bid}] button 'Go'" in text and "Tab 0 (active): 'Awkward'" in text
    assert "Awkward page" in obs.text
    # bids are stable: observing again gives every element the same id
    again = await awkward.episode.sandbox.observe()
    assert {n.name: n.bid for n in again.nodes if n.bid} == {n.name: n.bid for n in obs.nodes
                                                              if n.bid}


async def test_missing_stale_hidden_disabled_and_covered_bids_say_so(awkward: Any) -> None:
    bids = elements(awkward)
    assert "is missing" in await act(awkward, "click", bid="a999")
    assert "not an element id" in await act(awkward, "click", bid="button")
    assert "is disabled" in await act(awkward, "click", bid=bids["Off"])
    assert "covered by another element (div#cover" in await act(awkward, "click",
                                                                 bid=bids["Under"])
    await act(awkward, "click", bid=bids["Vanish"])
    stale = await act(awkward, "click", bid=bids["Vanish"])
    assert "is stale" in stale and f"Last action error: element {bids['Vanish']} is stale" in stale
    await act(awkward, "click", bid=bids["Hide box"])
    assert "is hidden" in await act(awkward, "click", bid=bids["Hidden soon"])
    assert "is read-only" in await act(awkward, "fill", bid=bids["Fixed"], text="y")
    assert "is not a text field" in await act(awkward, "fill", bid=bids["Go"], text="y")
    wrong = await act(awkward, "select", bid=bids["Fruit"], option="Kiwi")
    assert "has no option 'Kiwi'; options: 'Apple', 'Pear'" in wrong
    assert "cannot press 'NoSuchKey'" in await act(awkward, "press", key="NoSuchKey")
    assert "there is no tab 3" in await act(awkward, "tab_focus", index=3)
    # a good action afterwards clears the error and works
    ok = await act(awkward, "click", bid=bids["Go"])
    assert ok.startswith("clicked") and "Last action error" not in ok


async def test_fill_select_check_update_the_page(awkward: Any) -> None:
    bids = elements(awkward)
    await act(awkward, "fill", bid=bids["Name"], text="Ada")
    await act(awkward, "select", bid=bids["Fruit"], option="Pear")
    out = await act(awkward, "check", bid=bids["Agree"])
    rows = {n.name: n for n in awkward.last_observation.nodes if n.bid}
    assert rows["Name"].value == "Ada" and rows["Fruit"].value == "Pear"
    assert "checked" in rows["Agree"].states.split(), out
    await act(awkward, "check", bid=bids["Agree"], checked=False)
    rows = {n.name: n for n in awkward.last_observation.nodes if n.bid}
    assert "unchecked" in rows["Agree"].states.split()


async def test_navigation_outside_the_task_origin_is_blocked_and_reported(awkward: Any) -> None:
    bids = elements(awkward)
    sandbox: BrowserSandbox = awkward.episode.sandbox
    out = await act(awkward, "click", bid=bids["External"])
    assert "Last action error: navigation to http://example.com/ was blocked" in out
    assert sandbox.blocked == ["http://example.com/"]
    assert sandbox.page.url.startswith(sandbox.sites[0].origin)
    for url in ("http://example.org/x", "file:///etc/passwd", "http://127.0.0.1:9/"):
        assert f"navigation to {url} is blocked" in await act(awkward, "goto", url=url)
    page_fetch = await sandbox.page.evaluate(
        "() => fetch('http://example.net/').then(() => 'loaded', () => 'refused')")
    assert page_fetch == "refused" and "http://example.net/" in sandbox.blocked


async def test_bids_stay_unique_across_pages_and_old_ones_are_stale(awkward: Any) -> None:
    first = elements(awkward)
    out = await act(awkward, "click", bid=first["Two"])
    assert "'Two'" in out and "Second page" in out
    second = elements(awkward)
    assert min(int(b[1:]) for b in second.values()) > max(int(b[1:]) for b in first.values())
    assert "is stale" in await act(awkward, "click", bid=first["Go"])
    back = await act(awkward, "go_back")
    assert back.startswith("went back") and "Awkward page" in awkward.last_observation.text


async def test_goto_a_path_opens_it_on_the_task_site(awkward: Any) -> None:
    """docs/browser.md: absolute paths (`/cart`) work; `goto("/two")` was blocked as "origin
    :// is not allowed"."""
    out = await act(awkward, "goto", url="/two")
    assert "Last action error" not in out and "Second page" in out, out
    sandbox: BrowserSandbox = awkward.episode.sandbox
    assert sandbox.page.url == sandbox.sites[0].origin + "/two"


async def test_go_back_on_the_start_page_has_no_previous_page(awkward: Any) -> None:
    # the warm page waited on the task server's blank page: that entry is not the episode's
    out = await act(awkward, "go_back")
    assert "Last action error: there is no previous page in this tab's history" in out
    assert "Awkward page" in awkward.last_observation.text


async def test_action_strings_and_screenshots(pool: Any) -> None:
    env = AWKWARD_ENV(pool=pool, sandbox=cr.Browser(screenshot=True))
    try:
        _, info = await env.areset(seed=0)
        assert info["observation"]["screenshot"][:8] == b"\x89PNG\r\n\x1a\n"
        bids = elements(env)
        text = f'Let me do it.\n```\nfill("{bids["Name"]}", "Bo")\nclick("{bids["Go"]}")\n```'
        observation, _, _, _, info = await env.astep(text)
        assert "filled" in observation and "clicked" in observation
        assert info["observation"]["screenshot"][:4] == b"\x89PNG"
        *_, info = await env.astep("done")
        assert info["rewards"] == {"clicked": 1.0}
        messages = [m for m in env.episode.messages if m["role"] == "tool"]
        assert [m["name"] for m in messages] == ["fill", "click"]
    finally:
        await env.aclose()


async def test_page_crash_ends_the_episode_as_infrastructure_error(pool: Any) -> None:
    env = AWKWARD_ENV(pool=pool)
    await env.areset(seed=0)
    sandbox: BrowserSandbox = env.episode.sandbox
    cdp = await sandbox.context.new_cdp_session(sandbox.page)
    crashed = sandbox.page.wait_for_event("crash", timeout=20_000)
    sent = asyncio.ensure_future(cdp.send("Page.crash"))  # never answered: the renderer is gone
    await crashed
    sent.cancel()
    with pytest.raises(BrowserError, match="crashed"):
        await env.astep(cr.ToolCall.of("scroll", dx=0, dy=1))
    assert env.episode.infra_error and "BrowserError" in env.episode.infra_error
    await env.aclose()
    result = await play(AWKWARD_ENV(pool=pool), "noop")  # the pool still serves episodes
    assert result.infra_error is None and result.turns == 1


async def test_browser_crash_is_replaced_by_the_pool() -> None:
    from corral.browser import BrowserPool, task_server

    own = await BrowserPool(warm_contexts=0, warm_url=task_server().blank_url).start()
    try:
        env = AWKWARD_ENV(pool=own)
        await env.areset(seed=0)
        cdp = await own._slots[0].browser.new_browser_cdp_session()
        with pytest.raises(PlaywrightError):  # the browser dies before it can answer
            await cdp.send("Browser.crash")
        with pytest.raises(BrowserError, match="browser process went away"):
            await env.astep(cr.ToolCall.of("scroll", dx=0, dy=1))
        await env.aclose()
        result = await play(AWKWARD_ENV(pool=own), "noop")
        assert result.infra_error is None and result.reward == 0.0
        assert (own.launches, own.replaced, own.browsers) == (2, 1, 1)
    finally:
        await own.close()
