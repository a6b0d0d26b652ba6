"""`Agent`, the base of scripted agents: its own module so that agent libraries
(`corral.hacks`) and the agent table (`corral.agents`, which names them) import it without
importing each other."""

from __future__ import annotations

from .env import Action, Env
from .errors import AgentError

__all__ = ["Agent"]


class Agent:
    """Chooses the next action from the episode so far."""

    name = "agent"

    def start(self, env: Env, seed: int | None) -> None:
        """Called after reset."""

    def act(self, env: Env, observation: str) -> Action:
        raise AgentError(f"{type(self).__name__} must define act()")
