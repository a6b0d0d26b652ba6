"""`cr.Env`: the environment base class every kind builds on.

An episode is a list of chat messages. `reset` picks a task, prepares its sandbox and returns the
instruction; `step` takes the model's text (tool calls inside it are parsed) or a `ToolCall`,
runs the tools and returns what they printed; a message without tool calls is the agent's answer,
which `respond` may answer (multi-turn games) or which ends the episode. Rewards run when the
episode ends (and after every step for `per_step` rewards).

Async core, thin sync twins: `areset/astep/aclose` are the real implementations; `reset/step/
close` run them on Corral's background loop (`corral.sync`). Every env is a `gymnasium.Env`.
"""

from __future__ import annotations

import logging
import math
import numbers
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, Sequence

import gymnasium

from .sync import run_sync
from .dataset import Dataset
from .errors import AgentError, AuthoringError, DatasetError, InfraError, UnknownTool, VerifierError
from .sandbox.base import Sandbox
from .sandbox.spec import SandboxSpec
from .spaces import TextSpace
from .suggest import closest
from .toolcalls import (ToolCallParseError, parse_openai_tool_calls, parse_tool_calls,
                        strip_tool_calls)
from .tools import RewardSpec, ToolSpec, call_maybe_async, collect
from .toolset import ToolConnection, ToolSet, collect_toolsets
from .types import Message, Task, ToolCall

__all__ = ["Action", "Env", "Episode", "SandboxProvider", "TextEnv", "check_max_turns"]

log = logging.getLogger(__name__)

Action = str | ToolCall | dict[str, Any] | Sequence[ToolCall | dict[str, Any]]


def check_max_turns(value: Any, where: str) -> int:
    """`value` if it is a whole number of turns >= 1; else AuthoringError naming `where` (at 0
    or below every episode would end truncated after one step, whatever the agent did)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise AuthoringError(f"{where}: max_turns must be a whole number >= 1, got {value!r}")
    return int(value)


class SandboxProvider(Protocol):
    """Where sandboxes come from: the runner's warm pool, or a backend opened on demand."""

    async def acquire(self, spec: SandboxSpec, env: "Env") -> Sandbox: ...

    async def release(self, sandbox: Sandbox, env: "Env", reusable: bool) -> None: ...


@dataclass
class Episode:
    """The state of the current episode."""

    task: Task
    messages: list[Message]
    sandbox: Any = None
    state: dict[str, Any] = field(default_factory=dict)
    turn: int = 0
    done: bool = False
    truncated: bool = False
    reward: float = 0.0
    rewards: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    infra_error: str | None = None
    verifier_error: str | None = None  # the env's verifier broke: masked from training
    started_at: float = field(default_factory=time.monotonic)
    verify_span: tuple[float, float] | None = None  # wall-clock start/end of final rewards
    connections: list[ToolConnection] = field(default_factory=list)  # to its tool sets

    @property
    def completion(self) -> str:
        """The agent's last message text (what single-turn rewards judge)."""
        for message in reversed(self.messages):
            if message["role"] == "assistant":
                return message.get("content") or ""
        return ""

    @property
    def errored(self) -> bool:
        return bool(self.errors) or self.infra_error is not None or bool(self.verifier_error)


class Env(gymnasium.Env[str, str]):
    """Base of all Corral environments. Subclass one of `TextEnv`, `TerminalEnv`, `BrowserEnv`.

    Class attributes set by `@cr.environment`: `env_id`, `tasks`, `max_turns`, `tags`,
    `sandbox_spec`. Author hooks: `instruction`, `setup`, `respond`, `solution`,
    `random_action`; tools and rewards are methods marked `@cr.tool` / `@cr.reward`.
    """

    kind: ClassVar[str] = "base"
    env_id: ClassVar[str | None] = None
    tasks: ClassVar[Dataset] = Dataset.from_list([])
    max_turns: int = 1
    tags: ClassVar[tuple[str, ...]] = ()
    sandbox_spec: ClassVar[SandboxSpec | None] = None
    system_prompt: ClassVar[str | None] = None
    # The range every reward function's value must lie in (None: any finite number); a value
    # outside it is a verifier error, never a number.
    reward_bounds: ClassVar[tuple[float, float] | None] = None
    # "Solved" means reward >= this (default full marks), for validate, profile and eval alike.
    pass_threshold: ClassVar[float] = 1.0
    reusable_sandbox: ClassVar[bool] = False  # may the runner reuse a sandbox after reset?
    # Is the first user message `instruction(task)` alone? The runner then starts the first
    # model call while the sandbox starts; envs whose first message shows setup's result (a
    # page observation) set it False, so that call is not made and thrown away.
    instruction_is_first_message: ClassVar[bool] = True
    # `render()` is the transcript as text; a frame is a turn (Gymnasium's checker wants a rate)
    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(self, *, tasks: Any = None, max_turns: int | None = None,
                 sandbox: SandboxSpec | None = None, render_mode: str | None = None,
                 sandbox_provider: SandboxProvider | None = None, **config: Any) -> None:
        if tasks is not None:
            self.tasks = Dataset.coerce(tasks, type(self).tasks.task_type)
        if max_turns is not None:
            self.max_turns = check_max_turns(max_turns, self.env_id or type(self).__name__)
        if sandbox is not None:
            self.sandbox_spec = sandbox
        self.config = config
        self.render_mode = render_mode
        self.sandbox_provider = sandbox_provider
        self.observation_space = TextSpace()
        self.action_space = TextSpace()
        tools, rewards = collect(type(self))
        self._tools: dict[str, ToolSpec] = tools
        self._rewards: dict[str, RewardSpec] = rewards
        self._toolsets: list[ToolSet] = collect_toolsets(type(self))
        self.episode: Episode | None = None

    # --- author hooks -------------------------------------------------------------------------
    def instruction(self, task: Task) -> str:
        """What the agent is asked to do for `task`."""
        prompt = task.get("prompt") or task.get("instruction")
        if prompt is None:
            raise AuthoringError(f"{type(self).__name__} must define instruction(task)")
        return str(prompt)

    async def setup(self, sandbox: Any, task: Task) -> None:
        """Prepare one task in a fresh sandbox (files, services, state)."""

    async def respond(self, task: Task, completion: str, state: dict[str, Any]) -> str | None:
        """Answer a message that called no tool: a string continues the episode with that text
        as the next user message; None ends it. Default: the message is the final answer."""
        return None

    def solution(self, task: Task) -> list[ToolCall | str] | str:
        """The oracle: actions that solve `task`, used by validation."""
        raise AuthoringError(f"{type(self).__name__} has no oracle solution()")

    def random_action(self, task: Task, rng: Any) -> Action:
        """An action a random agent might take (used by `corral run --agent random`)."""
        if self._tools and rng.random() < 0.5:
            name = rng.choice(sorted(self._tools))
            return ToolCall(name=name, arguments={})
        return "".join(rng.choice("0123456789 abcdefghij") for _ in range(rng.randint(1, 8)))

    # --- sandbox lifecycle -------------------------------------------------------------------
    async def open_sandbox(self, task: Task) -> Any:
        """A fresh sandbox for `task` when no provider is set; text envs need none."""
        return None

    def sandbox_for(self, task: Task) -> SandboxSpec | None:
        """The sandbox spec for `task` (default: the env's `sandbox_spec`; families whose tasks
        need different images override it)."""
        return self.sandbox_spec

    async def _acquire(self, task: Task) -> Any:
        spec = self.sandbox_for(task)
        if spec is not None and self.sandbox_provider is not None:
            return await self.sandbox_provider.acquire(spec, self)
        return await self.open_sandbox(task)

    async def _disconnect(self, episode: Episode) -> None:
        """Close the episode's tool-set connections (their servers stop): when it ends, before
        the verify phase, and before its sandbox is released."""
        connections, episode.connections = episode.connections, []
        for connection in connections:
            try:
                await connection.close()
            except Exception as exc:  # the sandbox still has to be released
                log.warning("closing a tool connection of %s failed: %s", self.env_id, exc)

    async def _release(self, episode: Episode) -> None:
        await self._disconnect(episode)
        sandbox, episode.sandbox = episode.sandbox, None
        if sandbox is None:
            return
        if self.sandbox_provider is not None and self.sandbox_spec is not None:
            reusable = self.reusable_sandbox and episode.infra_error is None
            await self.sandbox_provider.release(sandbox, self, reusable)
        elif hasattr(sandbox, "close"):
            await sandbox.close()

    # --- forks (`Sandbox.fork`: what a child sandbox needs beyond the parent's files) ---------
    async def on_fork(self, sandbox: Any, task: Task) -> None:
        """Restart, in a sandbox forked from this episode's, what its filesystem does not
        carry: the processes `setup` started (services). Called once in each child before the
        agent acts there (`fork_sandbox`). Default: nothing, which is right for an env whose
        setup leaves no process running; one whose setup does and that does not override this
        is not forkable (`forkable`)."""

    def restarts_setup_processes(self) -> bool:
        """Whether this env can stand up in a fork what setup left running: it overrides
        `on_fork`, or its setup leaves nothing running (terminal envs know it from the verify
        baseline)."""
        return type(self).on_fork is not Env.on_fork

    def forkable(self) -> bool:
        """Whether the current episode can go on in forks of its sandbox: it has none, or its
        backend forks (`can_fork`) and `restarts_setup_processes()`."""
        sandbox = self._require_episode().sandbox
        if sandbox is None:
            return True
        return bool(getattr(sandbox, "can_fork", False)) and self.restarts_setup_processes()

    async def fork_sandbox(self, n: int, *, keep_parent: bool = True) -> list[Sandbox]:
        """`n` forks of the current episode's sandbox (`Sandbox.fork`), each with `on_fork`
        run in it. AuthoringError when setup's processes cannot be restarted (`forkable`),
        SandboxError when the backend cannot fork; the caller closes the children."""
        episode = self._require_episode()
        if episode.sandbox is None:
            raise AuthoringError(f"{self.env_id or type(self).__name__} has no sandbox to fork")
        if not getattr(episode.sandbox, "can_fork", False):
            raise episode.sandbox.unforkable()
        if not self.restarts_setup_processes():
            raise AuthoringError(f"{self.env_id or type(self).__name__} is not forkable: its "
                                 "setup leaves processes running and it defines no on_fork() "
                                 "to start them again in a fork")
        children = await episode.sandbox.fork(n, keep_parent=keep_parent)
        try:
            for child in children:
                await self.on_fork(child, episode.task)
        except BaseException:
            for child in children:
                await child.close()
            raise
        return children

    # --- the episode -------------------------------------------------------------------------
    def pick_task(self, options: dict[str, Any] | None) -> Task:
        options = options or {}
        if "task" in options:
            task = options["task"]
            return task if isinstance(task, Task) else self.tasks.task_type(**task)
        if len(self.tasks) == 0:
            raise AuthoringError(f"{self.env_id or type(self).__name__} has no tasks")
        index = options.get("task_index")
        if index is None:
            index = int(self.np_random.integers(len(self.tasks)))
        size = len(self.tasks)
        # a negative index is refused, not read from the end: the env server refuses it too
        if isinstance(index, bool) or not isinstance(index, numbers.Integral) \
                or not 0 <= index < size:
            raise DatasetError(f"task_index {index!r}: {self.env_id or type(self).__name__} "
                               f"has {size} tasks, so task_index is a whole number from 0 to "
                               f"{size - 1}")
        return self.tasks[int(index)]

    async def areset(self, *, seed: int | None = None,
                     options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode: pick a task (by `seed`, or `options={"task_index": i}` /
        `{"task": ...}`), prepare its sandbox, return the instruction."""
        gymnasium.Env.reset(self, seed=seed)
        if self.episode is not None:
            await self._release(self.episode)
        task = self.pick_task(options)
        messages: list[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        episode = Episode(task=task, messages=messages)
        self.episode = episode
        try:
            episode.sandbox = await self._acquire(task)
            await self.setup(episode.sandbox, task)
            await self._after_setup(episode)
            for toolset in self._toolsets:  # after the baseline: its servers are the agent's
                episode.connections.append(await toolset.connect(self, episode.sandbox))
        except BaseException as exc:
            if isinstance(exc, InfraError):  # never hand a sandbox that failed setup back
                episode.infra_error = f"{type(exc).__name__}: {exc}"
            await self._release(episode)
            raise
        text = self.instruction(task)
        messages.append({"role": "user", "content": text})
        return text, {"task_id": task.id, "turn": 0}

    async def astep(self, action: Action) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply the agent's action; returns (observation, reward, terminated, truncated, info)."""
        episode = self._require_episode()
        episode.turn += 1
        calls, text = self._normalise(action)
        episode.messages.append(self._assistant_message(text, calls))
        try:
            if calls:
                observation = await self._run_calls(episode, calls)
            else:
                reply = await self.respond(episode.task, text, episode.state)
                if reply is None:
                    episode.done = True
                    observation = ""
                else:
                    observation = reply
                    episode.messages.append({"role": "user", "content": reply})
        except InfraError as exc:
            episode.infra_error = f"{type(exc).__name__}: {exc}"
            episode.done = True
            raise
        if not episode.done and episode.turn >= self.max_turns:
            episode.done = episode.truncated = True
        step_reward = await self._score(episode, per_step=True)
        episode.reward += step_reward
        info: dict[str, Any] = {"task_id": episode.task.id, "turn": episode.turn}
        if episode.done:
            step_reward += await self._finish(episode)
            info.update(self._final_info(episode))
        terminated = episode.done and not episode.truncated
        return observation, step_reward, terminated, episode.truncated, info

    async def afinish(self, *, truncated: bool = True) -> dict[str, Any]:
        """End the current episode now (a deadline, a context limit) and run its final
        rewards; returns the same final info `astep` would. No-op info if already over."""
        episode = self.episode
        if episode is None:
            raise AgentError("call reset() before finish()")
        if not episode.done:
            episode.done = True
            episode.truncated = truncated
            await self._finish(episode)
        return self._final_info(episode)

    async def _after_setup(self, episode: Episode) -> None:
        """Called once setup is done, before the agent acts (terminal envs note what setup left
        running and when, so the verify phase can tell the agent's doing from setup's)."""

    async def _verify(self, episode: Episode) -> float:
        """The verify phase: the final rewards (terminal envs isolate the sandbox first)."""
        return await self._score(episode, per_step=False)

    def solved(self, reward: float) -> bool:
        """Whether an episode's reward counts as solved: at least `pass_threshold`."""
        return reward >= self.pass_threshold - 1e-9

    def check_reward(self, name: str, value: float) -> float:
        """`value` if it is a finite number inside `reward_bounds`; else VerifierError."""
        if not math.isfinite(value):
            raise VerifierError(f"reward '{name}' of {self.env_id} is {value}, not a number")
        low, high = self.reward_bounds or (-math.inf, math.inf)
        if not low <= value <= high:
            raise VerifierError(f"reward '{name}' of {self.env_id} is {value:g}, outside the "
                                f"declared range [{low:g}, {high:g}]")
        return value

    async def _finish(self, episode: Episode) -> float:
        """Run the end-of-episode rewards once, timing them (the runner's verify phase)."""
        await self._disconnect(episode)
        start = time.time()
        try:
            final = await self._verify(episode)
        finally:
            episode.verify_span = (start, time.time())
        episode.reward += final
        return final

    @staticmethod
    def _final_info(episode: Episode) -> dict[str, Any]:
        return {"task_id": episode.task.id, "turn": episode.turn,
                "rewards": dict(episode.rewards), "errored": episode.errored,
                "errors": list(episode.errors), "verifier_error": episode.verifier_error}

    async def aclose(self) -> None:
        """Release the episode's sandbox."""
        if self.episode is not None:
            await self._release(self.episode)

    # --- tools -------------------------------------------------------------------------------
    @property
    def reward_specs(self) -> dict[str, RewardSpec]:
        """This env's reward functions by name (a copy): weight, `per_step`, `sandbox_only`."""
        return dict(self._rewards)

    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI function-calling schemas of this env's tools (its `@cr.tool` methods, then
        the tools of its tool sets, `cr.Tools.from_mcp`)."""
        schemas = [spec.schema() for spec in self._tools.values()]
        for toolset in self._toolsets:
            for schema in toolset.schemas(self):
                name = schema["function"]["name"]
                if name in self._tools:
                    raise AuthoringError(f"{type(self).__name__}: {toolset!r} has a tool "
                                         f"'{name}', as the env itself does; give the set a "
                                         "prefix= to keep them apart")
                schemas.append(schema)
        return schemas

    @property
    def tool_names(self) -> list[str]:
        if not self._toolsets:
            return list(self._tools)
        return [schema["function"]["name"] for schema in self.tool_schemas()]

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> str:
        """Run one tool with validated arguments in the current episode and return its output.
        Unknown tools and bad arguments raise `AgentError` subclasses with clear messages."""
        episode = self._require_episode()
        spec = self._tools.get(name)
        if spec is None:
            for connection in episode.connections:
                if name in connection.names:
                    return await connection.call(name, dict(arguments or {}))
            names = [*self._tools, *(n for c in episode.connections for n in c.names)]
            hint = closest(name, names)
            known = ", ".join(names) or "none"
            raise UnknownTool(f"Unknown tool '{name}'.{hint} Available tools: {known}.")
        args = spec.validate(arguments or {})
        result = await call_maybe_async(spec.fn, self.injections(episode), args)
        return "" if result is None else str(result)

    def injections(self, episode: Episode) -> dict[str, Any]:
        """Values tools and rewards may ask for by parameter name."""
        return {"self": self, "sandbox": episode.sandbox, "task": episode.task,
                "state": episode.state, "messages": episode.messages,
                "completion": episode.completion}

    async def _run_calls(self, episode: Episode, calls: list[ToolCall | ToolCallParseError]) -> str:
        outputs = []
        for call in calls:
            if isinstance(call, ToolCallParseError):
                output, name, call_id = f"Error: {call}", "invalid", None
            else:
                name, call_id = call.name, call.id
                try:
                    output = await self.call_tool(call.name, call.arguments)
                except AgentError as exc:
                    output = f"Error: {exc}"
                except InfraError:
                    raise
                except Exception as exc:  # a tool's own failure is shown to the agent
                    log.debug("tool %s raised", name, exc_info=True)
                    output = f"Error: tool '{name}' failed: {type(exc).__name__}: {exc}"
            message: Message = {"role": "tool", "name": name, "content": output}
            if call_id:
                message["tool_call_id"] = call_id
            episode.messages.append(message)
            outputs.append(output)
        return "\n".join(outputs)

    async def _score(self, episode: Episode, *, per_step: bool) -> float:
        total = 0.0
        for spec in self._rewards.values():
            if spec.per_step != per_step:
                continue
            try:
                value = self.check_reward(
                    spec.name, float(await call_maybe_async(spec.fn, self.injections(episode))))
            except InfraError:
                raise
            except Exception as exc:  # a broken verifier is the env's bug: the episode is
                # marked (masked from training), the run goes on
                why = f"reward '{spec.name}' raised {type(exc).__name__}: {exc}"
                episode.errors.append(why)
                episode.verifier_error = episode.verifier_error or why
                log.warning("reward %s of %s raised: %s", spec.name, self.env_id, exc)
                value = 0.0
            episode.rewards[spec.name] = episode.rewards.get(spec.name, 0.0) + value
            total += spec.weight * value
        return total

    @staticmethod
    def _normalise(action: Action) -> tuple[list[ToolCall | ToolCallParseError], str]:
        if isinstance(action, ToolCall):
            return [action], ""
        if isinstance(action, dict):  # {"name", "arguments"} or an OpenAI `tool_calls` entry
            return parse_openai_tool_calls([action]), ""
        if isinstance(action, str):
            calls = parse_tool_calls(action)
            return calls, (strip_tool_calls(action) if calls else action)
        # a sequence of calls: ToolCalls or dicts (a message's whole `tool_calls` list); a
        # malformed entry is an error observation, as in text, never a KeyError
        return [call if isinstance(call, (ToolCall, ToolCallParseError))
                else parse_openai_tool_calls([call])[0] for call in action], ""

    @staticmethod
    def _assistant_message(text: str, calls: list[ToolCall | ToolCallParseError]) -> Message:
        message: Message = {"role": "assistant", "content": text}
        good = [c for c in calls if isinstance(c, ToolCall)]
        if good:
            message["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in good]
        return message

    def _require_episode(self) -> Episode:
        if self.episode is None:
            raise AgentError("call reset() before step()")
        if self.episode.done:
            raise AgentError("the episode is over; call reset() to start another")
        return self.episode

    # --- sync twins (gymnasium API) ---------------------------------------------------------
    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        return run_sync(self.areset(seed=seed, options=options))

    def step(self, action: Action) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return run_sync(self.astep(action))

    def close(self) -> None:
        run_sync(self.aclose())

    def render(self) -> str | None:
        """The transcript so far as text (render_mode 'ansi')."""
        if self.episode is None:
            return ""
        return "\n".join(f"[{m['role']}] {m.get('content', '')}" for m in self.episode.messages)


class TextEnv(Env):
    """An environment with no sandbox: prompts in, text out (fast path for training and tests)."""

    kind: ClassVar[str] = "text"
