"""32 episodes at once on one browser: each has its own cookies and storage."""

from __future__ import annotations

import asyncio

import pytest

import corral as cr
from corral.agents import play
from corral.browser import BrowserPool, BrowserSandbox, html_page, task_server

N = 32
# 32 renderer processes start at once on a loaded 2-core machine: generous limits
SPEC = cr.Browser(navigation_timeout=90, action_timeout=30)


@pytest.mark.slow  # 32 renderer processes start at once: a minute or two on a loaded 2-core box
async def test_contexts_share_no_cookies_or_storage(pool: BrowserPool) -> None:
    # every sandbox visits the same origin, so only context isolation can keep them apart
    site = task_server().open({"/": html_page("Shared", "<h1>Shared origin</h1>")})
    all_written = asyncio.Event()
    written = 0

    async def episode(i: int) -> tuple[str, str | None, str, str | None]:
        nonlocal written
        sb = await BrowserSandbox.create(SPEC, pool=pool)
        try:
            await sb.attach_site(site)
            await sb.page.goto(site.url("/"), wait_until="domcontentloaded")
            before = await sb.page.evaluate("() => [document.cookie, localStorage.getItem('who')]")
            assert before == ["", None], f"episode {i} saw another episode's state: {before}"
            await sb.page.evaluate("i => { document.cookie = 'who=' + i; "
                                   "localStorage.setItem('who', String(i)); }", i)
            written += 1
            if written == N:
                all_written.set()
            await all_written.wait()  # every context has written before anyone reads
            await sb.page.reload(wait_until="domcontentloaded")
            cookie, stored = await sb.page.evaluate(
                "() => [document.cookie, localStorage.getItem('who')]")
            jar = await sb.context.cookies()
            return cookie, stored, ",".join(c["value"] for c in jar), None
        finally:
            await sb.close()

    try:
        results = await asyncio.gather(*(episode(i) for i in range(N)))
    finally:
        task_server().close(site)
    assert pool.browsers == 1
    for i, (cookie, stored, jar, _) in enumerate(results):
        assert (cookie, stored, jar) == (f"who={i}", str(i), str(i))


async def test_concurrent_env_episodes_on_one_browser_all_pass(pool: BrowserPool) -> None:
    n = N // 4  # full episodes (reset, observe, act, verify); the test above runs all 32
    results = await asyncio.gather(*(
        play(cr.make("corral/web-click-button-v0", pool=pool, sandbox=SPEC), "oracle", seed=i)
        for i in range(n)))
    assert [r.infra_error for r in results] == [None] * n
    assert all(r.passed for r in results), [r.rewards for r in results if not r.passed]
    assert pool.browsers == 1 and len({r.task_id for r in results}) > 1
