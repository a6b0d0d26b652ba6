"""`@cr.environment`: declare an environment in class form or function form.

Class form decorates a subclass of `cr.TextEnv`/`cr.TerminalEnv`/`cr.BrowserEnv`. Function form
decorates a function `task -> prompt` and makes a single-turn `TextEnv`; its rewards are added
with `@fn.reward` on functions of `(task, completion)`, its oracle with `@fn.solution`.
Either way the class is registered in the default catalog under `id` (unless `register=False`);
an env listed in a `corral.toml` leaves the id out and takes its id, tags and description
from the manifest.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from .dataset import Dataset
from .env import Env, TextEnv, check_max_turns
from .errors import AuthoringError
from .sandbox.spec import SandboxSpec
from .tools import reward as reward_mark
from .types import Task

__all__ = ["FunctionEnv", "environment"]


class FunctionEnv(TextEnv):
    """A single-turn text env made from a prompt function (function form)."""

    _prompt_fn: Callable[[Task], str]
    _solution_fn: Callable[[Task], Any] | None = None

    def instruction(self, task: Task) -> str:
        return str(type(self)._prompt_fn(task))

    def solution(self, task: Task) -> Any:
        fn = type(self)._solution_fn
        if fn is None:
            return super().solution(task)
        return fn(task)

    @classmethod
    def reward(cls, fn: Callable[..., Any] | None = None, *, weight: float = 1.0,
               per_step: bool = False) -> Any:
        """Add a reward function of `(task, completion)` (any injected names work)."""

        def add(f: Callable[..., Any]) -> Callable[..., Any]:
            marked = reward_mark(f, weight=weight, per_step=per_step)
            setattr(cls, f"_reward_{f.__name__}", staticmethod(marked))
            return f

        return add(fn) if fn is not None else add

    @classmethod
    def solution_fn(cls, fn: Callable[[Task], Any]) -> Callable[[Task], Any]:
        cls._solution_fn = staticmethod(fn)  # type: ignore[assignment]
        return fn


def environment(id: str | type | Callable[..., Any] | None = None, *, tasks: Any = None,
                sandbox: SandboxSpec | None = None, max_turns: int | None = None,
                tags: list[str] | tuple[str, ...] = (), task_type: type[Task] | None = None,
                description: str | None = None, register: bool = True, override: bool = False,
                **metadata: Any) -> Any:
    """Declare an environment and, given an `id` (`namespace/name-vN`), register it under it.

    An env listed in a `corral.toml` (`[[env]]` with `id`, `tags`, `description`) takes them
    from there: write `@cr.environment(tasks=...)` (or a bare `@cr.environment`) and the catalog's
    spec gives each instance its id and tags when it is made. A single-file env with no manifest
    names its `id` (and `tags`, `description`) here.

    An id already taken by another env (from code, a built-in or an installed release) raises
    `DuplicateRegistration`; `override=True` replaces that env on purpose.
    """
    if id is not None and not isinstance(id, str):  # bare `@cr.environment` on the class
        return environment()(id)
    from .catalog import default_catalog, parse_id

    if id is None:
        given = [name for name, value in (("description", description), ("override", override),
                                          *metadata.items()) if value]
        if given:
            raise AuthoringError(f"@environment: {', '.join(given)} describe a registration and "
                                 "need an id; an env listed in a corral.toml writes them there")
    else:
        parse_id(id, require_version=True)
    if max_turns is not None:
        check_max_turns(max_turns, id or "@environment")
    if isinstance(tags, str):  # tags="math" is one tag, not the letters m, a, t, h
        tags = (tags,)

    def wrap(obj: Any) -> Any:
        if inspect.isclass(obj):
            if not issubclass(obj, Env):
                raise AuthoringError(f"@environment class {obj.__name__} must subclass "
                                     "cr.TextEnv, cr.TerminalEnv or cr.BrowserEnv")
            cls = obj
        elif callable(obj):
            cls = type(obj.__name__, (FunctionEnv,), {
                "_prompt_fn": staticmethod(obj), "__doc__": obj.__doc__,
                "__module__": obj.__module__, "__qualname__": obj.__qualname__})
            cls.solution = _bind_solution  # type: ignore[attr-defined]
        else:
            raise AuthoringError(f"@environment decorates a class or a function, not {obj!r}")
        ttype = task_type or getattr(cls, "task_type", None) or cls.tasks.task_type
        cls.tasks = Dataset.coerce(tasks if tasks is not None else cls.tasks, ttype)
        if id is not None:
            cls.env_id = id
        if max_turns is not None:
            cls.max_turns = max_turns
        if tags:
            cls.tags = tuple(tags)
        if sandbox is not None:
            cls.sandbox_spec = sandbox
        if register and id is not None:
            default_catalog.register(id, entry_point=cls, kind=cls.kind, tags=list(cls.tags),
                                     description=description or _first_line(cls.__doc__),
                                     override=override, **metadata)
        return cls

    return wrap


class _SolutionDescriptor:
    """`fn.solution` on a function-form env: a decorator on the class, the oracle on instances."""

    def __get__(self, instance: Any, owner: type) -> Any:
        if instance is None:
            return owner.solution_fn
        return lambda task: FunctionEnv.solution(instance, task)


_bind_solution = _SolutionDescriptor()


def _first_line(doc: str | None) -> str:
    lines = inspect.cleandoc(doc).strip().splitlines() if doc else []
    return lines[0] if lines else ""  # a docstring of blanks describes nothing
