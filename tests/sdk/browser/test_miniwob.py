"""MiniWoB++ from the installed `miniwob` package in real Chromium, and the browser-authoring
pieces it is built from: a folder served as the task site (content types by extension), a
start script, a done script, a reward read from the page, and refs by position and CSS."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import corral as cr
from corral.agents import play
from corral.browser import BrowserEnv, BrowserPool, Ref, StaticFiles, js_reward, task_server
from corral.envs.browser.miniwob.env import MiniWoB
from corral.envs.browser.miniwob.oracles import ORACLES
from corral.envs.browser.miniwob.pages import html_root, task_names
from corral.registry import list as list_envs
from corral.registry.validate import validate
from corral.sandbox.browser.site import SITE_HEADER

from .conftest import chromium_processes, chromium_started_since, still_running

pytestmark = pytest.mark.timeout(120)

INDEX = """<!doctype html><html><head><title>Static</title>
<link rel="stylesheet" href="css/site.css"><script src="js/app.js"></script></head>
<body><h1>Static site</h1>
<button onclick="press(0)">OK</button> <button onclick="press(1)">OK</button>
<span class="later">here</span> <span class="go"><b>go</b></span></body></html>"""
APP_JS = """window.score = 0; window.over = false;
function press(i) { if (i === 1 && window.armed) window.score = 1; window.over = true; }
addEventListener('load', () => document.querySelector('.later')
  .addEventListener('click', () => { window.armed = true; }));"""
CSS = ".later { cursor: text; color: rgb(1, 2, 3); } .go { cursor: pointer; }"


@pytest.fixture(scope="module")
def static_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("site")
    (root / "css").mkdir()
    (root / "js").mkdir()
    (root / "index.html").write_text(INDEX)
    (root / "css" / "site.css").write_text(CSS)
    (root / "js" / "app.js").write_text(APP_JS)
    (root / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    return root


def fetch(site: Any, path: str) -> tuple[int, str, bytes]:
    request = urllib.request.Request(site.url(path), headers={SITE_HEADER: site.token})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def test_a_folder_is_served_with_content_types_by_extension(static_site: Path) -> None:
    server = task_server()
    site = server.open({"/": StaticFiles(static_site), "/assets": StaticFiles(static_site),
                        "/raw.css": b"p { color: red }", "/about": "<p>about</p>"})
    try:
        assert fetch(site, "/")[:2] == (200, "text/html; charset=utf-8")
        assert fetch(site, "/css/site.css") == (200, "text/css; charset=utf-8", CSS.encode())
        assert fetch(site, "/assets/js/app.js")[1].startswith("text/javascript")
        assert fetch(site, "/logo.png")[1] == "image/png"
        # pages given as bytes or text take their path's type (they were all text/html)
        assert fetch(site, "/raw.css")[1] == "text/css; charset=utf-8"
        assert fetch(site, "/about")[1] == "text/html; charset=utf-8"
        # nothing outside the folder, nothing missing
        assert fetch(site, "/../../etc/passwd")[0] == 404
        assert fetch(site, "/css/%2e%2e/%2e%2e/etc/hostname")[0] == 404
        assert fetch(site, "/nope.js")[0] == 404
    finally:
        server.close(site)


class StaticEnv(BrowserEnv):
    """A static folder as the site; the page keeps its own score and says when it is over."""

    max_turns = 5
    root: Path

    def site(self, task: Any) -> dict[str, StaticFiles]:
        return {"/": StaticFiles(self.root)}

    def start_script(self, task: Any) -> tuple[str, Any]:
        return "(greeting) => { window.greeting = greeting; return {title: document.title}; }", \
            task.greeting

    def done_script(self, task: Any) -> str:
        return "window.over"

    def instruction(self, task: Any) -> str:
        return f"{self.episode.state['start_script']['title']}: press the second OK."

    score = js_reward("window.score", name="score")
    greeted = js_reward("window.greeting === 'hi'", name="greeted", weight=0.0)

    def solution(self, task: Any) -> list[cr.ToolCall]:
        return [cr.ToolCall.of("click", bid=Ref(css="span", name="here")),
                cr.ToolCall.of("click", bid=Ref("button", "OK", nth=1)),
                cr.ToolCall.of("click", bid=Ref("button", "OK"))]


async def test_start_script_done_script_js_reward_and_refs(pool: BrowserPool,
                                                           static_site: Path) -> None:
    env_cls = cr.environment("test/static-v0", tasks=[{"greeting": "hi"}], register=False,
                             sandbox=cr.Browser())(StaticEnv)
    env_cls.root = static_site
    env = env_cls(pool=pool)
    try:
        text, _ = await env.areset(seed=0)
        assert text.startswith("Static: press the second OK.")
        page = env.episode.sandbox.page  # type: ignore[union-attr]
        # the stylesheet and the script were applied (served as text/css, text/javascript)
        assert await page.evaluate(
            "getComputedStyle(document.querySelector('.later')).color") == "rgb(1, 2, 3)"
        obs = env.last_observation
        assert obs is not None and [n.name for n in obs.nodes if n.role == "button"] == \
            ["OK", "OK"]
        assert "here" not in [n.name for n in obs.nodes if n.bid]  # the span has no bid yet
        # a role-less element with a pointer cursor (a script's click target) has one, its
        # children (which inherit the cursor) do not
        lines = obs.axtree.splitlines()
        at = lines.index("StaticText 'go'".rjust(len("StaticText 'go'") + 2))
        assert lines[at - 1].endswith("] generic ''") and lines[at - 1].startswith("[a")
        bad = await env.astep(cr.ToolCall.of("click", bid=Ref(css="span.nope")))
        assert "no element for the CSS selector 'span.nope': the selector matches 0" in bad[0]
        oracle = env.solution(env.episode.task)  # type: ignore[union-attr]
        _, reward, terminated, _, info = await env.astep(oracle[0])  # the span: now a bid
        assert not terminated and reward == 0
        _, reward, terminated, _, info = await env.astep(oracle[1])  # the second OK
        assert terminated and env.episode.turn == 3  # type: ignore[union-attr]
        assert reward == 1.0 and info["rewards"] == {"score": 1.0, "greeted": 1.0}
    finally:
        await env.aclose()


def test_every_task_page_of_the_package_is_an_env() -> None:
    names = task_names()
    assert len(names) >= 125 and "click-button" in names
    specs = {s.id: s for s in list_envs("corral/miniwob-*")}
    assert set(specs) == {f"corral/miniwob-{n}-v0" for n in names}
    spec = specs["corral/miniwob-click-button-v0"]
    assert spec.kind == "browser" and "miniwob" in spec.tags and spec.kwargs == {
        "page": "click-button"}
    assert spec.description == ("MiniWoB++ click-button: Click on a specific button in a "
                                "generated form.")
    assert len(ORACLES) >= 10 and set(ORACLES) <= set(names)


async def test_the_oracles_solve_their_tasks_and_the_noop_does_not(pool: BrowserPool) -> None:
    async def episode(name: str, agent: str, seed: int) -> tuple[str, str, Any]:
        env = cr.make(f"corral/miniwob-{name}-v0", pool=pool)
        return name, agent, await play(env, agent, seed=seed, options={"task_index": seed})

    gate = asyncio.Semaphore(4)

    async def gated(*args: Any) -> tuple[str, str, Any]:
        async with gate:
            return await episode(*args)

    runs = [gated(name, "oracle", 7) for name in ORACLES]
    runs += [gated(name, "noop", 7) for name in ("click-button", "enter-text", "login-user")]
    results = await asyncio.gather(*runs)
    for name, agent, result in results:
        assert result.infra_error is None and not result.errors, (name, agent, result)
        if agent == "oracle":
            assert result.passed and result.rewards["raw"] == 1.0, (name, result)
            # MiniWoB's time discount (0 past its 10 s, which a loaded machine can take)
            assert 0 <= result.rewards["time_scaled"] < 1.0, (name, result)
        else:
            assert not result.passed and result.rewards == {"raw": 0.0, "time_scaled": 0.0}


async def test_seeded_pages_the_utterance_and_the_page_reward(pool: BrowserPool) -> None:
    env = cr.make("corral/miniwob-click-test-2-v0", pool=pool)
    layouts = []
    try:
        for seed in (11, 11, 12):
            text, _ = await env.areset(options={"task": {"seed": seed}})
            assert text.startswith("Click button ONE.")
            assert "Last reward" not in text and "START" not in text  # MiniWoB's display
            page = env.episode.sandbox.page  # type: ignore[union-attr]
            layouts.append(await page.evaluate("document.getElementById('subbtn').style.cssText"))
        assert layouts[0] == layouts[1] != layouts[2]
        # the wrong button: the page's own reward, -1, not time-scaled; the page ends the episode
        _, reward, terminated, _, info = await env.astep(
            cr.ToolCall.of("click", bid=Ref("button", "TWO")))
        assert terminated and reward == -1.0
        assert info["rewards"] == {"raw": -1.0, "time_scaled": -1.0}
    finally:
        await env.aclose()
    assert html_root() is not None


async def test_validation_of_a_task_without_an_oracle_checks_the_noop() -> None:
    report = await validate("corral/miniwob-click-color-v0", limit=1, concurrency=2)
    assert report.ok and report.oracle_unchecked == 1 and report.noop_pass_rate == 0.0
    assert report.verdict.startswith("oracle: solvability unchecked (no oracle), no-op 0% pass")
    assert report.tasks[0].oracle.unchecked == "solvability unchecked (no oracle)"


# --- one page, many episodes (`episodes_per_page`), as MiniWoB++'s own runner does ------------

async def scripted(env: BrowserEnv, seed: int) -> tuple[str, str, dict[str, float], Any]:
    """One oracle episode of `env` on `seed`, without closing it: the instruction, the first
    observation, the final rewards and the episode's sandbox (left to the env)."""
    text, _ = await env.areset(options={"task": {"seed": seed}})
    utterance = env.episode.state["start_script"]["utterance"]  # type: ignore[union-attr]
    observation = text.split("\n\n", 1)[1]
    sandbox = env.episode.sandbox  # type: ignore[union-attr]
    info: dict[str, Any] = {}
    for call in ORACLES[env.page_name](utterance):  # type: ignore[attr-defined]
        _, _, terminated, truncated, info = await env.astep(call)
        if terminated or truncated:
            break
    return utterance, observation, info.get("rewards", {}), sandbox


@pytest.mark.parametrize("name", ["click-button", "enter-text", "login-user"])
async def test_a_reused_page_starts_the_episode_a_fresh_load_would(pool: BrowserPool,
                                                                     name: str) -> None:
    reused = cr.make(f"corral/miniwob-{name}-v0", pool=pool)
    try:
        first = await scripted(reused, 3)
        page = first[3].lease.page
        await page.evaluate("window.__sameDocument = true")
        runs = [await scripted(reused, seed) for seed in (41, 3)]
        # the same document served all three: no navigation, the start script started each
        assert await page.evaluate("window.__sameDocument") is True
        assert all(run[3].resumed and run[3].lease.page is page for run in runs)
        # the start script is idempotent: one stylesheet, one wrapper around core.endEpisode
        assert await page.evaluate("document.querySelectorAll('#corral-wob-style').length") == 1
        assert await page.evaluate("core.endEpisode.__corral === true")
    finally:
        await reused.aclose()
    for seed, run in zip((41, 3), runs):
        fresh = cr.make(f"corral/miniwob-{name}-v0", pool=pool)
        try:
            expected = await scripted(fresh, seed)
            assert not expected[3].resumed
        finally:
            await fresh.aclose()
        # same utterance, same observation (bids numbered as on a fresh page), same reward
        # (`time_scaled` depends on the seconds taken, so only the page's raw one compares)
        assert run[:2] == expected[:2], (name, seed)
        assert run[2]["raw"] == expected[2]["raw"] == 1.0
    assert first[0] == runs[1][0]  # seed 3 again, after another episode in the page


async def test_a_page_is_reused_only_by_its_env_after_a_clean_episode(pool: BrowserPool) -> None:
    env = cr.make("corral/miniwob-click-test-2-v0", pool=pool, max_turns=1)
    other = cr.make("corral/miniwob-click-test-2-v0", pool=pool)
    try:
        _, _, _, first = await scripted(env, 1)
        # another instance of the same env never gets this env's page
        _, _, _, elsewhere = await scripted(other, 1)
        assert not elsewhere.resumed and elsewhere.lease is not first.lease
        _, _, _, second = await scripted(env, 2)
        assert second.lease is first.lease and second.resumed
        # a truncated episode (its turn limit, the wrong button not pressed) leaves no page
        await env.areset(options={"task": {"seed": 3}})
        _, _, _, truncated, _ = await env.astep(cr.ToolCall.of("scroll", dx=0, dy=10))
        assert truncated
        await env.areset(options={"task": {"seed": 4}})
        assert not env.episode.sandbox.resumed  # type: ignore[union-attr]
        assert env.episode.sandbox.lease is not first.lease  # type: ignore[union-attr]
    finally:
        await env.aclose()
        await other.aclose()


class TwoPerPage(MiniWoB):
    """MiniWoB++ with a page load serving two episodes at most."""

    episodes_per_page = 2


async def test_a_page_serves_at_most_episodes_per_page_and_nothing_outlives_the_pool() -> None:
    before = chromium_processes()
    own = await BrowserPool(warm_url=task_server().blank_url, warm_contexts=0).start()
    env = TwoPerPage(page="click-test", pool=own)
    try:
        leases, listeners = [], []
        for seed in range(5):
            _, _, rewards, sandbox = await scripted(env, seed)
            assert rewards["raw"] == 1.0
            leases.append(sandbox.lease)
            listeners.append({event: len(sandbox.lease.page._impl_obj.listeners(event))
                              for event in ("crash", "close", "request", "domcontentloaded")})
        # loads: episodes 0-1, 2-3, 4
        assert [lease.episodes for lease in leases] == [2, 2, 2, 2, 1]
        assert leases[0] is leases[1] is not leases[2] is leases[3] is not leases[4]
        # each episode's sandbox removed its listeners when it parked: during its second
        # episode a page has as many as during its first
        assert listeners[0] == listeners[1] and listeners[0]["request"] >= 1
        await env.aclose()  # play()'s way: the env's page stays parked for its next episode
        assert own.parked == 1
    finally:
        await env.aclose()
        await own.close()
    assert own.parked == 0
    assert not still_running(chromium_started_since(before))
