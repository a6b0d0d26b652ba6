"""`corral.runner`: async rollouts, sandbox pool, policy clients and router, batches.

Names are imported on first use, so `import corral.runner` stays light (torch, transformers,
FastAPI and aiohttp load only when a policy needs them). The inference engines live in the
`corral.runner.policy` subpackage; its public names are re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral.lazy import lazy_exports

from . import policy as _policy  # light: the contract only; its engines are lazy in turn

if TYPE_CHECKING:  # editors and type checkers resolve the lazy names; nothing runs
    from corral.runner.assembly import AssemblyConfig, BatchAssembler
    from corral.runner.episode import EpisodeLimits, WorkItem, run_episode
    from corral.runner.executor import Executor, LocalExecutor
    from corral.runner.pool import SandboxPool
    from corral.runner.report import write_report
    from corral.runner.runner import Runner
    from corral.runner.store import TrajectoryStore, load_run
    from corral.runner.trajectory import Batch, Span, Status, Trajectory

_EXPORTS = {
    # the inference side keeps its own table of public names; they are the runner's too
    **dict.fromkeys(_policy.__all__, "policy"),
    "Runner": "runner", "SandboxPool": "pool",
    "BatchAssembler": "assembly", "AssemblyConfig": "assembly", "RolloutTally": "assembly",
    "TrajectoryStore": "store", "load_run": "store", "write_report": "report",
    "WorkItem": "episode", "EpisodeLimits": "episode", "run_episode": "episode",
    "Executor": "executor", "LocalExecutor": "executor",
    "Trajectory": "trajectory", "Batch": "trajectory", "Status": "trajectory",
    "Span": "trajectory",
    "ExternalAgent": "agents.external", "AgentProxy": "agents.proxy",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
