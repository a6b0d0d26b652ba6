"""`corral.runner`: async rollouts, sandbox pool, policy clients and router, batches (DESIGN §6).

Names are imported on first use, so `import corral.runner` stays light (torch, transformers,
FastAPI and aiohttp load only when a policy needs them).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Policy": "policy", "GenerationRequest": "policy", "Generation": "policy",
    "Tokenizer": "policy",
    "LocalPolicy": "local_policy", "OpenAIPolicy": "openai_policy", "Router": "router",
    "PolicyServer": "serve", "create_app": "serve",
    "build_tiny_model": "models", "load_model": "models", "load_tokenizer": "models",
    "ChatTranscript": "chat",
    "Runner": "runner", "SandboxPool": "pool", "BatchAssembler": "assembly",
    "TrajectoryStore": "store", "load_run": "store", "write_report": "report",
    "ScriptedPolicy": "scripted", "ByteTokenizer": "scripted",
    "WorkItem": "episode", "EpisodeLimits": "episode", "run_episode": "episode",
    "Executor": "executor", "LocalExecutor": "executor",
    "Trajectory": "trajectory", "Batch": "trajectory", "Status": "trajectory",
    "Span": "trajectory",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
