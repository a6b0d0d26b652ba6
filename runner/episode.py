"""The episode loop: one attempt at one work item, from reset to verified rewards, as tokens.

The trajectory's token ids are built turn by turn and never re-tokenized: the prompt is the
policy tokenizer's chat template over the env's first messages (tools included), then each
turn appends the ids the policy generated (`loss_mask` 1, tagged with the `Generation`'s
version) and the encoded environment turn (`loss_mask` 0), using `corral.runner.policy.chat`.

Sandbox start and task setup overlap with the first inference call: the first prompt needs
only the instruction, so the first `generate` starts before the episode is even admitted to
a sandbox slot and runs while it waits and while `env.areset` sets up (if the env's messages
after reset differ from the predicted ones, that generation is discarded).
Envs whose first message needs setup's result (`instruction_is_first_message = False`, e.g.
browser envs: the page is in it) skip that early call.

Failures are classified, never raised (except cancellation): `InfraError` (sandbox, browser,
`PolicyError` from a server) and unexpected exceptions from env code end the attempt as
`Status.INFRA_ERROR` (the runner retries it with a fresh sandbox); an `AgentError` escaping
the env ends it as `Status.AGENT_ERROR` (recorded, not retried). Deadlines (per turn, per
episode), max turns and an env that cannot go on (`EpisodeTruncated`: a page that stopped
responding) end it as `Status.TRUNCATED` with rewards computed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

from corral.errors import AgentError, EpisodeTruncated, InfraError
from corral.runner.boundary import TurnBoundary, adopt_boundary
from corral.runner.policy import ChatTranscript, Generation, GenerationRequest, Policy
from corral.runner.policy.base import checked_generation
from corral.runner.policy.sampling import check_max_tokens, check_temperature, check_top_p
from corral.runner.pool import span_sink
from corral.runner.trajectory import Span, Status, Trajectory
from corral.toolcalls import parse_openai_tool_calls

__all__ = ["BoundaryHook", "EpisodeLimits", "Restore", "WorkItem", "run_episode"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One trajectory to collect: sample `sample` of group `group` (task `task_index` of env
    `env_index`). Ids are deterministic, which is what makes resuming exact."""

    group: int
    sample: int
    env_index: int
    env_id: str
    task_index: int
    seed: int
    restart: int = 0  # times this item was cut and restarted (a new episode, same id)

    @property
    def group_id(self) -> str:
        return f"g{self.group:06d}"

    @property
    def id(self) -> str:
        return f"{self.group_id}-s{self.sample:03d}"


@dataclass(slots=True)
class EpisodeLimits:
    """Sampling settings and limits of every episode of a run."""

    max_turns: int | None = None
    max_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    turn_deadline: float | None = None
    episode_deadline: float | None = None
    verify_deadline: float = 120.0
    max_context: int | None = None  # prompt + generation tokens; default: the policy's limit

    def __post_init__(self) -> None:
        """A ValueError naming the field out of range: 0 tokens, a negative or NaN deadline
        would end or refuse every episode of the run."""
        check_max_tokens(self.max_tokens)
        check_temperature(self.temperature)
        check_top_p(self.top_p)
        for name in ("max_turns", "max_context"):
            value = getattr(self, name)
            if value is not None and not value >= 1:
                raise ValueError(f"{name} must be at least 1 (or None), got {value!r}")
        for name in ("turn_deadline", "episode_deadline", "verify_deadline"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:  # NaN fails both
                raise ValueError(f"{name} must be a finite number of seconds above 0, got "
                                 f"{value!r}")


BoundaryHook = Callable[["_Episode", ChatTranscript, Generation], Awaitable[None]]
"""Called at every turn boundary, after the env's answer is in the transcript (the episode,
its transcript, and the turn's generation): where the runner records a boundary, snapshots the
sandbox and branches a tree group."""
Restore = Callable[[TurnBoundary], Awaitable[Any]]
"""Starts the sandbox an episode continuing from a boundary runs in (from its snapshot)."""


class _Deadline(Exception):
    def __init__(self, which: str) -> None:
        super().__init__(f"{which} deadline reached")
        self.which = which


@contextlib.asynccontextmanager
async def _deadline(seconds: float | None, which: str) -> AsyncIterator[None]:
    """`asyncio.timeout` whose own expiry raises `_Deadline` (other TimeoutErrors pass)."""
    if seconds is None:
        yield
        return
    try:
        async with asyncio.timeout(seconds) as cm:
            yield
    except TimeoutError:
        if cm.expired():
            raise _Deadline(which) from None
        raise


class _Episode:
    """State of one attempt (kept off the Trajectory so the dataclass stays a record)."""

    def __init__(self, env: Any, policy: Policy, item: WorkItem, limits: EpisodeLimits,
                 inference: asyncio.Semaphore, traj: Trajectory, attempt: int,
                 start: TurnBoundary | None = None, restore: Restore | None = None,
                 at_boundary: BoundaryHook | None = None) -> None:
        self.env, self.policy, self.item, self.limits = env, policy, item, limits
        self.start, self.restore, self.at_boundary = start, restore, at_boundary
        self.inference, self.traj = inference, traj
        restart = f"#r{item.restart}" if item.restart else ""
        self.session = f"{item.id}{restart}#a{attempt}"  # one router session per episode
        self.turn = 0
        self.max_context = limits.max_context or getattr(policy, "max_positions", None)
        self.predicted: list[dict[str, Any]] | None = None
        self.transcript: ChatTranscript | None = None
        self.first: asyncio.Future[Generation | None] | None = None  # see start_first_generation

    # --- phases --------------------------------------------------------------------------------
    async def reset(self) -> None:
        start = time.time()
        await self.env.areset(seed=self.item.seed, options={"task_index": self.item.task_index})
        self.traj.task_id = self.env.episode.task.id  # a remote env learns it only now
        waits = [s for s in self.traj.spans if s.phase == "sandbox_wait" and s.start >= start]
        self.traj.spans.append(Span("setup", waits[-1].end if waits else start, time.time()))

    async def generate(self, transcript: ChatTranscript) -> Generation | None:
        """One policy call under the inference semaphore; None when the context is full."""
        max_tokens = self.limits.max_tokens
        if self.max_context:
            max_tokens = min(max_tokens, int(self.max_context) - len(transcript.ids))
            if max_tokens < 1:
                return None
        request = GenerationRequest(
            prompt_ids=list(transcript.ids), max_tokens=max_tokens,
            temperature=self.limits.temperature, top_p=self.limits.top_p,
            session_id=self.session, seed=self.item.seed * 1009 + self.turn)
        queued = time.time()
        async with self.inference:
            admitted = time.time()
            gen = checked_generation(await self.policy.generate(request), self.policy)
        done = time.time()
        decode_from = min(done, admitted + max(0.0, gen.queue_seconds))
        self.traj.spans.append(Span("queue", queued, decode_from))
        self.traj.spans.append(Span("decode", decode_from, done))
        return gen

    async def step(self, gen: Generation) -> tuple[bool, bool]:
        """Apply the generation to the env; returns (terminated, truncated)."""
        action: Any = gen.text
        if gen.tool_calls:  # OpenAI-style servers may return structured tool calls
            action = parse_openai_tool_calls(list(gen.tool_calls))
        began = time.time()
        _, _, terminated, truncated, _ = await self.env.astep(action)
        # a step that ended the episode ran the verifier too: that is the "verify" span's
        episode = self.env.episode
        verified = episode.verify_span if episode is not None else None
        ended = verified[0] if verified is not None and verified[0] >= began else time.time()
        self.traj.spans.append(Span("env", began, ended))
        return terminated, truncated

    # --- the loop ------------------------------------------------------------------------------
    def start_first_generation(self) -> None:
        """Predict the first messages from the task and start generating the first turn now,
        before a sandbox is assigned (envs whose first message needs setup skip this)."""
        env = self.env
        task = env.pick_task({"task_index": self.item.task_index})
        self.traj.task_id = task.id
        self.predicted = ([{"role": "system", "content": env.system_prompt}]
                          if env.system_prompt else []) + [
            {"role": "user", "content": env.instruction(task)}]
        if getattr(env, "instruction_is_first_message", True):
            self.transcript = ChatTranscript(self.policy.tokenizer, self.predicted,
                                             tools=env.tool_schemas() or None)
            self.first = asyncio.ensure_future(self.generate(self.transcript))

    async def drop_first_generation(self) -> None:
        """Cancel the early first generation (unused, or the episode ends before using it)."""
        first, self.first = self.first, None
        if first is not None:
            first.cancel()  # no-op when it finished
            await asyncio.gather(first, return_exceptions=True)

    async def resume(self, boundary: TurnBoundary) -> ChatTranscript:
        """Continue from `boundary`: its sandbox restored (`restore`), the env's episode, the
        trajectory's tokens and the transcript as they were after its turn."""
        if self.restore is None:
            raise InfraError("an episode continuing from a turn boundary needs a restore")
        began = time.time()
        sandbox = await self.restore(boundary)
        await adopt_boundary(self.env, boundary, sandbox, self.item.task_index)
        self.traj.spans.append(Span("setup", began, time.time()))
        boundary.fill(self.traj)
        self.traj.task_id = boundary.task_id
        self.turn = boundary.turn
        return ChatTranscript.resume(self.policy.tokenizer, boundary.transcript,
                                     boundary.token_ids, tools=self.env.tool_schemas() or None)

    async def play(self) -> None:
        env, traj = self.env, self.traj
        pending: asyncio.Future[Generation | None] | None = None
        if self.start is not None:
            transcript = await self.resume(self.start)
        else:
            transcript, pending = await self.begin()
        while True:
            async with _deadline(self.limits.turn_deadline, "turn"):
                if pending is not None:
                    gen, pending = await pending, None
                else:
                    gen = await self.generate(transcript)
                if gen is None:
                    raise _Deadline("context")
                traj.append(gen.token_ids, generated=True, logprobs=gen.logprobs,
                            version=gen.version)
                transcript.add_generation(gen.token_ids, gen.text)
                self.turn += 1
                before = len(env.episode.messages)
                terminated, truncated = await self.step(gen)
            if terminated or truncated:
                traj.status = Status.TRUNCATED if truncated else Status.COMPLETE
                return
            # the env appended our assistant message, then tool results / its reply
            new_ids = transcript.add_messages(env.episode.messages[before + 1:])
            traj.append(new_ids, generated=False)
            if self.at_boundary is not None:
                await self.at_boundary(self, transcript, gen)

    async def begin(self) -> tuple[ChatTranscript, asyncio.Future[Generation | None]]:
        """Reset the env; the transcript of its first messages and the first generation."""
        env, traj = self.env, self.traj
        assert self.predicted is not None, "run_episode starts the first generation first"
        tools = env.tool_schemas() or None
        await self.reset()
        transcript, first = self.transcript, self.first
        if transcript is None or env.episode.messages != self.predicted:
            await self.drop_first_generation()  # the instruction depended on setup after all
            transcript = ChatTranscript(self.policy.tokenizer, env.episode.messages, tools=tools)
            first = asyncio.ensure_future(self.generate(transcript))
        self.first = None
        traj.append(list(transcript.ids), generated=False)
        return transcript, first

    async def truncate(self, why: str) -> None:
        """End the episode early (deadline, context) and still compute its rewards."""
        episode = self.env.episode
        self.traj.status = Status.TRUNCATED
        self.traj.metadata["truncated_by"] = why
        if episode is None or episode.done:
            return
        async with _deadline(self.limits.verify_deadline, "verify"):
            await self.env.afinish(truncated=True)


async def run_episode(env: Any, policy: Policy, item: WorkItem, limits: EpisodeLimits,
                      inference: asyncio.Semaphore, *, attempt: int = 1,
                      spans: list[Span] | None = None,
                      admission: contextlib.AbstractAsyncContextManager[Any] | None = None,
                      start: TurnBoundary | None = None, restore: Restore | None = None,
                      at_boundary: BoundaryHook | None = None) -> Trajectory:
    """One attempt at `item` with `env` (an instance the caller does not share meanwhile);
    `spans` are phases already spent on it. `admission`, when given, is entered after the
    first generation has started and held while the episode uses its sandbox (a slot of the
    executor's sandbox capacity): the first turn decodes while the episode waits for it.
    `start`: continue from this turn boundary, in a sandbox `restore` starts from it (no
    reset, no setup); `at_boundary`: called after every turn (`BoundaryHook`)."""
    traj = Trajectory(id=item.id, env_id=item.env_id, task_id="", group_id=item.group_id,
                      attempts=attempt,
                      metadata={"task_index": item.task_index, "sample": item.sample,
                                "seed": item.seed, "group": item.group})
    if limits.max_turns is not None:
        env.max_turns = limits.max_turns
    traj.spans.extend(spans or ())
    run = _Episode(env, policy, item, limits, inference, traj, attempt, start, restore,
                   at_boundary)
    token = span_sink.set(traj.spans)
    try:
        if start is None:
            run.start_first_generation()
        async with admission if admission is not None else contextlib.nullcontext():
            try:
                async with _deadline(limits.episode_deadline, "episode"):
                    await run.play()
            except _Deadline as exc:
                await run.truncate(exc.which)
            except EpisodeTruncated as exc:  # an env outcome (a hung page), not a retry
                await run.truncate(exc.reason)
    except (InfraError, _Deadline) as exc:  # _Deadline here: the verifier itself timed out
        _fail(traj, env, Status.INFRA_ERROR, exc)
    except AgentError as exc:
        _fail(traj, env, Status.AGENT_ERROR, exc)
    except Exception as exc:  # env or policy code raised: not the agent's fault, retry it
        log.warning("episode %s raised %s: %s", item.id, type(exc).__name__, exc)
        _fail(traj, env, Status.INFRA_ERROR, exc)
    except asyncio.CancelledError:
        if env.episode is not None:  # cut by the runner: do not hand a half-used sandbox on
            env.episode.infra_error = "cancelled"
        raise
    finally:
        span_sink.reset(token)
        await run.drop_first_generation()
        _collect_outcome(traj, env)
        await _close(env, traj)
    return traj


def _fail(traj: Trajectory, env: Any, status: Status, exc: BaseException) -> None:
    traj.status = status
    traj.error = f"{type(exc).__name__}: {exc}"
    if status is Status.INFRA_ERROR and env.episode is not None:
        env.episode.infra_error = traj.error  # so its sandbox is replaced, not reused


def _collect_outcome(traj: Trajectory, env: Any) -> None:
    episode = env.episode
    if episode is None:
        return
    traj.reward = float(episode.reward)
    traj.rewards = {k: float(v) for k, v in episode.rewards.items()}
    traj.turns = int(episode.turn)
    traj.messages = [dict(m) for m in episode.messages]
    if episode.verify_span is not None:
        traj.spans.append(Span("verify", *episode.verify_span))
    if episode.errors:
        traj.metadata["errors"] = list(episode.errors)
        traj.error = traj.error or episode.errors[0]
    if episode.verifier_error:  # the env's bug, not the agent's: masked from training
        traj.status = Status.VERIFIER_ERROR
        traj.error = episode.verifier_error


async def _close(env: Any, traj: Trajectory) -> None:
    try:
        await env.aclose()
    except Exception as exc:  # the sandbox is gone either way; record it, do not fail
        log.warning("closing the env of %s failed: %s", traj.id, exc)
        traj.metadata["close_error"] = f"{type(exc).__name__}: {exc}"
    env.episode = None
