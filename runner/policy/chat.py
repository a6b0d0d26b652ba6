"""Chat templates as token ids, built incrementally, and tool calls parsed from model output.

The episode loop keeps one growing token sequence per trajectory. History is never
re-tokenized: each new message is rendered by the tokenizer's own chat template (as the
difference between the rendering with and without it) and only that difference is encoded.
`ChatTranscript` does this bookkeeping for one conversation.

Tool calls come either as OpenAI `tool_calls` objects (from an API response) or as text in the
Hermes/Qwen format `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; the parsing is
`corral.toolcalls` (shared with the environments). A malformed call becomes a
`ToolCallParseError` value (never an exception) so the environment can show it to the agent.
"""

from __future__ import annotations

import functools
import hashlib
import json
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

from corral.errors import ModelError
from .base import Tokenizer
from corral.toolcalls import (ToolCallParseError, parse_openai_tool_calls, parse_tool_calls,
                              strip_tool_calls)
from corral.types import ToolCall

_SENTINEL = "\u2063corral-sentinel\u2063"
# A neutral conversation for rendering one message "in context" when the caller gives none.
_DEFAULT_CONTEXT: list[dict[str, Any]] = [
    {"role": "system", "content": "x"}, {"role": "user", "content": "x"},
    {"role": "assistant", "content": "x"}]


# --- rendering ----------------------------------------------------------------------------
def render(tokenizer: Tokenizer, messages: Sequence[dict[str, Any]], *,
           tools: Sequence[dict[str, Any]] | None = None,
           add_generation_prompt: bool = False) -> str:
    """The chat template's text for `messages` (no tokenization)."""
    return tokenizer.apply_chat_template(list(messages), tools=list(tools) if tools else None,
                                         add_generation_prompt=add_generation_prompt,
                                         tokenize=False)


def encode_prompt(tokenizer: Tokenizer, messages: Sequence[dict[str, Any]], *,
                  tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
    """Token ids of a whole conversation followed by the assistant generation prompt."""
    text = render(tokenizer, messages, tools=tools, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def _suffix(tokenizer: Tokenizer, before: Sequence[dict[str, Any]],
            after: Sequence[dict[str, Any]], *, generation_prompt: bool = False) -> str:
    head = render(tokenizer, before)
    full = render(tokenizer, after, add_generation_prompt=generation_prompt)
    if not full.startswith(head):
        raise ModelError("this tokenizer's chat template re-renders earlier messages when one is "
                         "added, so turns cannot be encoded incrementally; use a template whose "
                         "rendering of a conversation is a prefix of its rendering with more turns")
    return full[len(head):]


def encode_turn(tokenizer: Tokenizer, message: dict[str, Any], *,
                previous: Sequence[dict[str, Any]] | None = None) -> list[int]:
    """Token ids of one message as the template renders it after `previous` messages.

    `previous` defaults to a neutral system/user/assistant exchange, which is right for tool
    results and user follow-ups in templates that render each message on its own.
    """
    context = list(previous) if previous else _DEFAULT_CONTEXT
    return tokenizer.encode(_message_text(tokenizer, context, message), add_special_tokens=False)


# Rendering the whole conversation twice for every new message costs O(turns) each time; a
# 30-turn episode's transcript spent most of the runner's CPU there. Chat templates render a
# message from itself, its neighbours and the conversation's first message (system prompt,
# tools), so the new message's text is the same after [first, *last RECENT]. That is checked
# against the full rendering on a tokenizer's first CHECKS messages; a template that disagrees
# once (or fails on the shortened context) is always rendered in full.
_RECENT, _CHECKS = 2, 8
_bounded_checks: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()


def _message_text(tokenizer: Tokenizer, context: list[dict[str, Any]],
                  message: dict[str, Any]) -> str:
    if len(context) <= _RECENT + 1:
        return _suffix(tokenizer, context, [*context, message])
    recent = [context[0], *context[-_RECENT:]]
    try:
        checked = _bounded_checks.get(tokenizer, 0)
    except TypeError:  # not weak-referenceable: no record to keep, render in full
        checked = -1
    if checked < 0:
        return _suffix(tokenizer, context, [*context, message])
    try:
        short: str | None = _suffix(tokenizer, recent, [*recent, message])
    except Exception:  # the template rejects the shortened conversation (role order rules)
        short = None
    if checked >= _CHECKS and short is not None:
        return short
    full = _suffix(tokenizer, context, [*context, message])
    _bounded_checks[tokenizer] = checked + 1 if short == full else -1
    return full


def generation_prompt_ids(tokenizer: Tokenizer) -> list[int]:
    """The ids that open an assistant turn (`<|im_start|>assistant\\n` in ChatML)."""
    return list(_generation_prompt_ids(tokenizer))


# The two strings below are constants of a tokenizer's template; every turn of every episode
# needs them, and rendering a Jinja template costs milliseconds of the runner's CPU.
@functools.lru_cache(maxsize=32)
def _generation_prompt_ids(tokenizer: Tokenizer) -> tuple[int, ...]:
    text = _suffix(tokenizer, _DEFAULT_CONTEXT, _DEFAULT_CONTEXT, generation_prompt=True)
    return tuple(tokenizer.encode(text, add_special_tokens=False))


@functools.lru_cache(maxsize=32)
def _turn_closing(tokenizer: Tokenizer) -> str:
    sentinel_turn = [*_DEFAULT_CONTEXT[:2], {"role": "assistant", "content": _SENTINEL}]
    rendered = render(tokenizer, sentinel_turn)
    return rendered[rendered.index(_SENTINEL) + len(_SENTINEL):]


def turn_end_ids(tokenizer: Tokenizer, generated_ids: Sequence[int]) -> list[int]:
    """Ids that close an assistant turn after the model's own tokens.

    The template ends an assistant message with a closing string (`<|im_end|>\\n` in ChatML);
    the part of it the model already produced (usually its stop token) is not repeated.
    """
    closing = _turn_closing(tokenizer)
    # only the end matters: the closing string is a few tokens at most
    generated = tokenizer.decode(list(generated_ids[-16:]), skip_special_tokens=False)
    done = max((k for k in range(len(closing) + 1) if generated.endswith(closing[:k])), default=0)
    rest = closing[done:]
    return tokenizer.encode(rest, add_special_tokens=False) if rest else []


# --- tool calls (parsing itself lives in corral.toolcalls, shared with the envs) -----------
@dataclass(slots=True)
class ParsedMessage:
    """An assistant output split into plain content, tool calls and tool-call parse errors."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[ToolCallParseError] = field(default_factory=list)

    def to_message(self) -> dict[str, Any]:
        """The OpenAI assistant message (content None when only tool calls were made)."""
        message: dict[str, Any] = {"role": "assistant",
                                   "content": self.content or (None if self.tool_calls else "")}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": call.id, "type": "function",
                 "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
                for call in self.tool_calls]
        return message


def _call_id(index: int, call: ToolCall) -> str:
    # Deterministic, so the same rollout (same seed) yields the same transcript everywhere.
    body = json.dumps([index, call.name, call.arguments], sort_keys=True, default=str)
    return "call_" + hashlib.sha1(body.encode()).hexdigest()[:12]


def _split(content: str, results: Sequence[ToolCall | ToolCallParseError]) -> ParsedMessage:
    parsed = ParsedMessage(content=content)
    for index, result in enumerate(results):
        if isinstance(result, ToolCallParseError):
            parsed.errors.append(result)
        else:
            parsed.tool_calls.append(result if result.id else
                                     result.model_copy(update={"id": _call_id(index, result)}))
    return parsed


def parse_assistant_text(text: str) -> ParsedMessage:
    """Split model text with Hermes/Qwen `<tool_call>{json}</tool_call>` blocks; never raises."""
    return _split(strip_tool_calls(text), parse_tool_calls(text))


def parse_assistant_message(message: dict[str, Any]) -> ParsedMessage:
    """Split an OpenAI chat response message (`content` + `tool_calls`); never raises.

    Servers that return tool calls as text in `content` are handled too.
    """
    content = message.get("content") or ""
    if not isinstance(content, str):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if message.get("tool_calls"):
        return _split(content.strip(), parse_openai_tool_calls(list(message["tool_calls"])))
    return parse_assistant_text(content)


# --- one conversation as a growing token sequence ----------------------------------------
class ChatTranscript:
    """Token ids and messages of one conversation, extended turn by turn.

    `ids` always ends with the generation prompt when it is the model's turn. The ids that
    `add_messages` returns are environment tokens (not trained on); the generated ids passed to
    `add_generation` are the model's.
    """

    def __init__(self, tokenizer: Tokenizer, messages: Sequence[dict[str, Any]], *,
                 tools: Sequence[dict[str, Any]] | None = None) -> None:
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        self.messages: list[dict[str, Any]] = list(messages)
        self.ids: list[int] = encode_prompt(tokenizer, self.messages, tools=self.tools)
        self._last_generated: list[int] | None = None

    def add_generation(self, token_ids: Sequence[int], text: str) -> ParsedMessage:
        """Record the model's tokens and its parsed message; returns the parse."""
        parsed = parse_assistant_text(text)
        self.ids.extend(token_ids)
        self.messages.append(parsed.to_message())
        self._last_generated = list(token_ids)
        return parsed

    def add_messages(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Append tool results / user messages and the next generation prompt; returns the new
        ids."""
        new: list[int] = []
        if self._last_generated is not None:
            new.extend(turn_end_ids(self.tokenizer, self._last_generated))
            self._last_generated = None
        history = list(self.messages)
        for message in messages:
            new.extend(encode_turn(self.tokenizer, message, previous=history))
            history.append(message)
        new.extend(generation_prompt_ids(self.tokenizer))
        self.messages = history
        self.ids.extend(new)
        return new
