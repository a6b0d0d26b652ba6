"""`corral.runner.agents`: external agent programs playing Corral envs through a
token-recording OpenAI-compatible proxy (docs/agents.md).

* `record`: `EpisodeRecord`, an episode's model calls as token-exact segments;
* `proxy`: `AgentProxy`, the run's endpoint (one URL per episode), and `AgentSession`;
* `external`: `ExternalAgent` (a command or a Python callable), `run_agent_episode`;
* `inside`: the relay that lets an agent inside the sandbox reach the proxy and nothing else.

FastAPI and uvicorn load with the proxy, on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral.lazy import lazy_exports

if TYPE_CHECKING:
    from .external import (AGENT_NAMES, AgentContext, ExternalAgent, agent_from_options,
                           kill_tree, run_agent_episode)
    from .proxy import AgentProxy, AgentSession
    from .record import EpisodeRecord

_LAZY = {"AgentProxy": "proxy", "AgentSession": "proxy", "EpisodeRecord": "record",
         "ExternalAgent": "external", "AgentContext": "external", "AGENT_NAMES": "external",
         "agent_from_options": "external", "kill_tree": "external",
         "run_agent_episode": "external"}

__all__ = ["AGENT_NAMES", "AgentContext", "AgentProxy", "AgentSession", "EpisodeRecord",
           "ExternalAgent", "agent_from_options", "kill_tree", "run_agent_episode"]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
