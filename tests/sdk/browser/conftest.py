"""Fixtures for the browser tests: one real Chromium pool for the session, a test env with
every awkward element, and (slow tests) the containerized-mode image built once."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

import corral as cr
from corral.browser import BrowserEnv, BrowserPool, html_page, task_server

MARK = ("function mark(k, v) { if (!(k in document.body.dataset)) "
        "document.body.dataset[k] = v; }")
AWKWARD = html_page("Awkward", """
<h1>Awkward page</h1>
<button onclick="mark('clicked', 'go')">Go</button>
<button disabled>Off</button>
<button onclick="this.remove()">Vanish</button>
<div id="box"><button>Hidden soon</button></div>
<button onclick="document.getElementById('box').style.display = 'none'">Hide box</button>
<p><a href="http://example.com/">External</a> <a href="/two">Two</a></p>
<div style="position:relative;display:inline-block"><button>Under</button>
  <div id="cover" style="position:absolute;inset:0;background:red"></div></div>
<p><label>Fixed <input readonly value="x"></label> <label>Name <input></label></p>
<p><label>Fruit <select><option>Apple</option><option>Pear</option></select></label></p>
<p><label><input type="checkbox"> Agree</label></p>
""", MARK)
TWO = html_page("Two", "<h1>Second page</h1><a href='/'>Back home</a>")


class Awkward(BrowserEnv):
    """A page with every kind of element an action can fail on."""

    max_turns = 20

    def site(self, task: Any) -> dict[str, str]:
        return {"/": AWKWARD, "/two": TWO}

    def instruction(self, task: Any) -> str:
        return "Click Go."

    @cr.reward
    async def clicked(self, page: Any) -> float:
        return float(await page.evaluate("document.body.dataset.clicked || ''") == "go")


AWKWARD_ENV = cr.environment("test/awkward-v0", tasks=[{"name": "awkward"}],
                             sandbox=cr.Browser(action_timeout=2), register=False)(Awkward)


@pytest.fixture(scope="session")
async def pool() -> BrowserPool:
    """One warm Chromium for the session's host-mode tests."""
    pool = await BrowserPool(warm_url=task_server().blank_url).start()
    yield pool
    await pool.close()


@pytest.fixture
async def awkward(pool: BrowserPool) -> Any:
    """The awkward env, reset, closed after the test."""
    env = AWKWARD_ENV(pool=pool)
    await env.areset(seed=0)
    yield env
    await env.aclose()


@pytest.fixture(scope="session")
def chromium_image(dockerd: None) -> str:
    """corral/chromium:bookworm, built once (minutes) when missing."""
    from corral.sandbox.browser.image import ensure_chromium_image

    return ensure_chromium_image()


def elements(env: BrowserEnv) -> dict[str, str]:
    """`name -> bid` of the latest observation's controls (first of each name; labels and
    paragraphs, which share their control's name, are skipped)."""
    obs = env.last_observation
    assert obs is not None
    found: dict[str, str] = {}
    for node in obs.nodes:
        if node.bid and node.name and node.role not in ("LabelText", "paragraph"):
            found.setdefault(node.name, node.bid)
    return found


def parents() -> dict[int, int]:
    """`pid -> parent pid` of every process, from /proc."""
    found: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # the process ended while we looked
    return found


def descendants(pid: int, parent_of: dict[int, int] | None = None) -> set[int]:
    """Every process started (directly or not) by `pid`."""
    children: dict[int, list[int]] = {}
    for child, parent in (parent_of or parents()).items():
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def executable(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def chromium_processes() -> set[int]:
    """This test process's Chromium descendants (browsers, renderers, helpers)."""
    return {pid for pid in descendants(os.getpid()) if "chromium" in executable(pid)}


def chromium_started_since(before: set[int]) -> set[int]:
    """The Chromium processes started since `before` was taken, less those that Chromiums
    already running then started since (a browser of another test's pool spawns a spare
    renderer when it likes: that one is not this test's)."""
    parent_of = parents()
    pids = {pid for pid in descendants(os.getpid(), parent_of) if "chromium" in executable(pid)}
    inherited = set().union(*(descendants(old, parent_of) for old in before))
    return pids - before - inherited


def still_running(pids: set[int], within: float = 15.0) -> set[int]:
    """Those of `pids` still alive after waiting up to `within` s for them to exit (helpers a
    closed Chromium leaves, reparented away from this process, take a moment to go)."""
    deadline = time.monotonic() + within
    alive = set(pids)
    while alive:
        alive = {pid for pid in alive if Path(f"/proc/{pid}").exists()
                 and "chromium" in executable(pid)}
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return alive
