"""Browser envs through `corral.runner.Runner`, as terminal envs run: a built-in env id, a
scripted policy that reads the observation like an oracle, real Chromium, concurrent episodes."""

from __future__ import annotations

import json
import re

from corral.runner import EpisodeLimits, Runner, ScriptedPolicy, Status
from corral.runner.policy import ScriptedCall

from .conftest import chromium_processes, chromium_started_since, still_running

ENV_ID = "corral/web-click-button-v0"


def first_observation(call: ScriptedCall) -> str | None:
    """The instruction with the page's first observation, when that is what the policy is
    answering (not a later tool result)."""
    last = call.last_message
    return last if "Click the button labelled" in last and "Accessibility tree:" in last \
        else None


def clicker(call: ScriptedCall) -> str:
    """On the first observation: find the named button's bid and click it (as a tool call or
    a BrowserGym-style string, alternating by label); then say it is done."""
    seen = first_observation(call)
    if seen is None:
        return "done"
    target = re.search(r'Click the button labelled "([^"]+)"', seen).group(1)
    bid = re.search(rf"\[(a\d+)\] button '{re.escape(target)}'", seen).group(1)
    if len(target) % 2:
        return f'click("{bid}")'
    return f'<tool_call>{json.dumps({"name": "click", "arguments": {"bid": bid}})}</tool_call>'


def wrong_clicker(call: ScriptedCall) -> str:
    """Clicks the first button that is not the named one: the reward must say so."""
    seen = first_observation(call)
    if seen is None:
        return "done"
    target = re.search(r'Click the button labelled "([^"]+)"', seen).group(1)
    buttons = re.findall(r"\[(a\d+)\] button '([^']+)'", seen)
    bid = next(b for b, name in buttons if name != target)
    return f'click("{bid}")'


async def test_runner_collects_browser_episodes_concurrently() -> None:
    before = chromium_processes()  # the session's shared pool may be running already
    policy = ScriptedPolicy(clicker)
    async with Runner([ENV_ID], policy, seed=3,
                      limits=EpisodeLimits(max_tokens=128)) as runner:
        trajs = await runner.collect(6, group=2)
    async with Runner([ENV_ID], ScriptedPolicy(wrong_clicker), seed=4,
                      limits=EpisodeLimits(max_tokens=128)) as runner:
        wrong = await runner.collect(2)
        assert runner.pool is not None
        browser = runner.pool.sandboxes.backends["browser"]
        browsers = sum(pool.browsers for pool in browser.pools.values())
        started = chromium_started_since(before)
        assert started  # the run's Chromium (browser, zygotes, renderers) is up while it runs
        pooled = runner.pool.stats
    # closing a Runner closes its sandbox pool, and the pool its browsers: nothing outlives it
    assert still_running(started) == set()
    assert chromium_started_since(before) == set()
    assert pooled.acquires == 2 and pooled.starts >= 2  # contexts came through the pool
    assert [t.status for t in trajs] == [Status.COMPLETE] * 6, [t.error for t in trajs]
    assert [t.reward for t in trajs] == [1.0] * 6
    assert len({t.task_id for t in trajs}) == 3  # 3 groups of 2 samples of one task
    tool_outputs = [m["content"] for t in trajs for m in t.messages if m["role"] != "assistant"]
    assert any("Accessibility tree:" in out for out in tool_outputs)
    assert sum("clicked a" in out for out in tool_outputs) == 6
    # the first model call waits for the page: no speculative call made and thrown away
    assert policy.stats.requests == sum(t.turns for t in trajs) == 12
    assert [t.status for t in wrong] == [Status.COMPLETE] * 2
    assert [t.reward for t in wrong] == [0.0, 0.0]
    assert browsers == 1  # every episode was a context of the run's one warm browser
