"""Code that runs inside Corral's vLLM replicas: the admin-route guard and the weight loader.

`VLLMEngine` copies this file into the engine's private folder (0700) as `corral_vllm_ext.py`,
puts that folder on the replicas' `PYTHONPATH` and starts each replica with

* `--middleware corral_vllm_ext.AdminGuard`: every route but the public ones (`OPEN_PATHS`:
  completions, chat, models, health, version, tokenize, metrics) needs `Authorization: Bearer
  TOKEN`, the token in the replica's environment (`TOKEN_ENV`; never on its command line, which
  every local user can read). Without that header the answer is 401 (a WebSocket is closed
  before it opens); with no token configured, the guarded routes are refused to everyone. The
  allow-list is exact on the decoded path, so `//pause`, `/pause/` or `/%70ause` are guarded
  like `/pause`, and a route a newer vLLM adds is guarded until it is listed here;
* `--worker-extension-cls corral_vllm_ext.WeightLoader`: `corral_load_weights(path)`, reached
  through `POST /collective_rpc`, loads a `save_pretrained` folder through vLLM's own in-place
  reload (`model.load_weights` inside its layer-wise reload, so stacked and sharded parameters
  load as at start-up), then re-runs the post-load processing of every layer that shares a
  parameter with another. That is the tied output layer: vLLM skips `lm_head` when loading a
  model with tied embeddings (it *is* the embedding), so its reload leaves the layer's
  processed copy (on CPU, the packed oneDNN/SGL GEMM weight) as it was, and the engine samples
  from new embeddings through the old output layer.

Only the standard library is imported at the top: the file also loads in Corral's own
interpreter, where vLLM is not installed; vLLM is imported by the methods that run in it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from typing import Any, Awaitable, Callable

MODULE = "corral_vllm_ext"  # the name the replicas import this file by
TOKEN_ENV = "CORRAL_ENGINE_TOKEN"
# Routes any client may call (the OpenAI-compatible inference API and read-only status); every
# other route (pause, resume, collective_rpc, reset_prefix_cache, load_lora_adapter, sleep,
# the weight-transfer API, ...) needs the token.
OPEN_PATHS = frozenset({"/health", "/ping", "/version", "/metrics", "/v1/models",
                        "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"})

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class AdminGuard:
    """ASGI middleware: requests to a path outside `OPEN_PATHS` need the engine's token."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app
        token = os.environ.get(TOKEN_ENV, "")
        self._token = _digest(token) if token else None

    def authorized(self, scope: Scope) -> bool:
        """Whether the request carries exactly one `Authorization: Bearer` with the token."""
        if self._token is None:
            return False
        sent = [value for name, value in scope.get("headers", ()) if name.lower() ==
                b"authorization"]
        if len(sent) != 1:
            return False
        scheme, _, token = sent[0].decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(_digest(token.strip()),
                                                                  self._token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] not in ("http", "websocket") or scope.get("path") in OPEN_PATHS
                or self.authorized(scope)):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":  # closed before accept: the client sees HTTP 403
            await send({"type": "websocket.close", "code": 1008})
            return
        why = ("needs the header `Authorization: Bearer TOKEN` (the engine's admin token)"
               if self._token is not None else
               f"is disabled: the engine was started without {TOKEN_ENV}")
        body = json.dumps({"error": f"{scope.get('path')} {why}"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})


class WeightLoader:
    """vLLM worker extension (mixed into its worker class): Corral's weight reload."""

    model_runner: Any  # the worker's, set by vLLM
    vllm_config: Any

    def corral_load_weights(self, path: str) -> dict[str, Any]:
        """Load the `save_pretrained` folder `path` in place (see the module docstring);
        returns the layers re-processed because they share a parameter, and the seconds."""
        from vllm.config import set_current_vllm_config

        started = time.perf_counter()
        with set_current_vllm_config(self.vllm_config):
            self.model_runner.reload_weights(weights_path=path)
            refreshed = _reprocess_shared(self.model_runner.get_model())
        return {"refreshed": refreshed, "seconds": time.perf_counter() - started}


def _reprocess_shared(model: Any) -> list[str]:
    """Re-run `process_weights_after_loading` on each layer whose parameter another layer also
    owns (a tied `lm_head` and the embedding), so derived copies follow the shared values."""
    owners: dict[int, list[tuple[str, Any]]] = {}
    for name, module in model.named_modules():
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), []).append((name, module))
    refreshed = []
    for modules in owners.values():
        if len(modules) < 2:
            continue
        for name, module in modules:
            method = getattr(module, "quant_method", None)
            weight = getattr(module, "weight", None)
            # a linear layer's processing may drop `weight` (numel 0): never processed twice
            if method is not None and weight is not None and weight.numel():
                method.process_weights_after_loading(module)
                refreshed.append(name)
    return refreshed


__all__ = ["MODULE", "OPEN_PATHS", "TOKEN_ENV", "AdminGuard", "WeightLoader"]
