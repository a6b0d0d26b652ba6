"""Chat templates as token ids, built incrementally, and tool calls parsed from model output.

The episode loop keeps one growing token sequence per trajectory. History is never
re-tokenized: each new message is rendered by the tokenizer's own chat template (as the
difference between the rendering with and without it) and only that difference is encoded.
`ChatTranscript` does this bookkeeping for one conversation. A template that renders history
differently once more follows (Qwen3's drops the `<think>` blocks of earlier turns when a new
user message arrives) keeps the tokens the model saw: the new messages are then rendered after
a neutral opening instead (`_messages_text`).

Tools always reach the model: a template that ignores the `tools` argument (SmolLM2's ChatML)
gets them described in the system prompt, in the Hermes format the parser below reads
(`tools_system_prompt`); one that does not render assistant `tool_calls` gets them as
`<tool_call>` text in the message. What a template renders is found once per tokenizer and
template by rendering a probe with and without them (`template_traits`).

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
from corral.toolcalls import (ToolCallParseError, format_tool_call, parse_openai_tool_calls,
                              parse_tool_calls, strip_tool_calls)
from corral.types import ToolCall

__all__ = ["ChatTranscript", "ParsedMessage", "TemplateTraits", "encode_prompt", "encode_turn",
           "encode_turns", "generation_prompt_ids", "parse_assistant_message",
           "parse_assistant_text", "render", "template_traits", "tools_system_prompt",
           "turn_end_ids"]

_SENTINEL = "\u2063corral-sentinel\u2063"
# A neutral conversation for rendering one message "in context" when the caller gives none.
_DEFAULT_CONTEXT: list[dict[str, Any]] = [
    {"role": "system", "content": "x"}, {"role": "user", "content": "x"},
    {"role": "assistant", "content": "x"}]


# --- what a template renders --------------------------------------------------------------
_PROBE = "corral_probe_tool"
_PROBE_TOOL = {"type": "function", "function": {
    "name": _PROBE, "description": "A probe.", "parameters": {"type": "object",
                                                               "properties": {}}}}
_PROBE_CALL = {"id": "call_probe", "type": "function",
               "function": {"name": _PROBE, "arguments": "{}"}}


@dataclass(frozen=True, slots=True)
class TemplateTraits:
    """What a tokenizer's chat template renders of the tool parts of a conversation."""

    tools: bool       # the `tools` argument (the schemas): else `tools_system_prompt`
    tool_calls: bool  # an assistant message's `tool_calls`: else they go into its content


_traits: "weakref.WeakKeyDictionary[Any, dict[str | None, TemplateTraits]]" = (
    weakref.WeakKeyDictionary())


def _probe_renders(tokenizer: Tokenizer, messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None) -> bool:
    try:
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that fails on the probe does not render it
        return False
    return _PROBE in str(text)


def template_traits(tokenizer: Tokenizer) -> TemplateTraits:
    """Whether `tokenizer`'s chat template renders `tools` and assistant `tool_calls`, found
    by rendering a probe tool and a probe call; cached per tokenizer and template text."""
    key = getattr(tokenizer, "chat_template", None)
    key = key if isinstance(key, str) or key is None else json.dumps(key, sort_keys=True)
    try:
        known = _traits.setdefault(tokenizer, {})
    except TypeError:  # not weak-referenceable: probe every time
        known = {}
    if key not in known:
        user = {"role": "user", "content": "x"}
        known[key] = TemplateTraits(
            tools=_probe_renders(tokenizer, [user], [_PROBE_TOOL]),
            tool_calls=_probe_renders(tokenizer, [user, {
                "role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]}], None))
    return known[key]


def tools_system_prompt(tools: Sequence[dict[str, Any]]) -> str:
    """The tools described in the Hermes format (what Qwen's and the tiny model's templates
    write, and what `parse_assistant_text` reads back), for a template that ignores `tools`."""
    listing = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{listing}\n</tools>\n\nFor each function call, return a json object "
            "with function name and arguments within <tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
            "</tool_call>")


def _with_tools_prompt(messages: list[dict[str, Any]],
                       tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with the tools described in the system prompt (after the env's own)."""
    listing = tools_system_prompt(tools)
    if messages and messages[0].get("role") == "system":
        own = _text(messages[0].get("content"))
        return [{**messages[0], "content": f"{own}\n\n{listing}" if own else listing},
                *messages[1:]]
    return [{"role": "system", "content": listing}, *messages]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message's `tool_calls` written into its content as `<tool_call>` text,
    and content that is None as "" (for templates that render neither)."""
    calls = message.get("tool_calls")
    if not calls:
        return message if isinstance(message.get("content"), str) else {
            **message, "content": _text(message.get("content"))}
    parts = [_text(message.get("content"))] if message.get("content") else []
    for call in parse_openai_tool_calls(list(calls)):
        parts.append(call.text if isinstance(call, ToolCallParseError)
                     else format_tool_call(call))
    plain = {k: v for k, v in message.items() if k != "tool_calls"}
    return {**plain, "content": "\n".join(parts)}


# --- rendering ----------------------------------------------------------------------------
def render(tokenizer: Tokenizer, messages: Sequence[dict[str, Any]], *,
           tools: Sequence[dict[str, Any]] | None = None,
           add_generation_prompt: bool = False) -> str:
    """The chat template's text for `messages` (no tokenization); the tools and tool calls
    the template would drop are written as text (module docstring)."""
    traits = template_traits(tokenizer)
    conversation = list(messages)
    if not traits.tool_calls:
        conversation = [_calls_as_text(m) for m in conversation]
    if tools and not traits.tools:
        conversation, tools = _with_tools_prompt(conversation, tools), None
    return tokenizer.apply_chat_template(conversation, tools=list(tools) if tools else None,
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
    return encode_turns(tokenizer, [message], previous=previous)


def encode_turns(tokenizer: Tokenizer, messages: Sequence[dict[str, Any]], *,
                 previous: Sequence[dict[str, Any]] | None = None) -> list[int]:
    """Token ids of `messages` (tool results, a user follow-up) as the template renders them
    together after `previous`: a template that merges consecutive tool results into one turn
    (Qwen's) renders them merged. History the template would render differently now is left
    as it was (module docstring)."""
    context = list(previous) if previous else _DEFAULT_CONTEXT
    return tokenizer.encode(_messages_text(tokenizer, context, list(messages)),
                            add_special_tokens=False)


# Rendering the whole conversation twice for every new message costs O(turns) each time; a
# 30-turn episode's transcript spent most of the runner's CPU there. Chat templates render a
# message from itself, its neighbours and the conversation's first message (system prompt,
# tools), so the new message's text is the same after [first, *last RECENT]. That is checked
# against the full rendering on a tokenizer's first CHECKS messages; a template that disagrees
# once (or fails on the shortened context) is always rendered in full.
_RECENT, _CHECKS = 2, 8
_bounded_checks: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()


def _messages_text(tokenizer: Tokenizer, context: list[dict[str, Any]],
                   messages: list[dict[str, Any]]) -> str:
    """The text of `messages` after `context`: the difference of the two renderings, or, when
    the template re-renders `context` once they follow it (Qwen3: an earlier assistant turn
    loses its `<think>` block, a last one gains an empty one), the difference after a neutral
    opening of the same system prompt (ending in an assistant turn, else in a user turn, as
    the template's role rules allow). The history's tokens stay the ones the model saw."""
    try:
        return _context_text(tokenizer, context, messages)
    except ModelError as exc:
        rerendered = exc
    first = [context[0]] if context and context[0].get("role") == "system" else []
    user, assistant = {"role": "user", "content": "x"}, {"role": "assistant", "content": "x"}
    for opening in ([*first, user, assistant], [*first, user]):
        try:
            return _suffix(tokenizer, opening, [*opening, *messages])
        except Exception:  # noqa: BLE001 - re-rendered too, or refused by role rules: next
            continue
    raise rerendered


def _context_text(tokenizer: Tokenizer, context: list[dict[str, Any]],
                  messages: list[dict[str, Any]]) -> str:
    if len(context) <= _RECENT + 1:
        return _suffix(tokenizer, context, [*context, *messages])
    recent = [context[0], *context[-_RECENT:]]
    try:
        checked = _bounded_checks.get(tokenizer, 0)
    except TypeError:  # not weak-referenceable: no record to keep, render in full
        checked = -1
    if checked < 0:
        return _suffix(tokenizer, context, [*context, *messages])
    try:
        short: str | None = _suffix(tokenizer, recent, [*recent, *messages])
    except Exception:  # the template rejects the shortened conversation (role order rules)
        short = None
    if checked >= _CHECKS and short is not None:
        return short
    full = _suffix(tokenizer, context, [*context, *messages])
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

    @classmethod
    def resume(cls, tokenizer: Tokenizer, messages: Sequence[dict[str, Any]],
               ids: Sequence[int], *, tools: Sequence[dict[str, Any]] | None = None,
               ) -> "ChatTranscript":
        """The transcript as it was at a turn boundary (its messages, and `ids` ending with the
        generation prompt), without encoding anything again: the ids stay the ones stored."""
        self = cls.__new__(cls)
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        self.messages = [dict(m) for m in messages]
        self.ids = list(ids)
        self._last_generated = None
        return self

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
        if messages:
            new.extend(encode_turns(self.tokenizer, messages, previous=self.messages))
        new.extend(generation_prompt_ids(self.tokenizer))
        self.messages = [*self.messages, *messages]
        self.ids.extend(new)
        return new
