"""Small value types of the authoring API: tasks, tool calls, messages."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["Message", "Task", "ToolCall", "content_hash"]


def content_hash(data: Any, length: int = 16) -> str:
    """A stable short hash of JSON-able data (key order does not matter)."""
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


class Task(BaseModel):
    """One task of an environment's dataset.

    Subclass it for typed task data (`class Sum(cr.Task): a: int; b: int`); the base class
    accepts any fields. `id` defaults to a hash of the content, so the same task always has the
    same id, and deterministic splits follow from it.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    id: str = ""

    @model_validator(mode="after")
    def _default_id(self) -> "Task":
        if not self.id:
            object.__setattr__(self, "id", content_hash(self.fields()))
        return self

    def fields(self) -> dict[str, Any]:
        """The task's data without its id."""
        return self.model_dump(exclude={"id"})

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


class ToolCall(BaseModel):
    """A call of one of the environment's tools, as the agent (or an oracle) makes it."""

    model_config = ConfigDict(frozen=True)

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None

    @classmethod
    def of(cls, name: str, **arguments: Any) -> "ToolCall":
        """Shorthand: `ToolCall.of("bash", command="ls")`."""
        return cls(name=name, arguments=arguments)


Message = dict[str, Any]
"""An OpenAI-style chat message: {"role": ..., "content": ..., optional "tool_calls"/"name"}."""
