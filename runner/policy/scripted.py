"""`ScriptedPolicy`: a TEST AND BENCHMARK policy that replays scripted responses.

It is a real `Policy` (token ids, logprobs, versions, latency) whose text comes from a script
instead of a model, so the runner, the batch assembler and the store can be exercised at full
speed and deterministically without torch. Token ids come from its tokenizer (by default
`ByteTokenizer`, a ChatML byte-level tokenizer with no dependencies); behaviour logprobs are
synthetic but deterministic for a given request seed. Never train on what it produces.

    policy = ScriptedPolicy(["<tool_call>{...}</tool_call>", "done"])       # same per session
    policy = ScriptedPolicy(lambda call: answer_for(call.prompt))            # computed
    policy = ScriptedPolicy(respond, latency=lambda call: 0.05)              # with decode time
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from .base import Generation, GenerationRequest, Policy, Tokenizer

__all__ = ["ByteTokenizer", "Responder", "ScriptedCall", "ScriptedPolicy", "ScriptedPolicyStats",
           "render_chatml", "synthetic_logprobs"]

IM_START, IM_END, EOS, PAD = "<|im_start|>", "<|im_end|>", "</s>", "<pad>"
_SPECIALS = [IM_START, IM_END, EOS, PAD]
_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in _SPECIALS) + ")")


def render_chatml(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None,
                  add_generation_prompt: bool = False) -> str:
    """ChatML with Hermes-style tools; each message renders on its own (incremental-safe)."""
    out: list[str] = []
    rest = list(messages)
    system = rest.pop(0)["content"] if rest and rest[0]["role"] == "system" else None
    if tools:
        listing = "\n".join(json.dumps(t, sort_keys=True) for t in tools)
        head = f"{system}\n\n" if system else ""
        out.append(f"{IM_START}system\n{head}# Tools\n<tools>\n{listing}\n</tools>{IM_END}\n")
    elif system is not None:
        out.append(f"{IM_START}system\n{system}{IM_END}\n")
    for message in rest:
        content = message.get("content") or ""
        if message["role"] == "assistant":
            parts = [content] if content else []
            for call in message.get("tool_calls") or []:
                fn = call.get("function", call)
                args = fn.get("arguments", {})
                args = args if isinstance(args, str) else json.dumps(args)
                parts.append(f'<tool_call>{{"name": {json.dumps(fn["name"])}, "arguments": {args}}}'
                             "</tool_call>")
            out.append(f"{IM_START}assistant\n{chr(10).join(parts)}{IM_END}\n")
        else:
            out.append(f"{IM_START}{message['role']}\n{content}{IM_END}\n")
    if add_generation_prompt:
        out.append(f"{IM_START}assistant\n")
    return "".join(out)


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255 plus four special tokens; a ChatML chat template.

    Enough of the Hugging Face tokenizer interface for the runner (`encode`, `decode`,
    `apply_chat_template`, `eos_token_id`), with no dependencies and no vocabulary file.
    """

    def __init__(self) -> None:
        self.special_ids = {tok: 256 + i for i, tok in enumerate(_SPECIALS)}
        self._special_by_id = {v: k for k, v in self.special_ids.items()}
        self.eos_token_id: int | None = self.special_ids[IM_END]
        self.pad_token_id = self.special_ids[PAD]
        self.vocab_size = 256 + len(_SPECIALS)

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        for piece in _SPECIAL_RE.split(text):
            if piece in self.special_ids:
                ids.append(self.special_ids[piece])
            elif piece:
                ids.extend(piece.encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        out: list[str] = []
        buf = bytearray()
        for token in ids:
            token = int(token)
            if token < 256:
                buf.append(token)
                continue
            out.append(buf.decode("utf-8", "replace"))
            buf.clear()
            if not skip_special_tokens:
                out.append(self._special_by_id.get(token, ""))
        out.append(buf.decode("utf-8", "replace"))
        return "".join(out)

    def apply_chat_template(self, conversation: list[dict[str, Any]], tools: Any = None,
                            add_generation_prompt: bool = False, tokenize: bool = True,
                            **_: Any) -> Any:
        text = render_chatml(conversation, tools, add_generation_prompt)
        return self.encode(text) if tokenize else text


@dataclass(slots=True)
class ScriptedCall:
    """What a responder sees for one request."""

    request: GenerationRequest
    prompt: str      # the decoded prompt (special tokens kept)
    turn: int        # 0 for a session's first request, then 1, 2, ...
    version: int     # the policy version this generation is tagged with

    @property
    def last_message(self) -> str:
        """Content of the last message before the generation prompt."""
        body = self.prompt.rsplit(IM_START + "assistant\n", 1)[0]
        last = body.rstrip().removesuffix(IM_END).rsplit(IM_START, 1)[-1]
        return last.split("\n", 1)[1] if "\n" in last else last


Responder = Callable[[ScriptedCall], "str | Awaitable[str]"]


@dataclass
class ScriptedPolicyStats:
    """Counters of a scripted policy."""

    requests: int = 0
    generated_tokens: int = 0
    sessions: set[str] = field(default_factory=set)

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "generated_tokens": self.generated_tokens,
                "sessions": len(self.sessions)}


class ScriptedPolicy(Policy):
    """A test/benchmark `Policy` that returns scripted text as if a model had generated it.

    `responses`: a list (turn k of every session gets item k; the last repeats), or a function
    of a `ScriptedCall` returning text (or an awaitable of text, so tests can hold a generation
    until an event fires). `latency`: seconds of simulated decode per call (a number or a
    function of the call), slept asynchronously. Generated ids are the text's ids followed by
    the tokenizer's end-of-turn token, as a chat model would produce them.
    """

    def __init__(self, responses: Sequence[str] | Responder, *, tokenizer: Tokenizer | None = None,
                 version: int = 0, latency: float | Callable[[ScriptedCall], float] = 0.0) -> None:
        self.tokenizer = tokenizer or ByteTokenizer()  # type: ignore[assignment]
        self._responses = responses
        self._latency = latency
        self._version = version
        self._turns: dict[str, int] = defaultdict(int)
        self.stats = ScriptedPolicyStats()
        self.closed = False

    @property
    def version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        """Tag generations that start from now on with `version` (what a weight update does)."""
        self._version = int(version)

    async def generate(self, request: GenerationRequest) -> Generation:
        started = time.perf_counter()
        session = request.session_id or "default"
        call = ScriptedCall(request=request, turn=self._turns[session], version=self._version,
                            prompt=self.tokenizer.decode(list(request.prompt_ids),
                                                         skip_special_tokens=False))
        self._turns[session] += 1
        text = self._respond(call)
        if inspect.isawaitable(text):
            text = await text
        delay = self._latency(call) if callable(self._latency) else self._latency
        if delay > 0:
            await asyncio.sleep(delay)
        ids = list(self.tokenizer.encode(str(text), add_special_tokens=False))
        finish = "stop"
        if len(ids) >= request.max_tokens:
            ids, finish = ids[:request.max_tokens], "length"
        elif self.tokenizer.eos_token_id is not None:
            ids.append(int(self.tokenizer.eos_token_id))
        self.stats.requests += 1
        self.stats.generated_tokens += len(ids)
        self.stats.sessions.add(session)
        text_out = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Generation(token_ids=ids, logprobs=synthetic_logprobs(ids, request.seed, call.turn),
                          text=text_out, version=call.version, finish_reason=finish,
                          decode_seconds=time.perf_counter() - started)

    def _respond(self, call: ScriptedCall) -> "str | Awaitable[str]":
        if callable(self._responses):
            return self._responses(call)
        if not self._responses:
            return ""
        return self._responses[min(call.turn, len(self._responses) - 1)]

    async def close(self) -> None:
        self.closed = True


def synthetic_logprobs(ids: Sequence[int], seed: int | None, turn: int) -> list[float]:
    """Deterministic values in [-4, 0) standing in for behaviour logprobs."""
    digest = hashlib.sha256(f"{seed}:{turn}:{list(ids)}".encode()).digest()
    return [-(digest[i % len(digest)] + 1) / 64.0 for i in range(len(ids))]
