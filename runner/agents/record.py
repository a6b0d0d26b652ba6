"""An external agent's model calls as token-exact segments of one episode.

The proxy (`corral.runner.agents.proxy`) hands every request of an episode to its
`EpisodeRecord`. A chat request whose messages extend the previous request's messages plus the
reply the proxy returned is encoded incrementally: the ids recorded so far (the prompt and the
sampled ids, verbatim) are kept, and only the new messages are rendered with the policy's chat
template (as `ChatTranscript` does for native episodes). Nothing the model produced is ever
re-tokenized. A request that does not extend it (the agent summarised, truncated, edited or
retried its history, changed its tools, or switched endpoints) starts a new segment: each
segment is one token sequence, trainable on its own, and the split records the request, the
first message that differs and why. `/v1/completions` prompts are treated the same way, as text
(a prompt that starts with the previous prompt and completion) or as token ids.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from corral.runner.policy.base import Generation, Tokenizer
from corral.runner.policy.chat import (encode_prompt, encode_turn, generation_prompt_ids,
                                       parse_assistant_text, turn_end_ids)
from corral.runner.trajectory import Trajectory

__all__ = ["EpisodeRecord", "Prompt", "Segment"]


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):  # OpenAI content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict)).strip()
    return str(content).strip()


def _calls(message: dict[str, Any]) -> list[tuple[str, Any]]:
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call) if isinstance(call, dict) else {}
        args = fn.get("arguments", {})
        if isinstance(args, str):
            with contextlib.suppress(ValueError):
                args = json.loads(args)
        calls.append((fn.get("name"), args))
    return calls


def same_message(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two chat messages say the same thing: role, text and tool calls (names and
    arguments). Call ids and the extra keys SDKs add (`function_call: null`, `refusal`) are
    not compared."""
    return (a.get("role") == b.get("role") and _text(a.get("content")) == _text(b.get("content"))
            and _calls(a) == _calls(b))


@dataclass(slots=True)
class Prompt:
    """The token ids of one request's prompt and how they were made: `new_ids` are the ids
    beyond the segment's recorded ones (environment tokens), `split` says why a new segment
    starts (None: the request extends the current segment, or it is the first)."""

    ids: list[int]
    new_ids: list[int]
    messages: list[dict[str, Any]] = field(default_factory=list)
    text: str | None = None
    split: str | None = None
    at_message: int | None = None
    tools: list[dict[str, Any]] | None = None
    extends: bool = False  # continues the current segment


class Segment:
    """One token sequence of an episode: a prompt, then generated and environment tokens."""

    def __init__(self, kind: str, request: int, reason: str | None,
                 at_message: int | None = None) -> None:
        self.kind = kind  # "chat" | "completion"
        self.request, self.reason, self.at_message = request, reason, at_message
        self.tokens = Trajectory(id="", env_id="", task_id="", group_id="")
        self.messages: list[dict[str, Any]] = []  # chat: the history incl. the replies
        self.tools: list[dict[str, Any]] | None = None
        self.text: str | None = None  # completion: prompt + completion text, when sent as text
        self.last_generated: list[int] | None = None

    @property
    def ids(self) -> list[int]:
        return self.tokens.token_ids

    def describe(self, start: int) -> dict[str, Any]:
        """Where this segment lies in the flattened trajectory and why it began."""
        return {"start": start, "end": start + len(self.ids), "kind": self.kind,
                "request": self.request, "at_message": self.at_message, "reason": self.reason}


class EpisodeRecord:
    """Every model call of one episode, as segments of token ids (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.segments: list[Segment] = []
        self.requests = 0
        self.generations: list[Generation] = []

    @property
    def current(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    # --- chat -------------------------------------------------------------------------------
    def chat_prompt(self, messages: Sequence[dict[str, Any]],
                    tools: Sequence[dict[str, Any]] | None) -> Prompt:
        """The prompt ids of a chat request (nothing is recorded until `commit`)."""
        messages, tools = [dict(m) for m in messages], list(tools) if tools else None
        seg = self.current
        why, at = self._chat_split(seg, messages, tools)
        if why is None and seg is not None:
            new: list[int] = []
            if seg.last_generated is not None:
                new.extend(turn_end_ids(self.tokenizer, seg.last_generated))
            history = list(seg.messages)
            for message in messages[len(history):]:
                new.extend(encode_turn(self.tokenizer, message, previous=history))
                history.append(message)
            new.extend(generation_prompt_ids(self.tokenizer))
            return Prompt([*seg.ids, *new], new, messages=messages, tools=tools, extends=True)
        ids = encode_prompt(self.tokenizer, messages, tools=tools)
        return Prompt(ids, list(ids), messages=messages, split=why, at_message=at, tools=tools)

    def _chat_split(self, seg: Segment | None, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None) -> tuple[str | None, int | None]:
        """(why a new segment starts, the first message that differs); (None, None) when the
        request extends `seg` (or there is no segment yet)."""
        if seg is None:
            return None, None
        if seg.kind != "chat":
            return "switched from /v1/completions to /v1/chat/completions", None
        if (seg.tools or None) != (tools or None):
            return "the tools changed", None
        before = seg.messages
        for index, (old, new) in enumerate(zip(before, messages)):
            if not same_message(old, new):
                if index == len(before) - 1 and old.get("role") == "assistant":
                    return f"the reply to request {self.requests - 1} was replaced", index
                return f"message {index} ({old.get('role')}) was edited or removed", index
        if len(messages) < len(before):
            if len(messages) == len(before) - 1 and before[-1].get("role") == "assistant":
                return f"the reply to request {self.requests - 1} was dropped (a retry)", \
                    len(messages)
            return (f"the history was truncated from {len(before)} to {len(messages)} "
                    "messages"), len(messages)
        if len(messages) == len(before):
            return "the request repeats the previous history without a new message", None
        return None, None

    # --- completions -------------------------------------------------------------------------
    def completion_prompt(self, prompt: str | list[int]) -> Prompt:
        """The prompt ids of a `/v1/completions` request (text or token ids)."""
        seg = self.current
        why: str | None = None
        if seg is not None and seg.kind != "completion":
            why = "switched from /v1/chat/completions to /v1/completions"
        elif seg is not None and isinstance(prompt, str):
            if seg.text is not None and prompt.startswith(seg.text):
                new = self.tokenizer.encode(prompt[len(seg.text):], add_special_tokens=False)
                return Prompt([*seg.ids, *new], new, text=prompt, extends=True)
            why = "the prompt does not start with the previous prompt and completion"
        elif seg is not None:
            if prompt[:len(seg.ids)] == seg.ids:
                return Prompt(list(prompt), list(prompt[len(seg.ids):]), extends=True)
            why = "the prompt's token ids do not start with the previous ones"
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
            return Prompt(ids, list(ids), text=prompt, split=why)
        return Prompt(list(prompt), list(prompt), split=why)

    # --- recording ---------------------------------------------------------------------------
    def commit(self, prompt: Prompt, gen: Generation, *, chat: bool) -> dict[str, Any] | None:
        """Record a generation for `prompt`; returns the chat reply message (None for
        completions)."""
        seg = self.current
        if seg is None or not prompt.extends:
            seg = Segment("chat" if chat else "completion", self.requests, prompt.split,
                          prompt.at_message)
            seg.tools = prompt.tools
            self.segments.append(seg)
        seg.tokens.append(prompt.new_ids, generated=False)
        seg.tokens.append(list(gen.token_ids), generated=True, logprobs=list(gen.logprobs),
                          version=gen.version)
        seg.last_generated = list(gen.token_ids)
        self.requests += 1
        self.generations.append(gen)
        if not chat:
            seg.text = None if prompt.text is None else prompt.text + gen.text
            return None
        reply = parse_assistant_text(gen.text).to_message()
        seg.messages = [*prompt.messages, reply]
        return reply

    def note_failed_request(self) -> None:
        """A request that got no generation still counts (the next one's split names it)."""
        self.requests += 1

    # --- the episode's trajectory --------------------------------------------------------------
    def fill(self, traj: Trajectory) -> None:
        """Append every segment's tokens to `traj` and describe them in
        `traj.metadata["segments"]` (read by `Trajectory.segments()`)."""
        described = []
        for seg in self.segments:
            described.append(seg.describe(len(traj.token_ids)))
            traj.token_ids.extend(seg.tokens.token_ids)
            traj.loss_mask.extend(seg.tokens.loss_mask)
            traj.logprobs.extend(seg.tokens.logprobs)
            traj.versions.extend(seg.tokens.versions)
        traj.metadata["segments"] = described
        traj.metadata["model_calls"] = self.requests

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The last chat segment's history (what the agent's conversation ended as)."""
        for seg in reversed(self.segments):
            if seg.kind == "chat":
                return [dict(m) for m in seg.messages]
        return []
