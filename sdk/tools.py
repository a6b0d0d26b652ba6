"""`@cr.tool` and `@cr.reward`: plain (async or sync) methods, schemas from their signatures.

Parameters with these names are supplied by the environment, not by the agent, and never appear
in a tool's schema: `self`, `sandbox`, `task`, `state`, `messages`, `completion`, `page`.
Everything else is an argument the agent passes; its type hint and the Google-style `Args:`
section of the docstring make the OpenAI function-calling schema, and pydantic validates the
arguments before the tool runs.
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence, get_type_hints

from pydantic import (BaseModel, ConfigDict, Field, PydanticUserError, TypeAdapter,
                      ValidationError, create_model)

from .errors import AuthoringError, InvalidToolArguments
from .toolset import ToolSet

__all__ = ["INJECTED", "RewardSpec", "ToolSpec", "Tools", "call_maybe_async", "collect", "reward",
           "tool"]

if TYPE_CHECKING:
    from .mcp import MCPTools

INJECTED = frozenset({"self", "sandbox", "task", "state", "messages", "completion", "page"})
_ARG_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$")


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Summary paragraph and per-argument descriptions from a Google-style docstring."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    section = "summary"
    for line in lines:
        stripped = line.strip()
        if stripped.lower() in ("args:", "arguments:", "parameters:"):
            section = "args"
            continue
        if stripped.lower() in ("returns:", "raises:", "yields:", "example:", "examples:"):
            section = "other"
            continue
        if section == "summary":
            if not stripped and summary:
                section = "body"
            elif stripped:
                summary.append(stripped)
        elif section == "args":
            match = _ARG_LINE.match(line)
            if match:
                params[match.group(1)] = match.group(2).strip()
            elif stripped and params:
                last = next(reversed(params))
                params[last] += " " + stripped
    return " ".join(summary), params


def _call_with(fn: Callable[..., Any], injected: dict[str, Any], args: dict[str, Any]) -> Any:
    wanted = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in injected.items() if k in wanted}
    kwargs.update(args)
    return fn(**kwargs)


async def call_maybe_async(fn: Callable[..., Any], injected: dict[str, Any],
                           args: dict[str, Any] | None = None) -> Any:
    """Call `fn` with the injected values it asks for plus `args`; await it if async."""
    result = _call_with(fn, injected, args or {})
    if inspect.isawaitable(result):
        result = await result
    return result


@dataclass(slots=True)
class ToolSpec:
    """A tool: its function, name, description and argument model."""

    fn: Callable[..., Any]
    name: str
    description: str
    args_model: type[BaseModel]

    @classmethod
    def from_function(cls, fn: Callable[..., Any], name: str | None = None,
                      description: str | None = None) -> "ToolSpec":
        summary, arg_docs = _parse_docstring(fn.__doc__)
        if not (description or summary):
            raise AuthoringError(f"tool {fn.__qualname__} needs a docstring: it becomes the "
                                 "description the agent reads")
        try:
            hints = get_type_hints(fn)
        except Exception as exc:  # unresolvable forward reference in an author's annotations
            raise AuthoringError(
                f"tool {fn.__qualname__}: cannot read type hints ({exc})") from None
        fields: dict[str, Any] = {}
        for pname, param in inspect.signature(fn).parameters.items():
            if pname in INJECTED or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            if pname not in hints:
                raise AuthoringError(f"tool {fn.__qualname__}: argument '{pname}' needs a type "
                                     "hint (it defines the schema the agent sees)")
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[pname] = (hints[pname], Field(default, description=arg_docs.get(pname)))
            try:  # a type with no JSON schema fails here, at definition, in one line
                TypeAdapter(hints[pname]).json_schema()
            except PydanticUserError as exc:  # pydantic's message goes on for paragraphs
                raise AuthoringError(
                    f"tool {fn.__qualname__}: argument '{pname}' has a type with no JSON "
                    f"schema ({str(exc).strip().splitlines()[0].split('. ')[0]}); use str, "
                    "int, float, bool, list, dict, a Literal or a pydantic model") from None
        model = create_model(f"{fn.__name__}_args", __config__=ConfigDict(extra="forbid"),
                             **fields)
        return cls(fn, name or fn.__name__, description or summary, model)

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling JSON schema of this tool."""
        params = self.args_model.model_json_schema()
        params.pop("title", None)
        for prop in params.get("properties", {}).values():
            prop.pop("title", None)
        params.setdefault("properties", {})
        return {"type": "function",
                "function": {"name": self.name, "description": self.description,
                             "parameters": params}}

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Arguments checked and converted by the argument model; raises with a clear reason."""
        try:
            parsed = self.args_model.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(
                f"'{'.'.join(str(p) for p in err['loc']) or 'arguments'}': {err['msg']}"
                for err in exc.errors())
            raise InvalidToolArguments(f"Invalid arguments for tool '{self.name}': {problems}") \
                from None
        return {name: getattr(parsed, name) for name in self.args_model.model_fields}


@dataclass(slots=True)
class RewardSpec:
    """A reward function, its weight, whether it runs after every step or once at the end, and
    whether it judges the sandbox alone (never the transcript)."""

    fn: Callable[..., Any]
    name: str
    weight: float = 1.0
    per_step: bool = False
    sandbox_only: bool = False


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None,
         description: str | None = None) -> Any:
    """Mark a method as a tool the agent can call. Its docstring and type hints are its schema.

    Usable bare (`@cr.tool`) or with options (`@cr.tool(name="sh")`).
    """

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        f.__corral_tool__ = ToolSpec.from_function(f, name, description)  # type: ignore[attr-defined]
        return f

    return mark(fn) if fn is not None else mark


def reward(fn: Callable[..., Any] | None = None, *, weight: float = 1.0,
           per_step: bool = False, name: str | None = None, sandbox_only: bool = False) -> Any:
    """Mark a method as a reward: it returns a float (or bool); the episode's reward is the
    weighted sum. `per_step=True` runs it after every step instead of once at the end.
    `sandbox_only=True` declares that it judges the sandbox's state alone, never the transcript
    (`corral validate --adversarial` then skips the hacks the verify phase provably closes)."""

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        try:
            value = float(weight)
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value):  # else every episode's reward would be NaN or an error
            raise AuthoringError(f"reward {getattr(f, '__qualname__', f)!s}: weight must be a "
                                 f"finite number, got {weight!r}")
        f.__corral_reward__ = RewardSpec(f, name or f.__name__, value, per_step, sandbox_only)  # type: ignore[attr-defined]
        return f

    return mark(fn) if fn is not None else mark


def collect(cls: type) -> tuple[dict[str, ToolSpec], dict[str, RewardSpec]]:
    """Tools and rewards declared on a class and its bases (subclasses override by name)."""
    tools: dict[str, ToolSpec] = {}
    rewards: dict[str, RewardSpec] = {}
    for klass in reversed(cls.__mro__):
        for attr in vars(klass).values():
            attr = getattr(attr, "__func__", attr)  # staticmethod/classmethod wrappers
            spec = getattr(attr, "__corral_tool__", None)
            if spec is not None:
                tools[spec.name] = spec
            rspec = getattr(attr, "__corral_reward__", None)
            if rspec is not None:
                rewards[rspec.name] = rspec
    return tools, rewards



class Tools(ToolSet):
    """Tools an env takes from outside its own methods, declared as a class attribute; they
    join the env's `@cr.tool` methods in `tool_schemas()` and `call_tool`::

        class Notes(cr.TerminalEnv):
            notes = cr.Tools.from_mcp("python3 /opt/notes_server.py")

    Each episode connects once after `setup`; the connection closes with the episode. A set of
    another kind subclasses `ToolSet` (`corral.toolset`) and defines `schemas` and `connect`.
    """

    @staticmethod
    def from_mcp(server: str | Sequence[str], **options: Any) -> "MCPTools":
        """An MCP server's tools: a command (started per episode inside the env's sandbox,
        spoken to over stdio) or an `http(s)://` URL (streamable HTTP; a URL ending in `/sse`:
        SSE). Options: see `corral.mcp.MCPTools`. Needs the `mcp` extra."""
        from .mcp import MCPTools

        return MCPTools(server, **options)
