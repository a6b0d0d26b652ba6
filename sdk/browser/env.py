"""`cr.BrowserEnv`: web tasks in an isolated browser context, with BrowserGym-style actions.

    @cr.environment("acme/click-v0", tasks=cr.Dataset.procedural(make_task, 1000),
                    sandbox=cr.Browser(), max_turns=5)
    class Click(cr.BrowserEnv):
        def site(self, task):                       # this task's pages, served per episode
            return {"/": html_page("Click", f"<button onclick=...>{task.label}</button>")}

        def instruction(self, task):
            return f"Click the button labelled {task.label!r}."

        @cr.reward
        async def clicked(self, page, task):        # decided from page state after the episode
            return await page.evaluate("document.body.dataset.clicked") == task.label

        def solution(self, task):                   # oracle: bids looked up by role and name
            return [cr.ToolCall.of("click", bid=Ref("button", task.label))]

Observation (after reset and every step): the open tabs, the scroll position, the last action
error and the accessibility tree with bids, as text; `info["observation"]` has the structured
form (URL, page text, elements, optional PNG screenshot). Actions are tools (`click(bid)`,
`fill(bid, text)`, ...) or BrowserGym-style strings (`click("a12")`), parsed without eval.

Oracles cannot know bids before the page is observed, so an oracle's ToolCalls may give a
`Ref(role, name, nth=0)` or `Ref(css=...)` instead of a bid (`corral.browser.refs`): when the
action is played, the env replaces it with the bid of that element.

Pages that run their own episode (MiniWoB's) are driven with two more hooks: `start_script(task)`
runs JavaScript in the start page once it has loaded, and `done_script(task)` is read after
every step and ends the episode when true; `js_reward(expression)` reads a reward from the page.

Such pages can also start many episodes in one load, as MiniWoB++'s own runner does: with
`episodes_per_page = N` (N > 1) an episode that ended cleanly leaves its context parked in the
browser pool, its page at the start URL, and this env's next episode with the same start path
starts there: no navigation; the bids the previous episode put in the page, its focus, text
selection and scroll position are cleared, then the start script runs (so it must be able to
start a new episode in a page that already ran one). After N episodes, or after an episode
that did not end cleanly, the next one gets a fresh context.

A page that stops responding (a script that never yields) is killed when a call into it
outlives `action_timeout` (`BrowserSandbox.call`): `reset` raises `PageUnresponsive`, a step
returns truncated, and the rewards are not computed (0, with the reason in `info["errors"]`).
Rewards that read the page get `navigation_timeout` in all.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any, Awaitable, Callable, ClassVar, Mapping

from playwright.async_api import Error as PlaywrightError

from ..env import Action, Env, Episode
from ..errors import AgentError, AuthoringError, BrowserError, PageUnresponsive
from ..sandbox.spec import Browser
from ..terminal import default_run_id
from ..toolcalls import ToolCallParseError
from ..tools import tool
from ..types import Task, ToolCall
from ..sandbox.opener import SandboxOpener
from ..sandbox.browser.observe import Observation
from ..sandbox.browser.backend import BrowserBackend
from ..sandbox.browser.observe import BID_ATTR
from ..sandbox.browser.pool import BrowserPool
from ..sandbox.browser.sandbox import BrowserSandbox
from ..sandbox.browser.site import Page
from . import actions
from .actions import ActionError, looks_like_actions, parse_actions, require_browser
from .refs import RESOLVE_CSS_JS, Ref

__all__ = ["BrowserEnv", "Ref"]

log = logging.getLogger(__name__)


class BrowserEnv(Env):
    """Base class of browser environments. Author hooks: `site(task)` (the pages),
    `start_path(task)`, `start_script(task)`, `done_script(task)`, `instruction(task)`,
    `@cr.reward`s (they may ask for `page`, `site`, `sandbox`; `js_reward` reads one from the
    page), and `solution(task)` (ToolCalls; `Ref(role, name)` or `Ref(css=...)` for bids).
    `episodes_per_page` lets one loaded start page serve several episodes (module docstring)."""

    kind: ClassVar[str] = "browser"
    # How many episodes one loaded start page may serve, one after another, in this env
    # instance: 1 (the default) gives every episode a fresh context; N > 1 lets an episode
    # start in the page the previous one left, for pages whose start script starts a new
    # episode in place (MiniWoB++'s). Envs that get sandboxes from a provider (the runner's
    # pool) always start fresh.
    episodes_per_page: ClassVar[int] = 1
    instruction_is_first_message: ClassVar[bool] = False  # the first message holds the page
    sandbox_spec = Browser()
    max_turns = 10
    system_prompt: ClassVar[str | None] = (
        "You control a web browser. Each observation lists the open tabs and the page's "
        "accessibility tree; elements have ids in brackets like [a12]. Act with one or more "
        "calls such as click(\"a12\"), fill(\"a3\", \"text\"), select(\"a5\", \"Option\"), "
        "press(\"Enter\"). Reply without an action when the task is done.")

    def __init__(self, *, pool: BrowserPool | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pool = pool
        self.last_observation: Observation | None = None
        # Without a pool or a provider the env owns one opener, so its episodes share one warm
        # Chromium (a context each) instead of launching a browser per reset; closed by aclose.
        self._opener: SandboxOpener | None = None
        # this instance's part of the keys its pages are parked under: no other env (another
        # instance of the same class included) can resume them
        self._page_key = secrets.token_hex(8)

    # --- author hooks -------------------------------------------------------------------------
    def site(self, task: Task) -> Mapping[str, Page]:
        """The task's pages: `path -> HTML | bytes | Response | fn(Request)`. Default: none."""
        return {}

    def start_path(self, task: Task) -> str:
        """The path the episode starts on."""
        return "/"

    def start_script(self, task: Task) -> str | tuple[str, Any] | None:
        """JavaScript run in the start page once it has loaded (its `load` event, after the
        page's own load handlers), before the first observation: a function's source or an
        expression, as `page.evaluate` takes it, or `(source, argument)`. Its JSON-able value
        is kept in the episode's state as `state["start_script"]` (an instruction may read
        it). Default: none."""
        return None

    def done_script(self, task: Task) -> str | None:
        """A JavaScript expression read after every step: when it is true the episode ends
        (terminated), for pages that decide their own end. Default: none."""
        return None

    async def setup(self, sandbox: BrowserSandbox, task: Task) -> None:
        """Serve the task's site to this episode and open its start page. It returns once the
        page's response has committed; the first observation waits in the page for the rest of
        the parse, which saves reset a round trip (an override that reads the page itself
        first awaits `sandbox.page.wait_for_load_state("domcontentloaded")`)."""
        pages = self.site(task)
        if not pages:
            return
        session = await sandbox.open_site(pages)  # same token, so a resumed page's URL holds
        url = session.url(self.start_path(task))
        if sandbox.resumed and sandbox.page.url == url:
            # the page the previous episode left: its bids, focus, selection and scroll go,
            # so this episode's observations read it as a freshly loaded page's
            await sandbox.call(sandbox.page.evaluate(RESUME_JS, BID_ATTR),
                               "clearing the previous episode's marks")
        else:
            try:
                await sandbox.page.goto(url, wait_until="commit")
            except PlaywrightError as exc:  # the task's own site failed: not the agent's doing
                sandbox.check()
                raise BrowserError(f"the task's start page {url} did not load: "
                                   f"{str(exc).strip().splitlines()[0]}") from exc
        script = self.start_script(task)
        if script is not None and self.episode is not None:
            self.episode.state["start_script"] = await _start(sandbox, script)

    # --- sandbox and episode plumbing ------------------------------------------------------------
    async def open_sandbox(self, task: Task) -> BrowserSandbox:
        """A context from the env's `pool` when it was given one, else a context of the env's
        own warm Chromium (opened on first use, closed by `aclose`). In a run the runner's pool
        provides sandboxes instead and this is not called."""
        spec = self.sandbox_spec if isinstance(self.sandbox_spec, Browser) else Browser()
        resume = self._park_key(task) if self.episodes_per_page > 1 else None
        if self.pool is not None:
            return await BrowserSandbox.create(spec, pool=self.pool, resume=resume)
        if self._opener is None:
            self._opener = SandboxOpener(run_id=str(self.config.get("run_id") or default_run_id()))
        backend = await self._opener.backend_for(spec)
        if isinstance(backend, BrowserBackend):  # its pool, so a parked page can be resumed
            return await BrowserSandbox.create(spec, pool=await backend.pool_for(spec),
                                               resume=resume)
        sandbox = await backend.open(spec, env_id=self.env_id or type(self).__name__)
        assert isinstance(sandbox, BrowserSandbox)
        return sandbox

    def _park_key(self, task: Task) -> str:
        """The key this env parks (and resumes) a page of `task`'s start path under."""
        return f"{self._page_key} {self.start_path(task)}"

    async def _release(self, episode: Episode) -> None:
        """Park the episode's page for this env's next episode when `episodes_per_page`
        allows and the episode ended cleanly (terminated, no error) on its start URL in its
        only tab; otherwise the context is closed as usual."""
        sandbox = episode.sandbox
        if isinstance(sandbox, BrowserSandbox) and self._page_reusable(episode, sandbox):
            sandbox.keep_for = self._park_key(episode.task)
        await super()._release(episode)

    def _page_reusable(self, episode: Episode, sandbox: BrowserSandbox) -> bool:
        if self.episodes_per_page <= 1 or self.sandbox_provider is not None:
            return False
        if not episode.done or episode.truncated or episode.errored or not sandbox.sites:
            return False
        if sandbox.lease.episodes >= self.episodes_per_page or not sandbox.fit_for_reuse:
            return False
        return sandbox.lease.page.url == sandbox.sites[0].url(self.start_path(episode.task))

    async def aclose(self) -> None:
        """Release the episode's sandbox, then the env's own browser if it opened one."""
        await super().aclose()
        opener, self._opener = self._opener, None
        if opener is not None:
            await opener.close()

    def injections(self, episode: Episode) -> dict[str, Any]:
        """Adds `page` (the active tab) and `site` (the task's SiteSession) for tools/rewards."""
        values = super().injections(episode)
        sandbox = episode.sandbox
        if isinstance(sandbox, BrowserSandbox) and sandbox.alive:
            values["page"] = sandbox.page
            values["site"] = sandbox.sites[0] if sandbox.sites else None
        else:
            values["page"] = values["site"] = None
        return values

    async def areset(self, *, seed: int | None = None,
                     options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode; the first observation follows the instruction."""
        text, info = await super().areset(seed=seed, options=options)
        episode = self.episode
        assert episode is not None
        obs = await require_browser(episode.sandbox).observe()
        self.last_observation = obs
        full = f"{text}\n\n{obs.render()}"
        episode.messages[-1]["content"] = full
        info["observation"] = obs.as_dict()
        return full, info

    async def astep(self, action: Action) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.last_observation = None
        result = await super().astep(action)
        if self.last_observation is not None:
            result[4]["observation"] = self.last_observation.as_dict()
        return result

    async def _run_calls(self, episode: Episode, calls: list[ToolCall | ToolCallParseError]) -> str:
        sandbox = require_browser(episode.sandbox)
        sandbox.last_error = None
        outputs = []
        for call in calls:  # one by one: a CSS ref is looked up in the page its call acts on
            if isinstance(call, ToolCall):
                call = await self._resolve_css(sandbox, call)
            outputs.append(await super()._run_calls(episode, [call]))
        output = "\n".join(outputs)
        if sandbox.hung:  # an action found the page hung (its tool output says so)
            episode.done = episode.truncated = True
        if not episode.done and (done := self.done_script(episode.task)):
            episode.done = await _is_done(sandbox, done)
        if episode.done:
            return output
        try:
            obs = await sandbox.observe()
        except PageUnresponsive as exc:
            episode.done = episode.truncated = True
            episode.messages.append({"role": "user", "content": str(exc)})
            return f"{output}\n\n{exc}"
        self.last_observation = obs
        rendered = obs.render()
        episode.messages[-1]["content"] += f"\n\n{rendered}"
        return f"{output}\n\n{rendered}"

    async def _score(self, episode: Episode, *, per_step: bool) -> float:
        """The rewards, on a page that can still be read: none when it was killed as hung
        (each counts 0, the reason recorded once), `navigation_timeout` for them in all (the
        page is killed if they take longer)."""
        sandbox = episode.sandbox
        if not isinstance(sandbox, BrowserSandbox) or \
                not any(r.per_step == per_step for r in self._rewards.values()):
            return await super()._score(episode, per_step=per_step)
        if not await sandbox.responsive():
            return self._unscored(episode, per_step, f"rewards not computed: {sandbox.hung}")
        before = dict(episode.rewards)
        budget = sandbox.spec.navigation_timeout
        try:
            return await asyncio.wait_for(super()._score(episode, per_step=per_step), budget)
        except asyncio.TimeoutError:
            await sandbox.kill(f"the rewards did not finish reading the page within {budget:g} "
                               "s; its renderer was killed")
            episode.rewards = before
            return self._unscored(episode, per_step, f"rewards not computed: {sandbox.hung}")

    def _unscored(self, episode: Episode, per_step: bool, why: str) -> float:
        """Count this kind of rewards as 0 and record why (once per episode)."""
        for spec in self._rewards.values():
            if spec.per_step == per_step:
                episode.rewards.setdefault(spec.name, 0.0)
        if why not in episode.errors:
            episode.errors.append(why)
        return 0.0

    def _normalise(self, action: Action) -> tuple[list[ToolCall | ToolCallParseError], str]:
        if isinstance(action, str) and "<tool_call>" not in action \
                and looks_like_actions(action, self._tools):
            return parse_actions(action, self._tools), ""
        calls, text = Env._normalise(action)
        return [self._resolve_refs(c) if isinstance(c, ToolCall) else c for c in calls], text

    def _resolve_refs(self, call: ToolCall) -> ToolCall:
        refs = {k: ref for k, v in call.arguments.items()
                if (k == "bid" or isinstance(v, Ref)) and (ref := Ref.of(v))}
        if not refs:
            return call
        sandbox = self.episode.sandbox if self.episode else None
        obs = sandbox.last_observation if isinstance(sandbox, BrowserSandbox) else None
        arguments = dict(call.arguments)
        for key, ref in refs.items():
            if ref.css is not None:
                continue  # looked up in the page when the call runs (`_resolve_css`)
            node = obs.find(ref.role, ref.name, ref.nth) if obs else None
            arguments[key] = node.bid if node else str(ref)
        return ToolCall(name=call.name, arguments=arguments, id=call.id)

    async def _resolve_css(self, sandbox: BrowserSandbox, call: ToolCall
                           ) -> ToolCall | ToolCallParseError:
        """`call` with its CSS refs replaced by the bids of the elements they select in the
        page (an element the observation left out gets a bid now)."""
        arguments = dict(call.arguments)
        for key, value in call.arguments.items():
            ref = Ref.of(value) if key == "bid" or isinstance(value, Ref) else None
            if ref is None or ref.css is None:
                continue
            try:
                found = await sandbox.call(sandbox.page.evaluate(
                    RESOLVE_CSS_JS, [ref.css, ref.name, ref.nth, sandbox.next_bid]),
                    "a CSS lookup")
            except PlaywrightError as exc:
                sandbox.check()
                found = {"error": f"could not be looked up ({str(exc).splitlines()[0]})"}
            if "bid" not in found:
                why = found.get("error") or f"matches {found['count']} element(s)"
                return ToolCallParseError(str(ref), f"no element for {ref.describe()}: the "
                                                    f"selector {why}")
            sandbox.next_bid = max(sandbox.next_bid, int(found["next"]))
            sandbox.issued.add(found["bid"])
            arguments[key] = found["bid"]
        return ToolCall(name=call.name, arguments=arguments, id=call.id)

    def random_action(self, task: Task, rng: Any) -> Action:
        """Click, hover or scroll at random on the latest observation's elements."""
        obs = self.last_observation
        bids = [n.bid for n in obs.nodes if n.bid] if obs else []
        if not bids or rng.random() < 0.1:
            return ToolCall.of("scroll", dx=0, dy=rng.choice([-300, 300]))
        return ToolCall.of(rng.choice(["click", "click", "hover"]), bid=rng.choice(bids))

    async def _act(self, sandbox: Any, fn: Callable[..., Awaitable[str]], *args: Any) -> str:
        """Run one action, record its error as the last action error, let its effects settle."""
        sb = require_browser(sandbox)
        try:
            result = await fn(sb, *args)
            await sb.settle()
        except PageUnresponsive as exc:  # shown as the action's error; the step then ends
            raise ActionError(str(exc)) from None
        except ActionError as exc:
            sb.last_error = str(exc)
            raise
        return result

    # --- actions --------------------------------------------------------------------------------
    @tool
    async def click(self, sandbox: Any, bid: str) -> str:
        """Click an element.

        Args:
            bid: the element's id from the observation, e.g. "a12".
        """
        return await self._act(sandbox, actions.click, bid)

    @tool
    async def fill(self, sandbox: Any, bid: str, text: str) -> str:
        """Replace the content of a text field with `text`.

        Args:
            bid: the text field's id.
            text: what the field should contain (dates as YYYY-MM-DD for date fields).
        """
        return await self._act(sandbox, actions.fill, bid, text)

    @tool
    async def select(self, sandbox: Any, bid: str, option: str) -> str:
        """Choose an option of a dropdown by its label or value.

        Args:
            bid: the dropdown's id.
            option: the option's visible label (or its value).
        """
        return await self._act(sandbox, actions.select, bid, option)

    @tool
    async def check(self, sandbox: Any, bid: str, checked: bool = True) -> str:
        """Tick (or untick) a checkbox or choose a radio button.

        Args:
            bid: the checkbox's or radio button's id.
            checked: true to tick, false to untick.
        """
        return await self._act(sandbox, actions.check, bid, checked)

    @tool
    async def hover(self, sandbox: Any, bid: str) -> str:
        """Move the mouse over an element (reveals hover menus).

        Args:
            bid: the element's id.
        """
        return await self._act(sandbox, actions.hover, bid)

    @tool
    async def press(self, sandbox: Any, key: str, bid: str | None = None) -> str:
        """Press a key or key combination, on an element or on the page.

        Args:
            key: e.g. "Enter", "Escape", "a", "Control+k", "Shift+Tab".
            bid: the element to focus first (optional).
        """
        return await self._act(sandbox, actions.press, key, bid)

    @tool
    async def scroll(self, sandbox: Any, dx: float, dy: float) -> str:
        """Scroll the page by a number of pixels.

        Args:
            dx: pixels to the right (negative: left).
            dy: pixels down (negative: up).
        """
        return await self._act(sandbox, actions.scroll, dx, dy)

    @tool
    async def goto(self, sandbox: Any, url: str) -> str:
        """Open a URL in the active tab (only the task's own site is reachable).

        Args:
            url: the absolute URL to open.
        """
        return await self._act(sandbox, actions.goto, url)

    @tool
    async def go_back(self, sandbox: Any) -> str:
        """Go back to the previous page in the active tab."""
        return await self._act(sandbox, actions.go_back)

    @tool
    async def tab_focus(self, sandbox: Any, index: int) -> str:
        """Switch to another open tab.

        Args:
            index: the tab's number as listed in the observation (0 is the first).
        """
        return await self._act(sandbox, actions.tab_focus, index)

    @tool
    def send_msg_to_user(self, state: dict[str, Any], text: str) -> str:
        """Send your answer to the user; this ends the episode.

        Args:
            text: the message (the answer when the task asks a question).
        """
        state.setdefault("messages_to_user", []).append(text)
        self._end()
        return "message sent"

    @tool
    def report_infeasible(self, state: dict[str, Any], reason: str) -> str:
        """Declare the task impossible; this ends the episode.

        Args:
            reason: why it cannot be done.
        """
        state["infeasible"] = reason
        self._end()
        return "reported as infeasible"

    def _end(self) -> None:
        if self.episode is None:
            raise AgentError("no episode is running")
        self.episode.done = True


# A reused page made to look as freshly loaded to the observation: no bids (numbered from a1
# again), nothing focused or selected, scrolled to the top.
RESUME_JS = """attr => {
  for (const el of document.querySelectorAll('[' + attr + ']')) el.removeAttribute(attr);
  window.__corralNext = 0;
  if (document.activeElement && document.activeElement !== document.body)
    document.activeElement.blur();
  const selection = getSelection();
  if (selection) selection.removeAllRanges();
  scrollTo(0, 0);
}"""


async def _start(sandbox: BrowserSandbox, script: str | tuple[str, Any]) -> Any:
    """Run a start script in the start page (under `navigation_timeout`: it may wait for the
    page to load); a script that throws is the env's bug."""
    source, argument = script if isinstance(script, tuple) else (script, None)
    try:
        return await sandbox.call(sandbox.page.evaluate(source, argument), "the start script",
                                  sandbox.spec.navigation_timeout)
    except PlaywrightError as exc:
        sandbox.check()
        raise AuthoringError(f"the start script failed in {sandbox.page.url}: "
                             f"{str(exc).strip().splitlines()[0]}") from exc


async def _is_done(sandbox: BrowserSandbox, expression: str) -> bool:
    """Whether the page says its episode is over (false while it is navigating)."""
    try:
        return bool(await sandbox.call(sandbox.page.evaluate(expression), "the done check"))
    except PlaywrightError:
        sandbox.check()
        return False
