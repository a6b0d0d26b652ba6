"""Scripted agents (oracle, random, no-op) and `play`, which runs one episode with one of them.

These are what validation and `corral run` use: the oracle must pass every task, the no-op agent
must fail every task, and the random agent gives a floor for difficulty profiles.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .adversaries import PREFIX, adversaries_of
from .agentbase import Agent
from .env import Action, Env
from .errors import AgentError, InfraError
from .hacks import HACKS
from .suggest import closest

__all__ = ["AGENTS", "Agent", "EpisodeResult", "NoopAgent", "OracleAgent", "RandomAgent",
           "agent_names", "make_agent", "play"]


class OracleAgent(Agent):
    """Plays the env's `solution(task)` actions in order, then says it is done."""

    name = "oracle"

    def start(self, env: Env, seed: int | None) -> None:
        assert env.episode is not None
        actions = env.solution(env.episode.task)
        self._actions = [actions] if isinstance(actions, str) else list(actions)

    def act(self, env: Env, observation: str) -> Action:
        return self._actions.pop(0) if self._actions else "done"


class NoopAgent(Agent):
    """Does nothing: ends the episode at once with an empty answer."""

    name = "noop"

    def act(self, env: Env, observation: str) -> Action:
        return ""


class RandomAgent(Agent):
    """Takes the env's `random_action` every turn."""

    name = "random"

    def start(self, env: Env, seed: int | None) -> None:
        self._rng = random.Random(seed)

    def act(self, env: Env, observation: str) -> Action:
        assert env.episode is not None
        return env.random_action(env.episode.task, self._rng)


AGENTS: dict[str, Callable[[], Agent]] = {
    "oracle": OracleAgent, "noop": NoopAgent, "random": RandomAgent}


@dataclass
class EpisodeResult:
    """The outcome of one scripted episode."""

    env_id: str | None
    task_id: str
    agent: str
    reward: float
    rewards: dict[str, float] = field(default_factory=dict)
    turns: int = 0
    truncated: bool = False
    errors: list[str] = field(default_factory=list)
    infra_error: str | None = None
    verifier_error: str | None = None  # the env's verifier broke (its bug, not the agent's)
    seconds: float = 0.0
    threshold: float = 1.0  # the env's pass threshold

    @property
    def passed(self) -> bool:
        """Solved: reward at least the env's pass threshold, no verifier or infrastructure
        error."""
        return (self.reward >= self.threshold - 1e-9 and not self.errors
                and self.infra_error is None and self.verifier_error is None)

    @property
    def partial(self) -> bool:
        """Partial credit: some reward, below the pass threshold."""
        return 0 < self.reward < self.threshold - 1e-9


def agent_names(env: Env | None = None) -> list[str]:
    """Every name `make_agent` accepts: the scripted agents, then `hack:NAME` for each hack
    agent of `corral.hacks`, then `adversary:NAME` for each author adversary of `env`."""
    authors = [PREFIX + name for name in adversaries_of(env)] if env is not None else []
    return [*AGENTS, *(f"hack:{name}" for name in HACKS), *authors]


def make_agent(name: str, env: Env | None = None) -> Agent:
    """A scripted agent by name: "oracle", "noop", "random", "hack:NAME" (a hack agent of
    `corral.hacks`) or "adversary:NAME" (an author adversary `env` declares,
    `corral.adversaries`). An unknown name raises `AgentError` with the closest known names."""
    if name in AGENTS:
        return AGENTS[name]()
    hack = name.removeprefix("hack:")
    if name.startswith("hack:") and hack in HACKS:
        return HACKS[hack].agent()
    if name.startswith(PREFIX):
        if env is None:
            raise AgentError(f"agent {name!r}: an author adversary is one of an env's; give "
                             "the env (make_agent(name, env))")
        authors = adversaries_of(env)
        if name.removeprefix(PREFIX) in authors:
            return authors[name.removeprefix(PREFIX)].agent()
        declared = ", ".join(PREFIX + n for n in authors) or "none"
        raise AgentError(f"unknown agent {name!r}.{closest(name, agent_names(env))} "
                         f"{env.env_id or type(env).__name__} declares: {declared}")
    # the closest names only: all twenty-odd hacks would bury them
    raise AgentError(f"unknown agent {name!r}.{closest(name, agent_names(env))} Known: "
                     f"{', '.join(AGENTS)}, hack:NAME (NAME: one of the {len(HACKS)} hacks "
                     "of corral.hacks.HACKS), adversary:NAME (the env's own adversaries)")


async def play(env: Env, agent: Agent | str, *, seed: int | None = None,
               options: dict[str, Any] | None = None) -> EpisodeResult:
    """Run one full episode of `env` with `agent` (an `Agent` or a `make_agent` name);
    infrastructure errors are recorded, not raised. A coroutine: `await play(...)`, or
    `asyncio.run(play(...))` outside an event loop."""
    agent = make_agent(agent, env) if isinstance(agent, str) else agent
    started = time.monotonic()
    result = EpisodeResult(env.env_id, "", agent.name, 0.0, threshold=env.pass_threshold)
    try:
        observation, info = await env.areset(seed=seed, options=options)
        result.task_id = info["task_id"]
        agent.start(env, seed)
        done = False
        while not done:
            observation, _, terminated, truncated, info = await env.astep(
                agent.act(env, observation))
            done = terminated or truncated
        episode = env.episode
        assert episode is not None
        result.reward, result.rewards = episode.reward, dict(episode.rewards)
        result.turns, result.truncated = episode.turn, episode.truncated
        result.errors = list(episode.errors)
        result.verifier_error = episode.verifier_error
    except InfraError as exc:
        result.infra_error = f"{type(exc).__name__}: {exc}"
    finally:
        await env.aclose()
        result.seconds = time.monotonic() - started
    return result
