"""The policy contract: token ids in, token ids and behaviour log-probabilities out (DESIGN §6).

Multi-turn prompts are never re-tokenized: the runner keeps the token ids of everything so far
and sends them as the prompt; a policy returns the ids it generated, their log-probabilities
under the sampling distribution, and the policy version that produced them.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Protocol

# Where `corral serve-policy` and its weight publisher read the `/reload` token from.
RELOAD_TOKEN_ENV = "CORRAL_RELOAD_TOKEN"


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the runner uses."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...

    def apply_chat_template(self, conversation: list[dict[str, Any]], **kwargs: Any) -> Any: ...


@dataclass(slots=True)
class GenerationRequest:
    """One sampling call. `session_id` names the trajectory so a router can keep its turns on
    the replica that holds its prefix cache."""

    prompt_ids: list[int]
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    session_id: str | None = None
    seed: int | None = None


@dataclass(slots=True)
class Generation:
    """What a policy produced for one request."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    version: int
    finish_reason: str = "stop"  # "stop" | "length"
    replica: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # structured calls from OpenAI-style servers
    queue_seconds: float = 0.0
    decode_seconds: float = 0.0


class Policy(abc.ABC):
    """Something that samples tokens: in-process (`LocalPolicy`) or over HTTP (`OpenAIPolicy`)."""

    tokenizer: Tokenizer

    @property
    @abc.abstractmethod
    def version(self) -> int:
        """The policy version new tokens will be tagged with."""

    @abc.abstractmethod
    async def generate(self, request: GenerationRequest) -> Generation:
        """Sample a continuation of `request.prompt_ids`."""

    async def close(self) -> None:
        """Release connections or memory; idempotent."""
        return None

    async def __aenter__(self) -> "Policy":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
