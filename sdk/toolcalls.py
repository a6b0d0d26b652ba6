"""Tool calls written as text by a model (Hermes/Qwen format) and OpenAI `tool_calls` JSON.

    <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>

Parsing never raises: malformed calls come back as `ToolCallParseError` values, which an
environment shows to the agent as an error observation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .types import ToolCall

__all__ = ["ToolCallParseError", "format_tool_call", "parse_openai_tool_calls", "parse_tool_calls",
           "strip_tool_calls"]

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


@dataclass(frozen=True, slots=True)
class ToolCallParseError:
    """A tool call the model tried to make but wrote wrongly."""

    text: str
    reason: str

    def __str__(self) -> str:
        return f"Could not parse tool call ({self.reason}): {self.text[:200]}"


def format_tool_call(call: ToolCall) -> str:
    """Render a call in the text format (used for oracle transcripts and chat templates)."""
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"<tool_call>{body}</tool_call>"


def _from_obj(obj: Any, raw: str) -> ToolCall | ToolCallParseError:
    if not isinstance(obj, dict):
        return ToolCallParseError(raw, "expected a JSON object")
    if "function" in obj and isinstance(obj["function"], dict):  # OpenAI tool_calls entry
        call_id, obj = obj.get("id"), obj["function"]
    else:
        call_id = obj.get("id")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallParseError(raw, "missing 'name'")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI sends arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return ToolCallParseError(raw, f"arguments are not valid JSON: {exc.msg}")
    if not isinstance(args, dict):
        return ToolCallParseError(raw, "'arguments' must be an object")
    return ToolCall(name=name, arguments=args, id=call_id)


def parse_tool_calls(text: str) -> list[ToolCall | ToolCallParseError]:
    """Every `<tool_call>…</tool_call>` block in `text`, parsed, in order."""
    calls: list[ToolCall | ToolCallParseError] = []
    for match in _TOOL_CALL.finditer(text):
        raw = match.group(1)
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            calls.append(ToolCallParseError(raw, f"invalid JSON: {exc.msg}"))
            continue
        calls.append(_from_obj(obj, raw))
    return calls


def parse_openai_tool_calls(tool_calls: list[Any]) -> list[ToolCall | ToolCallParseError]:
    """Entries of an OpenAI chat response's `message.tool_calls`."""
    return [_from_obj(entry, json.dumps(entry, default=str)) for entry in tool_calls]


def strip_tool_calls(text: str) -> str:
    """The text with tool-call blocks removed (what the model said besides calling tools)."""
    return _TOOL_CALL.sub("", text).strip()
