"""Author adversaries: hack agents an env declares for itself, for the holes only its author
knows of (`corral validate --adversarial` plays them after the library's hacks, `corral.hacks`,
and reports each by name).

An adversary is a scripted sequence of the env's own actions (tool calls or text) that must
*not* solve the task. Declare them in a list on the env, or as methods with `@cr.adversary`::

    class DiskCleanup(cr.TerminalEnv):
        adversaries = [cr.Adversary("wipe-data", [bash("rm -rf /data/*")],
                                    hint="check that the protected files are still there")]

        @cr.adversary(hint="check the kept files' content, not only their names")
        def empty_kept(self, task):
            "Empties every file it was told to keep."
            return [bash(f": > {path}") for path in task.keep]

A task any of them scores above the no-op agent is hackable, as with a library hack.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .agentbase import Agent
from .env import Action, Env
from .errors import AuthoringError

__all__ = ["Adversary", "AdversaryAgent", "adversaries_of", "adversary"]

FAMILY = "author"  # what validation reports author adversaries under
PREFIX = "adversary:"  # their agent names: `adversary:NAME`


@dataclass(frozen=True)
class Adversary:
    """One author adversary: its name, the actions it plays (a list of tool calls or texts, or
    a callable making them from the task: `fn(task)`, or `fn(self, task)` for a method), a
    one-line hint saying how to close the hole it tests, and what it does."""

    name: str
    actions: Sequence[Action] | Callable[..., Any]
    hint: str = ""
    does: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or any(c.isspace() for c in
                                                                   self.name):
            raise AuthoringError(f"adversary name {self.name!r}: a non-empty word (e.g. "
                                 "'wipe-data')")
        if isinstance(self.actions, (str, bytes)) or not (
                callable(self.actions) or isinstance(self.actions, Sequence)):
            raise AuthoringError(f"adversary {self.name!r}: actions must be a list of tool "
                                 "calls or texts, or a callable returning one, got "
                                 f"{type(self.actions).__name__}")

    @property
    def family(self) -> str:
        return FAMILY

    def agent(self) -> "AdversaryAgent":
        return AdversaryAgent(self)

    def plan(self, env: Env, task: Any) -> list[Action]:
        """The actions it plays on `task` of `env`."""
        actions = self.actions
        if callable(actions):
            wanted = inspect.signature(actions).parameters
            given = {"self": env, "env": env, "task": task}
            if any(p.kind is p.VAR_POSITIONAL or (p.name not in given and p.default is p.empty
                                                   and p.kind is not p.VAR_KEYWORD)
                   for p in wanted.values()):
                raise AuthoringError(f"adversary {self.name!r}: a callable takes (task), "
                                     "(self, task) or (env, task)")
            actions = actions(**{k: v for k, v in given.items() if k in wanted})
        if isinstance(actions, (str, dict)) or not isinstance(actions, Sequence):
            actions = [actions]
        return list(actions)


class AdversaryAgent(Agent):
    """Plays an author adversary's actions in order, then says it is done."""

    def __init__(self, adversary: Adversary) -> None:
        self.adversary, self.name = adversary, PREFIX + adversary.name

    def start(self, env: Env, seed: int | None) -> None:
        assert env.episode is not None
        self._actions = self.adversary.plan(env, env.episode.task)

    def act(self, env: Env, observation: str) -> Action:
        return self._actions.pop(0) if self._actions else "done"


def adversary(fn: Callable[..., Any] | None = None, *, name: str | None = None,
              hint: str = "") -> Any:
    """Mark an env method `(self, task) -> actions` as an author adversary (`@cr.adversary`
    or `@cr.adversary(hint=...)`); its name defaults to the method's (`_` as `-`), what it does
    to the docstring's first line."""
    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        doc = (inspect.getdoc(f) or "").strip().splitlines()
        f.__corral_adversary__ = Adversary(  # type: ignore[attr-defined]
            name or f.__name__.strip("_").replace("_", "-"), f, hint, doc[0] if doc else "")
        return f

    return mark(fn) if fn is not None else mark


def adversaries_of(env: Env | type) -> dict[str, Adversary]:
    """Every adversary an env (or env class) declares, by name: its `adversaries` list, then
    its `@cr.adversary` methods. A name used twice is an `AuthoringError`."""
    cls = env if isinstance(env, type) else type(env)
    found: dict[str, Adversary] = {}
    listed = getattr(cls, "adversaries", ()) or ()
    methods: dict[str, Any] = {}  # by attribute: a subclass's method replaces its base's
    for klass in reversed(cls.__mro__):
        methods.update(vars(klass))
    marked = [value.__corral_adversary__ for value in methods.values()
              if hasattr(value, "__corral_adversary__")]
    for item in [*listed, *marked]:
        if not isinstance(item, Adversary):
            raise AuthoringError(f"{cls.__name__}.adversaries holds {item!r:.60}; list "
                                 "cr.Adversary(name, actions, hint=...) entries")
        if item.name in found and found[item.name] is not item:
            raise AuthoringError(f"{cls.__name__}: two adversaries are named {item.name!r}")
        found[item.name] = item
    return found
