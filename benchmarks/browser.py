"""Browser environments: episodes/s and reset latency, Corral vs the synchronous way.

    .venv/bin/python benchmarks/browser.py [--episodes 48] [--concurrency 1,4,8]
        [--browsergym-python /tmp/bgvenv/bin/python]

Task: `corral/web-click-button-v0` (a page of 3-7 buttons; click the named one). An episode is
reset (fresh isolated context, page load, observation), the oracle's click, the reward.

Measured side by side in one run:
1. sync: a faithful BrowserGym-style loop, one episode at a time on sync Playwright: a new
   browser per reset, the page, an observation as BrowserGym takes it (CDP full AX tree + DOM
   snapshot + screenshot), find the button's bid, click, observe again, validate, close.
   No pre-observation sleep (BrowserGym's default sleeps 0.5 s before each observation).
2. BrowserGym itself (`browsergym-core` in a throwaway venv, `--browsergym-python`), default
   settings and `pre_observation_delay=0`, on the same page served locally.
3. bare async Playwright: one browser, a context per episode, goto, click, read, close (the
   floor PEERS.md measures: no observation, no origin policy, no action checks).
4. Corral: N episodes at a time on one warm browser (one context each).
Plus warm/cold reset latency and the cost of one observation (Corral's single-evaluate walker
vs CDP's full AX tree vs Playwright's aria snapshot). Every browser, the peers' included, runs
the binary Corral's pool runs (`corral.sandbox.browser.chromium.CHROMIUM`: Debian's headless
shell when
installed, as Playwright itself uses for headless runs), so the rows differ only in the loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ENV_ID = "corral/web-click-button-v0"
TIMEOUTS = {"navigation_timeout": 120.0, "action_timeout": 60.0}  # shared, loaded machines


def click_page(task: dict) -> str:
    """The click task's page, as the Corral env serves it (for the sync and peer loops)."""
    from corral.envs.browser.click_button import ClickButton, Task

    return ClickButton.site(None, Task(**task))["/"]  # type: ignore[arg-type]


def tasks(n: int) -> list[dict]:
    import corral as cr

    dataset = cr.make(ENV_ID).tasks
    return [dataset[i].model_dump() for i in range(n)]


# --- 1. the synchronous way -----------------------------------------------------------------------
def sync_observe(cdp: Any, page: Any) -> dict:
    """An observation as BrowserGym takes one: full AX tree, DOM snapshot, screenshot."""
    tree = cdp.send("Accessibility.getFullAXTree")
    cdp.send("DOMSnapshot.captureSnapshot", {"computedStyles": []})
    page.screenshot()
    return tree


def sync_loop(episodes: list[dict]) -> tuple[float, int]:
    """BrowserGym-style episodes, one at a time: (seconds, successes)."""
    from playwright.sync_api import sync_playwright

    from corral.sandbox.browser.chromium import CHROMIUM, LAUNCH_ARGS
    from corral.sandbox.browser.site import TaskServer

    server = TaskServer()
    ok = 0
    started = time.perf_counter()
    with sync_playwright() as pw:
        for task in episodes:
            site = server.open({"/": click_page(task)})
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=list(LAUNCH_ARGS))  # a new browser per reset
            context = browser.new_context(extra_http_headers={"X-Corral-Site": site.token})
            page = context.new_page()
            page.goto(site.url("/"))
            page.evaluate("() => document.querySelectorAll('*').forEach((e, i) => "
                          "e.setAttribute('bid', String(i)))")  # BrowserGym marks every element
            cdp = context.new_cdp_session(page)

            tree = sync_observe(cdp, page)
            names = [n.get("name", {}).get("value") for n in tree["nodes"]]
            assert task["target"] in names
            bid = page.evaluate("t => [...document.querySelectorAll('button')]"
                                ".find(b => b.textContent === t).getAttribute('bid')",
                                task["target"])
            page.locator(f"[bid='{bid}']").click()
            sync_observe(cdp, page)
            ok += page.evaluate("document.body.dataset.clicked || ''") == task["target"]
            browser.close()
            server.close(site)
    return time.perf_counter() - started, ok


# --- 1b. bare async Playwright: the floor PEERS.md measures ---------------------------------------
async def bare_async_loop(episodes: list[dict]) -> tuple[float, int]:
    """Plain async Playwright, one browser, a fresh context per episode, no observation, no
    origin policy, no checks: (seconds, successes). The cost floor of an isolated episode."""
    from playwright.async_api import async_playwright

    from corral.sandbox.browser.chromium import CHROMIUM, LAUNCH_ARGS
    from corral.sandbox.browser.site import SITE_HEADER, TaskServer

    server = TaskServer()
    ok = 0
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                           args=list(LAUNCH_ARGS))
        started = time.perf_counter()
        for task in episodes:
            site = server.open({"/": click_page(task)})
            context = await browser.new_context(extra_http_headers={SITE_HEADER: site.token})
            page = await context.new_page()
            await page.goto(site.url("/"))
            await page.get_by_role("button", name=task["target"], exact=True).click()
            ok += await page.evaluate("document.body.dataset.clicked || ''") == task["target"]
            await context.close()
            server.close(site)
        seconds = time.perf_counter() - started
        await browser.close()
    return seconds, ok


# --- 2. BrowserGym itself -------------------------------------------------------------------------
PEER = textwrap.dedent('''
    import json, sys, threading, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import playwright.sync_api
    spec = json.load(sys.stdin)
    _launch = playwright.sync_api.BrowserType.launch
    def launch(self, *a, **kw):  # Debian's Chromium: playwright install cannot download here
        kw["executable_path"] = spec["chromium"]  # the binary Corral runs
        kw["args"] = list(kw.get("args") or []) + ["--no-sandbox", "--disable-gpu"]
        return _launch(self, *a, **kw)
    playwright.sync_api.BrowserType.launch = launch
    from browsergym.core.env import BrowserEnv
    from browsergym.core.task import AbstractBrowserTask

    PAGES = spec["pages"]
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = PAGES[int(self.path.strip("/") or 0)].encode()
            self.send_response(200); self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a): pass
    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    BASE = f"http://127.0.0.1:{srv.server_address[1]}/"

    class Click(AbstractBrowserTask):
        @classmethod
        def get_task_id(cls): return "corral-click"
        def __init__(self, seed, index=0, target=""):
            super().__init__(seed); self.index, self.target = index, target
        def setup(self, page):
            page.goto(BASE + str(self.index)); return f"Click {self.target}", {}
        def teardown(self): pass
        def validate(self, page, chat_messages):
            ok = page.evaluate("document.body.dataset.clicked || ''") == self.target
            return float(ok), True, "", {}

    def find(node_list, name):
        for n in node_list:
            role = n.get("role", {}).get("value")
            if n.get("name", {}).get("value") == name and role == "button":
                return n.get("browsergym_id")

    for delay in spec["delays"]:
        ok, started = 0, time.perf_counter()
        for i, target in enumerate(spec["targets"]):
            env = BrowserEnv(task_entrypoint=Click, task_kwargs={"index": i, "target": target},
                             headless=True, pre_observation_delay=delay)
            obs, _ = env.reset(seed=i)
            bid = find(obs["axtree_object"]["nodes"], target)
            _, reward, *_ = env.step(f'click("{bid}")')
            ok += reward == 1.0
            env.close()
        print(json.dumps({"delay": delay, "seconds": time.perf_counter() - started, "ok": ok}),
              flush=True)
''')


def browsergym(python: str, episodes: list[dict]) -> list[dict]:
    """Run BrowserGym on the same pages in its own venv; one result per delay setting."""
    from corral.sandbox.browser.chromium import CHROMIUM

    spec = {"pages": [click_page(t) for t in episodes], "targets": [t["target"] for t in episodes],
            "delays": [0.5, 0.0], "chromium": CHROMIUM}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(PEER)
    proc = subprocess.run([python, fh.name], input=json.dumps(spec), capture_output=True,
                          text=True, timeout=1800)
    Path(fh.name).unlink()
    if proc.returncode != 0:
        print(f"browsergym failed: {proc.stderr.strip().splitlines()[-1:]}")
        return []
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


# --- 3. Corral ------------------------------------------------------------------------------------
async def corral_runs(concurrencies: list[int], episodes: int) -> dict:
    import corral as cr
    from corral.agents import play
    from corral.browser import BrowserPool, task_server

    spec = cr.Browser(**TIMEOUTS)

    results: dict = {}
    pool = await BrowserPool(warm_contexts=4, warm_url=task_server().blank_url).start()
    try:
        await play(cr.make(ENV_ID, pool=pool, sandbox=spec), "oracle", seed=0)  # warm-up
        for n in concurrencies:
            queue = list(range(episodes))
            ok = 0

            async def worker(queue: list[int]) -> None:
                nonlocal ok
                env = cr.make(ENV_ID, pool=pool, sandbox=spec)
                while queue:
                    result = await play(env, "oracle", seed=queue.pop())
                    ok += result.passed

            started = time.perf_counter()
            await asyncio.gather(*(worker(queue) for _ in range(n)))
            results[n] = (time.perf_counter() - started, ok)
        results["reset_warm"] = await reset_latency(pool, 25)
    finally:
        await pool.close()
    cold = await BrowserPool(warm_contexts=0, warm_url=task_server().blank_url).start()
    try:
        await play(cr.make(ENV_ID, pool=cold, sandbox=spec), "oracle", seed=0)
        results["reset_cold"] = await reset_latency(cold, 15)
        results["observe"] = await observation_costs(cold)
    finally:
        await cold.close()
    return results


async def reset_latency(pool: Any, n: int) -> list[float]:
    """Seconds per `areset` (context, page load, first observation), one at a time."""
    import corral as cr

    env = cr.make(ENV_ID, pool=pool, sandbox=cr.Browser(**TIMEOUTS))
    times = []
    for i in range(n):
        await pool.wait_warm()  # as in a run, where an episode lasts longer than a refill
        started = time.perf_counter()
        await env.areset(seed=i)
        times.append(time.perf_counter() - started)
        await env.aclose()
    return times


async def observation_costs(pool: Any) -> dict[str, float]:
    """Median ms of one observation of the table page, three ways."""
    import corral as cr

    env = cr.make("corral/web-table-answer-v0", pool=pool, sandbox=cr.Browser(**TIMEOUTS))
    await env.areset(seed=0)
    sandbox = env.episode.sandbox  # type: ignore[union-attr]
    page = sandbox.page
    cdp = await sandbox.context.new_cdp_session(page)
    ways = {"corral walker": lambda: sandbox.observe(),
            "CDP full AX tree": lambda: cdp.send("Accessibility.getFullAXTree"),
            "aria snapshot": lambda: page.locator("body").aria_snapshot()}
    costs = {}
    for name, fn in ways.items():
        times = []
        for _ in range(15):
            started = time.perf_counter()
            await fn()
            times.append(time.perf_counter() - started)
        costs[name] = statistics.median(times) * 1000
    await env.aclose()
    return costs


# --- 5. MiniWoB++: Corral vs BrowserGym on the miniwob package's own pages -----------------------
# BrowserGym runs in its own venv (`browsergym-miniwob` pins Playwright 1.44): one env per
# worker process, N processes for concurrency N, pointed at the package's pages with a file://
# MINIWOB_URL. Both sides play the same scripted actions (Corral's oracle for the utterance;
# its Refs looked up in BrowserGym's page for BrowserGym's bids) on the same page seed:
# BrowserGym seeds the page with `RandomState(seed).randint(0, 1000000)`, so Corral is given
# that number as its task seed.
MINIWOB_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
PEER_MINIWOB = textwrap.dedent(r'''
import json, multiprocessing, os, sys, time


def patch_launch(spec):  # MONKEYPATCH (benchmark only): BrowserGym launches Playwright's own
    # chromium, which `playwright install` cannot download here; run Debian's instead
    import playwright.sync_api
    launch = playwright.sync_api.BrowserType.launch
    def launched(self, *a, **kw):
        kw["executable_path"] = spec["chromium"]
        kw["args"] = list(kw.get("args") or []) + spec["flags"]
        return launch(self, *a, **kw)
    playwright.sync_api.BrowserType.launch = launched


RESOLVE = """([css, role, name, nth]) => {
  const norm = s => (s || '').replace(/\\s+/g, ' ').trim();
  let found = Array.from(document.querySelectorAll(css));
  if (name !== null) {
    const text = el => norm(el.getAttribute('aria-label') || el.textContent || el.value);
    const exact = found.filter(el => text(el) === norm(name));
    found = exact.length > nth ? exact : found.filter(el => text(el).includes(norm(name)));
  }
  const el = found[nth];
  return el ? el.getAttribute('bid') : null;
}"""


def bid_of(page, ref):
    if ref.get("css"):
        return page.evaluate(RESOLVE, [ref["css"], None, ref.get("name"), ref.get("nth", 0)])
    loc = page.get_by_role(ref["role"], name=ref.get("name"), exact=True)
    if ref.get("name") is not None and loc.count() <= ref.get("nth", 0):
        loc = page.get_by_role(ref["role"], name=ref.get("name"))
    return loc.nth(ref.get("nth", 0)).get_attribute("bid")


def action(page, call):
    args = dict(call["arguments"])
    bid = bid_of(page, args.pop("bid"))
    if call["name"] == "click":
        return f"click({bid!r})"
    if call["name"] == "fill":
        return f"fill({bid!r}, {args['text']!r})"
    if call["name"] == "check":
        return f"check({bid!r})"
    if call["name"] == "select":
        return f"select_option({bid!r}, {args['option']!r})"
    raise ValueError(call["name"])


def patch_action_timeouts(env, spec):  # MONKEYPATCH (benchmark only): BrowserGym's actions
    # give Playwright 500 ms each (its action code is these functions' source text); on a loaded
    # 2-core machine that fails fills and clicks, so both sides get the same bound instead
    actions = getattr(env.unwrapped.action_mapping, "__self__", None)
    if actions is not None:
        actions.python_includes = actions.python_includes.replace(
            "timeout=500", f"timeout={spec['timeout_ms']}")


def worker(job):
    spec, episodes = job
    os.environ["MINIWOB_URL"] = spec["miniwob_url"]
    patch_launch(spec)
    import gymnasium as gym
    import browsergym.miniwob  # noqa: F401  (registers browsergym/miniwob.*)
    envs, out = {}, []
    for ep in episodes:
        env = envs.get(ep["task"])
        if env is None:
            env = envs[ep["task"]] = gym.make(f"browsergym/miniwob.{ep['task']}", headless=True,
                                                timeout=spec["timeout_ms"])  # 5 s by default
            patch_action_timeouts(env, spec)
        obs, info = env.reset(seed=ep["seed"])
        page = env.unwrapped.page
        goal, reward, info, errors = obs["goal"], 0.0, {}, []
        for call in ep["actions"]:
            obs, reward, term, trunc, info = env.step(action(page, call))
            if obs["last_action_error"]:
                errors.append(obs["last_action_error"].splitlines()[0][:160])
            if term or trunc:
                break
        out.append({"index": ep["index"], "goal": goal, "reward": reward, "errors": errors,
                    "raw": info.get("task_info", {}).get("RAW_REWARD_GLOBAL")})
    for env in envs.values():
        env.close()
    return out


if __name__ == "__main__":
    spec = json.load(sys.stdin)
    for n in spec["concurrency"]:
        slices = [(spec, spec["episodes"][i::n]) for i in range(n)]
        started = time.perf_counter()
        with multiprocessing.get_context("spawn").Pool(n) as pool:
            results = [r for part in pool.map(worker, slices) for r in part]
        print(json.dumps({"concurrency": n, "seconds": time.perf_counter() - started,
                          "results": sorted(results, key=lambda r: r["index"])}), flush=True)
''')


def miniwob_episodes(tasks: list[str], n: int) -> list[dict]:
    """Episode i: task `tasks[i % len(tasks)]`, BrowserGym seed i and its page seed."""
    import numpy as np

    return [{"index": i, "task": tasks[i % len(tasks)], "seed": i,
             "page_seed": int(np.random.RandomState(i).randint(0, 1000000))} for i in range(n)]


def ref_fields(value: Any) -> Any:
    """A ToolCall argument as JSON for the peer (a Ref as its fields)."""
    from corral.browser import Ref

    ref = Ref.of(value)
    return value if ref is None else {"role": ref.role, "name": ref.name, "nth": ref.nth,
                                      "css": ref.css}


async def corral_miniwob(episodes: list[dict], concurrency: int, chromium: str
                         ) -> tuple[float, list[dict]]:
    """Corral's episodes/s at `concurrency` on one warm browser, with each episode's utterance,
    the oracle's actions (for the peer) and the page's raw reward."""
    import corral as cr
    from corral.agents import play
    from corral.browser import BrowserPool
    from corral.envs.browser.miniwob.oracles import ORACLES
    from corral.sandbox.browser.pool import HostLauncher

    spec = cr.Browser(**TIMEOUTS)
    pool = await BrowserPool(HostLauncher(executable=chromium), warm_contexts=concurrency,
                             size=1).start()
    out: list[dict] = []
    try:
        for task in sorted({e["task"] for e in episodes}):  # warm-up: each task's files cached
            await play(cr.make(f"corral/miniwob-{task}-v0", pool=pool, sandbox=spec), "oracle",
                       options={"task": {"seed": 0}})

        async def worker(share: list[dict]) -> None:
            # the peer's layout: worker w plays episodes w, w + n, w + 2n ... with one env per
            # task (BrowserGym's worker processes take the same slices)
            envs: dict[str, Any] = {}
            for ep in share:
                env = envs.get(ep["task"]) or envs.setdefault(
                    ep["task"], cr.make(f"corral/miniwob-{ep['task']}-v0", pool=pool, sandbox=spec))
                result = await play(env, "oracle", options={"task": {"seed": ep["page_seed"]}})
                utterance = env.episode.state["start_script"]["utterance"]
                actions = ORACLES[ep["task"]](utterance)
                out.append({**ep, "goal": utterance, "raw": result.rewards.get("raw"),
                            "passed": result.passed, "errors": result.errors,
                            "actions": [{"name": c.name, "arguments": {
                                k: ref_fields(v) for k, v in c.arguments.items()}}
                                for c in actions]})

        started = time.perf_counter()
        await asyncio.gather(*(worker(episodes[w::concurrency]) for w in range(concurrency)))
        seconds = time.perf_counter() - started
    finally:
        await pool.close()
    return seconds, sorted(out, key=lambda r: r["index"])


def browsergym_miniwob(python: str, episodes: list[dict], concurrencies: list[int],
                       chromium: str) -> list[dict]:
    """BrowserGym's runs (one per concurrency) on the same episodes and actions."""
    from corral.envs.browser.miniwob.pages import html_root

    spec = {"episodes": episodes, "concurrency": concurrencies, "chromium": chromium,
            "flags": MINIWOB_FLAGS, "miniwob_url": f"file://{html_root()}/miniwob/",
            "timeout_ms": int(TIMEOUTS["action_timeout"] * 1000)}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(PEER_MINIWOB)
    proc = subprocess.run([python, fh.name], input=json.dumps(spec), capture_output=True,
                          text=True, timeout=3600)
    Path(fh.name).unlink()
    if proc.returncode != 0:
        print(f"browsergym failed: {proc.stderr.strip().splitlines()[-3:]}")
        return []
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def miniwob_main(args: argparse.Namespace) -> None:
    from corral.sandbox.browser.chromium import CHROMIUM

    args.chromium = args.chromium or CHROMIUM
    tasks = args.miniwob.split(",")
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    episodes = miniwob_episodes(tasks, args.episodes)
    print(f"MiniWoB++ tasks {', '.join(tasks)}; {args.episodes} episodes per setting; "
          f"{__import__('os').cpu_count()} cores, load {load_average()}; both sides run "
          f"{args.chromium}")
    corral: dict[int, tuple[float, list[dict]]] = {
        n: asyncio.run(corral_miniwob(episodes, n, args.chromium)) for n in concurrencies}
    first = corral[concurrencies[0]][1]
    actions = [{**e, "actions": r["actions"]} for e, r in zip(episodes, first)]
    peers = ({p["concurrency"]: p for p in browsergym_miniwob(
        args.browsergym_python, actions, concurrencies, args.chromium)}
        if args.browsergym_python else {})
    for n in concurrencies:
        seconds, results = corral[n]
        rate = len(results) / seconds
        line = (f"concurrency {n:2d}: corral {rate:6.2f} episodes/s "
                f"({sum(r['passed'] for r in results)}/{len(results)} solved)")
        peer = peers.get(n)
        if peer:
            peer_rate = len(peer["results"]) / peer["seconds"]
            same_goal = sum(a["goal"] == b["goal"] for a, b in zip(results, peer["results"]))
            same_raw = sum(a["raw"] == b["raw"] for a, b in zip(results, peer["results"]))
            line += (f" | BrowserGym {peer_rate:6.2f} episodes/s | ratio "
                     f"{rate / peer_rate:5.1f}x | same utterance {same_goal}/{len(results)}, "
                     f"same raw reward {same_raw}/{len(results)}")
            for a, b in zip(results, peer["results"]):
                if a["goal"] != b["goal"] or a["raw"] != b["raw"]:
                    print(f"  differs: {a['task']} seed {a['seed']}: corral {a['raw']} "
                          f"{a['goal']!r}, BrowserGym {b['raw']} {b['goal']!r} {b['errors']}")
        print(line)
    print(f"load at the end: {load_average()}")


def load_average() -> str:
    """The 1, 5 and 15 minute load averages (latency figures mean little without them)."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=48, help="episodes per Corral setting")
    parser.add_argument("--sync-episodes", type=int, default=8)
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--browsergym-python", default=None,
                        help="python of a venv with browsergym-core (adds BrowserGym itself)")
    parser.add_argument("--miniwob", default=None, metavar="TASKS",
                        help="comma-separated MiniWoB++ tasks: run the MiniWoB++ comparison "
                             "(Corral vs BrowserGym with browsergym-miniwob) instead")
    parser.add_argument("--chromium", default=None,
                        help="the Chromium both sides of the MiniWoB++ comparison run (default: "
                             "the one Corral's pool runs)")
    args = parser.parse_args()
    if args.miniwob:
        return miniwob_main(args)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    episodes = tasks(args.sync_episodes)

    from corral.sandbox.browser.chromium import CHROMIUM

    print(f"task {ENV_ID}; machine: {__import__('os').cpu_count()} cores, load "
          f"{load_average()}; every browser here runs {CHROMIUM}")
    sync_s, sync_ok = sync_loop(episodes)
    sync_rate = len(episodes) / sync_s
    print(f"sync BrowserGym-style loop : {sync_rate:6.2f} episodes/s  "
          f"({len(episodes)} episodes, {sync_ok} solved, {sync_s / len(episodes):.2f} s each)")
    bare_s, bare_ok = asyncio.run(bare_async_loop(tasks(args.episodes)))
    bare_rate = args.episodes / bare_s
    print(f"bare async Playwright loop : {bare_rate:6.2f} episodes/s  "
          f"({args.episodes} episodes, {bare_ok} solved; no observation, no origin policy)")
    peers = browsergym(args.browsergym_python, episodes) if args.browsergym_python else []
    for peer in peers:
        rate = len(episodes) / peer["seconds"]
        print(f"BrowserGym 0.14 (delay {peer['delay']:.1f} s) : {rate:6.2f} episodes/s  "
              f"({peer['ok']} solved, {peer['seconds'] / len(episodes):.2f} s each)")

    results = asyncio.run(corral_runs(concurrencies, args.episodes))
    best = 0.0
    for n in concurrencies:
        seconds, ok = results[n]
        rate = args.episodes / seconds
        best = max(best, rate)
        print(f"corral, {n:2d} concurrent contexts : {rate:6.2f} episodes/s  "
              f"({args.episodes} episodes, {ok} solved)")
    for key, label in (("reset_warm", "warm pool"), ("reset_cold", "no warm contexts")):
        times = sorted(results[key])
        print(f"reset latency ({label}): median {statistics.median(times) * 1000:.0f} ms, "
              f"p90 {times[int(len(times) * 0.9)] * 1000:.0f} ms")
    for name, ms in results["observe"].items():
        print(f"observation, {name:17s}: {ms:6.1f} ms")
    print(f"ratio corral best / sync loop: {best / sync_rate:.1f}x")
    for peer in peers:
        print(f"ratio corral best / BrowserGym (delay {peer['delay']:.1f} s): "
              f"{best / (len(episodes) / peer['seconds']):.1f}x")
    print(f"ratio corral concurrency 1 / bare async Playwright: "
          f"{args.episodes / results[concurrencies[0]][0] / bare_rate:.2f}x")
    print(f"ratio corral concurrency 1 / sync loop: "
          f"{args.episodes / results[concurrencies[0]][0] / sync_rate:.1f}x")
    print(f"load at the end: {load_average()}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
