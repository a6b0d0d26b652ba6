"""Containerized mode: Chromium in a network-less container of corral/chromium:bookworm,
driven over CDP; the task site is the only thing it can load."""

from __future__ import annotations

import subprocess

import pytest

import corral as cr
from corral.agents import play
from corral.browser import BrowserPool, BrowserSandbox, html_page, task_server
from corral.sandbox.browser.container import ContainerLauncher

pytestmark = [pytest.mark.slow, pytest.mark.docker]

SPEC = cr.Browser(mode="container", navigation_timeout=60, action_timeout=30)


@pytest.fixture(scope="module")
async def container_pool(chromium_image: str) -> BrowserPool:
    launcher = ContainerLauncher(chromium_image, run_id="test-browser")
    pool = await BrowserPool(launcher, warm_contexts=1).start()
    yield pool
    await pool.close()
    left = subprocess.run(["docker", "ps", "-aq", "--filter", "label=corral.run=test-browser"],
                          capture_output=True, text=True).stdout.split()
    assert left == [], f"containers left behind: {left}"


def container_of(pool: BrowserPool) -> str:
    (container_id,) = pool.launcher.containers  # type: ignore[attr-defined]
    return container_id


async def test_oracle_passes_and_noop_fails_in_a_container(container_pool: BrowserPool) -> None:
    for env_id in ("corral/web-login-v0", "corral/web-search-v0", "corral/web-checkout-v0"):
        oracle = await play(cr.make(env_id, pool=container_pool, sandbox=SPEC), "oracle", seed=1)
        noop = await play(cr.make(env_id, pool=container_pool, sandbox=SPEC), "noop", seed=1)
        assert oracle.passed and oracle.infra_error is None, (env_id, oracle)
        assert not noop.passed and noop.infra_error is None, (env_id, noop)


async def test_the_container_has_no_network_but_the_task_site_loads(
        container_pool: BrowserPool) -> None:
    container_id = container_of(container_pool)
    probe = subprocess.run(
        ["docker", "exec", container_id, "python3", "-c",
         "import os, socket\nprint(sorted(os.listdir('/sys/class/net')))\n"
         "try:\n    socket.create_connection(('1.1.1.1', 80), timeout=3)\n    print('open')\n"
         "except OSError as e:\n    print('refused', e.errno)"],
        capture_output=True, text=True, timeout=60)
    lines = probe.stdout.split("\n")
    assert lines[0] == "['lo']" and lines[1].startswith("refused"), probe

    env = cr.make("corral/web-click-link-v0", pool=container_pool, sandbox=SPEC)
    await env.areset(seed=2)
    try:
        sandbox: BrowserSandbox = env.episode.sandbox
        assert "Places" in env.last_observation.text  # served through the route, no network
        out, *_ = await env.astep('goto("http://example.com/")')
        assert "navigation to http://example.com/ is blocked" in out
        fetched = await sandbox.page.evaluate(
            "() => fetch('http://10.0.0.1/').then(() => 'loaded', () => 'refused')")
        assert fetched == "refused" and "http://10.0.0.1/" in sandbox.blocked
    finally:
        await env.aclose()


async def test_container_contexts_are_isolated(container_pool: BrowserPool) -> None:
    site = task_server().open({"/": html_page("Shared", "<h1>Shared</h1>")})
    first = await BrowserSandbox.create(SPEC, pool=container_pool)
    second = await BrowserSandbox.create(SPEC, pool=container_pool)
    try:
        for sb in (first, second):
            await sb.attach_site(site)
            await sb.page.goto(site.url("/"), wait_until="domcontentloaded")
        await first.page.evaluate(
            "() => { document.cookie = 'k=1'; localStorage.setItem('k', '1'); }")
        seen = await second.page.evaluate("() => [document.cookie, localStorage.getItem('k')]")
        assert seen == ["", None]
        assert await first.page.evaluate("() => localStorage.getItem('k')") == "1"
    finally:
        await first.close()
        await second.close()
        task_server().close(site)


async def test_a_standalone_container_sandbox_removes_its_container(chromium_image: str) -> None:
    # through the backend table: the sandbox owns its browser, and so its container
    run = "test-browser-standalone"
    spec = cr.Browser(mode="container", image=chromium_image, navigation_timeout=60,
                      action_timeout=30)
    env = cr.make("corral/web-click-button-v0", sandbox=spec, run_id=run)
    result = await play(env, "oracle", seed=0)
    assert result.passed and result.infra_error is None, result
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=corral.run={run}"],
                          capture_output=True, text=True).stdout.split()
    assert left == [], f"containers left behind: {left}"
