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

from . import errors
from .dataset import Dataset
from .env import Env, Episode, TextEnv
from .environment import environment
from .sandbox.spec import Browser, Terminal
from .tools import reward, tool
from .types import Task, ToolCall

__version__ = "0.1.0"


def __getattr__(name: str):  # registry functions, imported lazily (registry depends on sdk)
    if name in ("register", "make", "spec", "registry", "deprecate"):
        import corral.registry as registry

        return registry if name == "registry" else getattr(registry, name)
    if name in _LAZY:
        module_name, attr = _LAZY[name]
        import importlib

        return getattr(importlib.import_module(module_name), attr)
    raise AttributeError(f"module 'corral' has no attribute {name!r}")


# Names that live in heavier modules, loaded on first use.
_LAZY: dict[str, tuple[str, str]] = {
    "BrowserEnv": ("corral.browser.env", "BrowserEnv"),
    "TerminalEnv": ("corral.terminal", "TerminalEnv"),
    "load_harbor": ("corral.harbor", "load_harbor"),
    "mix": ("corral.registry.curation", "mix"),
}

__all__ = ["Browser", "BrowserEnv", "Dataset", "Env", "Episode", "Task", "Terminal",
           "TerminalEnv", "TextEnv", "ToolCall", "environment", "errors", "load_harbor", "make",
           "register", "registry", "reward", "spec", "tool", "__version__"]
