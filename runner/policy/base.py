"""The policy contract: token ids in, token ids and behaviour log-probabilities out.

Multi-turn prompts are never re-tokenized: the runner keeps the token ids of everything so far
and sends them as the prompt; a policy returns the ids it generated, their log-probabilities
under the sampling distribution, and the policy version that produced them.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Generation", "GenerationRequest", "Policy", "RELOAD_TOKEN_ENV", "Tokenizer",
           "checked_generation"]

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


def checked_generation(gen: object, policy: object) -> Generation:
    """`gen` if it is a well-formed `Generation`; else a TypeError naming `policy`'s class and
    what is wrong (a custom policy returning None, a dict, or text in place of token ids would
    otherwise fail later with an error that names neither)."""
    who = f"{type(policy).__name__}.generate"
    if not isinstance(gen, Generation):
        raise TypeError(f"{who} returned {type(gen).__name__}, not a Generation")
    if not isinstance(gen.token_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in gen.token_ids):
        raise TypeError(f"{who} returned token_ids that are not a list of ints")
    if not isinstance(gen.logprobs, list) or len(gen.logprobs) != len(gen.token_ids):
        raise TypeError(f"{who} returned {len(gen.token_ids)} token ids but "
                        f"{len(gen.logprobs) if isinstance(gen.logprobs, list) else 'no'} "
                        "logprobs (one per token is needed)")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in gen.logprobs):
        raise TypeError(f"{who} returned logprobs that are not numbers")
    if not isinstance(gen.text, str) or not isinstance(gen.version, int):
        raise TypeError(f"{who} returned a Generation whose text is not a str or whose "
                        "version is not an int")
    return gen


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
