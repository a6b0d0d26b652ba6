"""`ExternalAgent`: an agent program (a command or a Python callable) playing a Corral env.

    agent = cr.ExternalAgent(command=["python", "my_agent.py"], env={"MY_FLAG": "1"})
    agent = cr.ExternalAgent(python=my_loop)               # my_loop(ctx: AgentContext)
    agent = cr.ExternalAgent.named("mini-swe-agent")        # the built-in adapters
    async with Runner(envs, policy, agent=agent) as runner: ...

An episode with an external agent (`run_agent_episode`) resets the env (its sandbox set up as
usual), opens an endpoint of the run's recording proxy for it, and starts the agent with
the endpoint (`OPENAI_BASE_URL`, `OPENAI_API_KEY`) and the task (`CORRAL_INSTRUCTION`). The agent
acts in the sandbox through `AgentContext.exec` (Python agents) or `CORRAL_SANDBOX_URL`'s
`POST /exec` (commands on the host), or runs inside the sandbox itself (`inside=True`: the
command is executed in the sandbox, reaching the proxy through a unix socket the runner
binds there, with no other network). The episode ends when the agent exits (status
`COMPLETE`; a non-zero exit is `AGENT_ERROR`), or at the episode deadline (`TRUNCATED`): a
command's whole process tree is killed, a Python agent's endpoint and sandbox access are cut
(its next call fails). Then the env's verifier scores the sandbox as for a native episode, and
the proxy's recorded segments become the trajectory's tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from corral.errors import CorralError, InfraError
from corral.runner.agents.proxy import MODEL_NAME, AgentProxy, AgentSession
from corral.runner.agents.record import EpisodeRecord
from corral.runner.episode import (EpisodeLimits, WorkItem, _close, _collect_outcome, _deadline,
                                   _Deadline, _fail)
from corral.runner.policy.base import Policy
from corral.runner.pool import span_sink
from corral.runner.trajectory import Span, Status, Trajectory

__all__ = ["AGENT_NAMES", "AgentContext", "ExternalAgent", "agent_from_options",
           "check_agent_name", "kill_tree", "run_agent_episode"]

log = logging.getLogger(__name__)
DEFAULT_TIMEOUT_S = 600.0  # an episode deadline for agents when the run sets none
LOG_TAIL = 4096  # bytes of an agent command's output kept on the trajectory


@dataclass
class AgentContext:
    """What a Python agent gets: its endpoint, the task, and the episode's sandbox.

    `exec(command, timeout=None, cwd=None)` runs a shell command in the sandbox from the
    agent's thread and returns the sandbox's `ExecResult`; it raises `InfraError` once the
    episode ended."""

    base_url: str
    api_key: str
    model: str
    instruction: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    sandbox: Any
    deadline: float  # time.monotonic() at which the episode ends
    loop: asyncio.AbstractEventLoop
    env: dict[str, str] = field(default_factory=dict)
    ended: threading.Event = field(default_factory=threading.Event)
    max_turns: int | None = None  # the run's cap on model calls (the next one answers 403)

    def exec(self, command: str, timeout: float | None = None, cwd: str | None = None) -> Any:
        """Run `command` in the episode's sandbox (blocking; call it from the agent's thread)."""
        if self.ended.is_set():
            raise InfraError("the episode has ended; its sandbox is closed to the agent")
        if self.sandbox is None:
            raise CorralError("this env has no sandbox to run commands in")
        left = self.deadline - time.monotonic()
        timeout = max(0.1, min(timeout, left) if timeout else left)
        future = asyncio.run_coroutine_threadsafe(
            self.sandbox.exec(command, timeout=timeout, cwd=cwd), self.loop)
        return future.result(timeout + 30)


AgentCallable = Callable[[AgentContext], Any]


@dataclass(frozen=True)
class ExternalAgent:
    """An agent program to play episodes: `command` (argv; run on the host, or in the sandbox
    with `inside=True`) or `python` (a callable taking an `AgentContext`, sync: run in a thread,
    or async), with extra environment variables `env`. `timeout`: the episode deadline when
    the run sets none (`EpisodeLimits.episode_deadline`)."""

    command: Sequence[str] | None = None
    python: AgentCallable | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    inside: bool = False
    timeout: float = DEFAULT_TIMEOUT_S
    name: str | None = None

    def __post_init__(self) -> None:
        if (self.command is None) == (self.python is None):
            raise ValueError("ExternalAgent needs exactly one of command=[...] or python=callable")
        if self.command is not None:
            if isinstance(self.command, str) or not self.command or not all(
                    isinstance(a, str) for a in self.command):
                raise ValueError(f"ExternalAgent command must be a non-empty list of strings "
                                 f"(argv), got {self.command!r}")
            if not self.inside and shutil.which(self.command[0]) is None:
                raise CorralError(f"agent command {self.command[0]!r} is not an executable "
                                  "on PATH")
        elif not callable(self.python):
            raise ValueError(f"ExternalAgent python must be callable, got {self.python!r}")
        if self.inside and self.python is not None:
            raise ValueError("inside=True runs a command in the sandbox; a Python agent runs "
                             "on the host")
        if not 0 < self.timeout < float("inf"):
            raise ValueError(f"timeout must be a positive number of seconds, got {self.timeout}")

    @property
    def label(self) -> str:
        """How the run manifest and trajectories name this agent."""
        if self.name:
            return self.name
        if self.command is not None:
            return " ".join(self.command)
        return getattr(self.python, "__qualname__", type(self.python).__name__)

    @classmethod
    def named(cls, name: str, **options: Any) -> "ExternalAgent":
        """A built-in agent by name (`AGENT_NAMES`): `mini-swe-agent` (the PyPI package, extra
        `[agents]`)."""
        check_agent_name(name)
        return _BUILTIN[name](**options)


def check_agent_name(name: str) -> None:
    """A `CorralError` naming the closest built-in agents when `name` is none of them."""
    if name not in _BUILTIN:
        from corral.suggest import closest

        raise CorralError(f"unknown agent {name!r}.{closest(name, list(_BUILTIN))} Known "
                          f"agents: {', '.join(_BUILTIN)}")


def agent_from_options(name: str | None = None, command: str | None = None, *,
                       inside: bool = False, env: Mapping[str, str] | None = None,
                       make_named: bool = True) -> ExternalAgent | None:
    """The `ExternalAgent` that the command line (`--agent`, `--agent-command`,
    `--agent-inside`, `--agent-env`) and `TrainConfig` (`agent`, `agent_command`,
    `agent_inside`, `agent_env`) name: a built-in agent by `name`, or `command` (shell words)
    run on the host or, with `inside`, in the sandbox, with the extra variables `env`. None
    when neither is given. `make_named=False` checks a name without making its agent (a
    built-in one imports its framework when made) and returns None for it. A `ValueError` or
    `CorralError` says what is wrong."""
    if name is not None and command is not None:
        raise ValueError("give an agent name or an agent command, not both")
    if command is None and (inside or env):
        what = "inside" if inside else "env"
        raise ValueError(f"{what} applies to an agent command only (a built-in agent runs on "
                         "the host, in Python); give an agent command")
    if name is not None:
        check_agent_name(name)
        return ExternalAgent.named(name) if make_named else None
    if command is None:
        return None
    return ExternalAgent(command=shlex.split(command), inside=inside, env=dict(env or {}))


def _mini_swe_agent(**options: Any) -> ExternalAgent:
    from corral.integrations.miniswe import STEP_LIMIT, preload, run_mini_swe_agent

    preload()  # before any episode's deadline runs

    def play(ctx: AgentContext) -> dict[str, Any]:
        settings = dict(options)
        if ctx.max_turns is not None:  # it stops there itself: it retries the refused call
            settings["step_limit"] = min(settings.get("step_limit", STEP_LIMIT), ctx.max_turns)
        return run_mini_swe_agent(task=ctx.instruction, base_url=ctx.base_url,
                                  api_key=ctx.api_key, execute=ctx.exec, **settings)

    return ExternalAgent(python=play, name="mini-swe-agent")


_BUILTIN: dict[str, Callable[..., ExternalAgent]] = {"mini-swe-agent": _mini_swe_agent}
AGENT_NAMES = tuple(_BUILTIN)


# --- processes ---------------------------------------------------------------------------------
MARKER_ENV = "CORRAL_AGENT_RUN"  # every agent process tree carries its own value of it


def _processes() -> dict[int, int]:
    """pid -> parent pid of every process (from /proc)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    parents[int(entry)] = int(fh.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return parents


def _marked(pids: Any, marker: str) -> list[int]:
    """The processes among `pids` whose environment holds `MARKER_ENV=marker` (found even
    after they left the tree: a daemonised child is re-parented to init)."""
    needle = f"{MARKER_ENV}={marker}".encode() + b"\0"
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if needle in fh.read() + b"\0":
                    found.append(pid)
        except OSError:
            continue
    return found


def kill_tree(pid: int, marker: str | None = None) -> None:
    """SIGKILL `pid`, its process group, every descendant and, with `marker`, every process
    that inherited `MARKER_ENV=marker` (those that daemonised out of the tree)."""
    parents = _processes()
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    victims, todo = [pid], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            victims.append(child)
            todo.append(child)
    if marker:
        victims += _marked(parents, marker)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for victim in dict.fromkeys(victims):
        if victim != os.getpid():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(victim, signal.SIGKILL)


# --- running one agent -------------------------------------------------------------------------
async def _run_command(agent: ExternalAgent, ctx: AgentContext, outcome: dict[str, Any]) -> int:
    """Run the agent command on the host until it exits; killed with its tree if cancelled."""
    assert agent.command is not None
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="corral-task-",
                                     delete=False) as fh:
        json.dump({"instruction": ctx.instruction, "messages": ctx.messages,
                   "tools": ctx.tools}, fh)
    marker = secrets.token_hex(8)
    env = {**os.environ, **ctx.env, "CORRAL_TASK_FILE": fh.name, MARKER_ENV: marker}
    proc = await asyncio.create_subprocess_exec(
        *agent.command, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True)
    tail = bytearray()

    async def pump() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            tail.extend(chunk)
            del tail[:-LOG_TAIL]

    pumping = asyncio.ensure_future(pump())
    try:
        return await _exit_status(proc)
    finally:  # exited, or cut at the deadline: what it left running goes too
        kill_tree(proc.pid, marker)
        with contextlib.suppress(Exception):  # its output ends once the tree is gone
            await asyncio.wait_for(asyncio.gather(proc.wait(), pumping), 5)
        pumping.cancel()
        outcome["log_tail"] = tail.decode("utf-8", "replace")
        with contextlib.suppress(OSError):
            os.unlink(fh.name)


async def _exit_status(proc: asyncio.subprocess.Process) -> int:
    """`proc`'s exit status once it exits. Not `proc.wait()`: that also waits for its output
    pipe to close, which a child it left running holds open (until the deadline)."""
    while proc.returncode is None:
        await asyncio.sleep(0.05)
    return proc.returncode


async def _run_inside(agent: ExternalAgent, ctx: AgentContext, outcome: dict[str, Any],
                      proxy: AgentProxy) -> int:
    """Run the agent command inside the sandbox (it reaches the proxy over a socket in the
    sandbox, see `corral.runner.agents.inside`)."""
    from corral.runner.agents.inside import run_in_sandbox

    result = await run_in_sandbox(ctx, list(agent.command or ()),
                                  timeout=max(1.0, ctx.deadline - time.monotonic()),
                                  proxy=proxy, outcome=outcome)
    outcome["log_tail"] = result.output[-LOG_TAIL:]
    return result.exit_code


async def _run_python(agent: ExternalAgent, ctx: AgentContext, outcome: dict[str, Any]) -> int:
    assert agent.python is not None
    if inspect.iscoroutinefunction(agent.python):
        result = await agent.python(ctx)
    else:
        done: asyncio.Future[Any] = ctx.loop.create_future()

        def target() -> None:
            try:
                value: Any = agent.python(ctx)  # type: ignore[misc]
            except BaseException as exc:  # noqa: BLE001 - handed to the episode
                ctx.loop.call_soon_threadsafe(_settle, done, None, exc)
            else:
                ctx.loop.call_soon_threadsafe(_settle, done, value, None)

        threading.Thread(target=target, name="corral-agent", daemon=True).start()
        result = await done
    if result is not None:
        with contextlib.suppress(TypeError, ValueError):
            outcome["result"] = json.loads(json.dumps(result, default=str))
    return 0


def _settle(future: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)


async def run_agent_episode(env: Any, policy: Policy, item: WorkItem, limits: EpisodeLimits,
                            inference: asyncio.Semaphore, agent: ExternalAgent,
                            proxy: AgentProxy, *, attempt: int = 1,
                            spans: list[Span] | None = None,
                            admission: contextlib.AbstractAsyncContextManager[Any] | None = None,
                            ) -> Trajectory:
    """One attempt at `item` played by `agent` through `proxy` (see the module docstring);
    the same contract as `run_episode`: failures are classified on the trajectory."""
    traj = Trajectory(id=item.id, env_id=item.env_id, task_id="", group_id=item.group_id,
                      attempts=attempt,
                      metadata={"task_index": item.task_index, "sample": item.sample,
                                "seed": item.seed, "group": item.group,
                                "agent": {"name": agent.label}})
    traj.spans.extend(spans or ())
    record = EpisodeRecord(policy.tokenizer)
    restart = f"#r{item.restart}" if item.restart else ""
    session = AgentSession(f"{item.id}{restart}#a{attempt}", record, policy, limits, inference,
                           traj=traj, seed=item.seed)
    outcome: dict[str, Any] = traj.metadata["agent"]
    token = span_sink.set(traj.spans)
    deadline_s = limits.episode_deadline or agent.timeout
    ctx: AgentContext | None = None
    try:
        async with admission if admission is not None else contextlib.nullcontext():
            try:
                async with _deadline(deadline_s, "episode"):
                    ctx = await _start(env, item, session, proxy, agent, deadline_s)
                    began = time.time()
                    try:
                        runner = (functools.partial(_run_inside, proxy=proxy) if agent.inside
                                  else _run_command if agent.command is not None
                                  else _run_python)
                        code = await runner(agent, ctx, outcome)
                    finally:
                        _stop(proxy, session, ctx)
                        traj.spans.append(Span("agent", began, time.time()))
                outcome["exit_code"] = code
                _adopt_messages(env, record)
                traj.status = Status.COMPLETE if code == 0 else Status.AGENT_ERROR
                if code != 0:
                    traj.error = _exit_error(code)
                async with _deadline(limits.verify_deadline, "verify"):
                    await env.afinish(truncated=False)
            except _Deadline as exc:
                if exc.which == "verify":
                    raise
                _adopt_messages(env, record)
                traj.status = Status.TRUNCATED
                traj.metadata["truncated_by"] = exc.which
                if env.episode is not None and not env.episode.done:
                    async with _deadline(limits.verify_deadline, "verify"):
                        await env.afinish(truncated=True)
    except (InfraError, _Deadline) as exc:
        _fail(traj, env, Status.INFRA_ERROR, exc)
    except Exception as exc:  # the agent's adapter or the env raised: not the policy's fault
        log.warning("agent episode %s raised %s: %s", item.id, type(exc).__name__, exc)
        _fail(traj, env, Status.INFRA_ERROR, exc)
    except asyncio.CancelledError:
        if env.episode is not None:
            env.episode.infra_error = "cancelled"
        raise
    finally:
        span_sink.reset(token)
        _stop(proxy, session, ctx)
        _collect_outcome(traj, env)
        record.fill(traj)
        traj.turns = record.requests
        if session.overridden:
            traj.metadata["agent"]["overridden"] = dict(session.overridden)
        if record.messages:
            traj.messages = record.messages
        await _close(env, traj)
    return traj


async def _start(env: Any, item: WorkItem, session: AgentSession, proxy: AgentProxy,
                 agent: ExternalAgent, deadline_s: float) -> AgentContext:
    start = time.time()
    await env.areset(seed=item.seed, options={"task_index": item.task_index})
    episode = env.episode
    session.traj.task_id = episode.task.id
    waits = [s for s in session.traj.spans if s.phase == "sandbox_wait" and s.start >= start]
    session.traj.spans.append(Span("setup", waits[-1].end if waits else start, time.time()))
    session.sandbox = episode.sandbox
    proxy.open(session)
    instruction = next((m["content"] for m in reversed(episode.messages)
                        if m["role"] == "user"), "")
    ctx = AgentContext(base_url=session.base_url, api_key=session.key, model=MODEL_NAME,
                       instruction=instruction, messages=[dict(m) for m in episode.messages],
                       tools=env.tool_schemas(), sandbox=episode.sandbox,
                       deadline=time.monotonic() + deadline_s,
                       loop=asyncio.get_running_loop(), max_turns=session.limits.max_turns)
    sandbox_url = f"{session.base_url.removesuffix('/v1')}/sandbox"
    ctx.env = {**agent.env, "OPENAI_BASE_URL": session.base_url,
               "OPENAI_API_BASE": session.base_url, "OPENAI_API_KEY": session.key,
               "CORRAL_MODEL": MODEL_NAME, "CORRAL_INSTRUCTION": instruction,
               "CORRAL_SANDBOX_URL": sandbox_url}
    return ctx


def _exit_error(code: int) -> str:
    """Why an agent's episode is `AGENT_ERROR`: its exit status, or the signal that killed it
    (a command on the host; asyncio reports it as the negative signal number)."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"the agent was killed by signal {signal.Signals(-code).name}"
    return f"the agent exited with status {code}"


def _stop(proxy: AgentProxy, session: AgentSession, ctx: AgentContext | None) -> None:
    proxy.end(session)
    if ctx is not None:
        ctx.ended.set()


def _adopt_messages(env: Any, record: EpisodeRecord) -> None:
    """The agent's conversation becomes the episode's messages before the verifier runs
    (rewards that read the completion see the agent's last reply)."""
    episode = env.episode
    if episode is not None and record.messages:
        episode.messages[:] = record.messages
