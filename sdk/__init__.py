"""Corral: write environments for LLM agents, publish them, and train against them.

    import corral as cr

    @cr.environment("demo/add-v0", tasks=[{"a": 1, "b": 2}])
    def add(task):
        return f"What is {task.a} + {task.b}? Answer with the number only."

    @add.reward
    def correct(task, completion):
        return completion.strip() == str(task.a + task.b)

    env = cr.make("demo/add-v0")
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import errors
from .adversaries import Adversary, adversary
from .dataset import Dataset
from .env import Env, Episode, TextEnv
from .environment import environment
from .sandbox.spec import Browser, Terminal
from .tools import Tools, reward, tool
from .types import Task, ToolCall

if TYPE_CHECKING:  # editors and type checkers resolve the lazy names; nothing runs
    from corral.browser.env import BrowserEnv
    from corral.integrations.harbor import load_harbor
    from corral.registry import deprecate, make, register, spec
    from corral.registry.curation import mix
    from corral.runner.eval.evaluation import evaluate
    from corral.serve.client import remote
    from corral.terminal import TerminalEnv

__version__ = "0.1.0"

# The facade: `import corral as cr` stays light, and the heavier names and the upper layers load
# on first attribute access (PEP 562). This is the one place the SDK names upper layers, and only
# by string: nothing here runs at import time, so the layers below import no layer above.
_LAZY: dict[str, tuple[str, str]] = {
    "BrowserEnv": ("corral.browser.env", "BrowserEnv"),
    "TerminalEnv": ("corral.terminal", "TerminalEnv"),
    "load_harbor": ("corral.integrations.harbor", "load_harbor"),
    # Catalog functions go through the registry so the built-in envs and installed releases
    # are in the catalog `cr.make` reads (the SDK's catalog alone knows only code registrations).
    "register": ("corral.registry", "register"),
    "make": ("corral.registry", "make"),
    "spec": ("corral.registry", "spec"),
    "deprecate": ("corral.registry", "deprecate"),
    "mix": ("corral.registry.curation", "mix"),
    "evaluate": ("corral.runner.eval.evaluation", "evaluate"),
    "remote": ("corral.serve.client", "remote"),
    "ExternalAgent": ("corral.runner.agents.external", "ExternalAgent"),
}
_SUBPACKAGES = ("browser", "envs", "registry", "runner", "sandbox", "trainer")


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"corral.{name}")
    if name in _LAZY:
        module_name, attr = _LAZY[name]
        return getattr(importlib.import_module(module_name), attr)
    raise AttributeError(f"module 'corral' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBPACKAGES))


# The subpackages are attributes (`cr.runner.Runner`) but not star-exported: `from corral import
# *` must not pull in torch.
__all__ = ["Adversary", "Browser", "Dataset", "Env", "Episode", "Task", "Terminal", "TextEnv",
           "ToolCall", "Tools", "adversary", "environment", "errors", "reward", "tool",
           "__version__", *_LAZY]

# Every Corral env id is a Gymnasium id too: `gymnasium.make("corral/arithmetic-v0")` after
# `import corral` (Gymnasium 1.x has no plugin entry points; its packages register at import).
from .catalog import register_gymnasium_envs as _register_gymnasium_envs  # noqa: E402

_register_gymnasium_envs()
