"""The warm pool: which Chromium it runs, and that a pre-made context starts an episode clean."""

from __future__ import annotations

import os

import corral as cr
from corral.agents import play
from corral.browser import BrowserPool, BrowserSandbox, html_page, task_server
from corral.sandbox.browser.chromium import CHROMIUM, HEADLESS_SHELL

from .conftest import descendants, executable

SPEC = cr.Browser(navigation_timeout=60, action_timeout=30)


async def test_host_pool_runs_debians_headless_shell(pool: BrowserPool) -> None:
    # the test command installs chromium-headless-shell: the lighter binary is the one used
    assert CHROMIUM == HEADLESS_SHELL, "install chromium-headless-shell (scripts/dev.sh does)"
    await pool.wait_warm()
    assert HEADLESS_SHELL in {executable(p) for p in descendants(os.getpid())}


async def test_a_warm_context_starts_clean_after_an_episode(pool: BrowserPool) -> None:
    server = task_server()
    first = await BrowserSandbox.create(SPEC, pool=pool)
    site = await first.open_site({"/": html_page("One", "<h1>Episode one</h1>")})
    await first.page.goto(site.url("/"), wait_until="domcontentloaded")
    await first.page.evaluate("() => { document.cookie = 'who=one'; "
                              "localStorage.setItem('who', 'one'); "
                              "sessionStorage.setItem('who', 'one'); }")
    await first.close()

    await pool.wait_warm()
    assert any(slot.warm.get((1280, 720)) for slot in pool._slots)  # the next one is pre-made
    second = await BrowserSandbox.create(SPEC, pool=pool)
    try:
        assert second.page.url == server.blank_url  # it waited on the blank page, warm
        assert second.lease.token != first.lease.token
        mine = await second.open_site({"/": html_page("Two", "<h1>Episode two</h1>")})
        await second.page.goto(mine.url("/"), wait_until="domcontentloaded")
        seen = await second.page.evaluate(
            "() => [document.cookie, localStorage.getItem('who'), sessionStorage.getItem('who'),"
            " document.querySelector('h1').textContent]")
        assert seen == ["", None, None, "Episode two"]
        assert await second.context.cookies() == []
    finally:
        await second.close()


async def test_a_host_pool_reaches_the_task_sites_by_default() -> None:
    """`BrowserPool()` without `warm_url` (as docs/browser.md shows it) waits on the host task
    server's blank page; before, its contexts could not reach the task sites at all."""
    async with BrowserPool(warm_contexts=1) as own:
        assert own.warm_url == task_server().blank_url
        oracle = await play(cr.make("corral/web-click-button-v0", pool=own, sandbox=SPEC),
                            "oracle", seed=0)
    assert oracle.reward == 1.0, oracle
