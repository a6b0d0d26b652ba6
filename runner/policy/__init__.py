"""`corral.runner.policy`: the inference side of the runner: the policies episodes sample from.

The runner core (episodes, executors, the `Runner`) needs only the contract in `base`: a
`Policy` takes a `GenerationRequest` of token ids and returns a `Generation`. Everything else
here is one policy or a helper of one (the engine processes some of them talk to live in
`corral.runner.engines`):

* `base`: `Policy`, `GenerationRequest`, `Generation`, `Tokenizer` (no dependencies);
* `local` + `decode`: `LocalPolicy`, in-process transformers + torch with continuous batching;
* `openai` + `router`: `OpenAIPolicy` over OpenAI-compatible servers, `Router` across replicas;
* `serve`: `corral serve-policy`, an OpenAI-compatible server over a `LocalPolicy`;
* `sampling`: the limits every sampling field is checked against; `wire`: serve-policy's
  validated request bodies and OpenAI-style errors;
* `models`: the tiny model builder and the checked local loader;
* `chat`: chat templates as token ids (`ChatTranscript`), tool calls parsed from output;
* `scripted`: `ScriptedPolicy`, a dependency-free policy for tests and benchmarks.

The contract and `ChatTranscript` (what the episode loop uses; both light) are imported eagerly;
the engines load on first use, so importing the runner core does not import torch,
transformers, FastAPI or aiohttp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral.lazy import lazy_exports
from .base import Generation, GenerationRequest, Policy, Tokenizer
from .chat import ChatTranscript

if TYPE_CHECKING:  # editors and type checkers resolve the lazy names; nothing runs
    from corral.runner.policy.local import LocalPolicy
    from corral.runner.policy.models import build_tiny_model, load_model, load_tokenizer
    from corral.runner.policy.openai import OpenAIPolicy
    from corral.runner.policy.router import Router
    from corral.runner.policy.scripted import ByteTokenizer, ScriptedCall, ScriptedPolicy
    from corral.runner.policy.serve import PolicyServer, create_app

_LAZY = {
    "LocalPolicy": "local", "OpenAIPolicy": "openai", "Router": "router",
    "PolicyServer": "serve", "create_app": "serve",
    "build_tiny_model": "models", "load_model": "models", "load_tokenizer": "models",
    "ScriptedPolicy": "scripted", "ScriptedCall": "scripted", "ByteTokenizer": "scripted",
}

__all__ = ["ChatTranscript", "Generation", "GenerationRequest", "Policy", "Tokenizer"]
__all__ += sorted(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
