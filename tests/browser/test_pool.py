"""The warm pool: which Chromium it runs, and that a pre-made context starts an episode clean."""

from __future__ import annotations

import os

import corral as cr
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
