"""Weight publishers: how a `Trainer` hands new weights to the engine that samples rollouts.

A publisher is a callable `publish(model, version)` (the `Trainer`'s `publish=` argument),
called synchronously from the training thread after every applied update. Its time is logged
as `time/sync_s`. After it returns, the rollout engine must sample with the new weights and
tag the new tokens with `version`.

* `LocalPublisher(policy)`: in-process, `LocalPolicy.load_weights(state_dict, version)`.
  Tested.
* `ServePolicyPublisher(url, checkpoint_dir, token=...)`: `save_pretrained` into a fresh
  directory, then `POST /reload {"path", "version"}` on `corral serve-policy` with the server's
  reload token (default: `CORRAL_RELOAD_TOKEN`). Tested against a real server.
* `SGLangPublisher(url, checkpoint_dir)`: `save_pretrained`, then SGLang's
  `POST /update_weights_from_disk {"model_path": DIR}`. SGLang reports no version, so call
  `runner.on_policy_update(version)` (the loop does) to re-tag. NOT tested here (no SGLang).
* `VLLMPublisher(url, checkpoint_dir)`: `save_pretrained`, then a `POST /collective_rpc` on a
  vLLM server started with `VLLM_SERVER_DEV_MODE=1`, calling a worker method (default
  `"reload_weights"`, configurable because its name and arguments changed across vLLM
  releases). `/v1/load_lora_adapter` only swaps LoRA adapters, not full weights. NOT tested
  here (no vLLM on this machine).
"""

from __future__ import annotations

import abc
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import torch

from corral.errors import PolicyError
from corral.runner.policy.base import RELOAD_TOKEN_ENV

log = logging.getLogger(__name__)


class LocalPublisher:
    """In-process publishing to a `LocalPolicy` that holds its own copy of the weights."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def __call__(self, model: torch.nn.Module, version: int) -> None:
        self.policy.load_weights(model.state_dict(), version)


class CheckpointPublisher(abc.ABC):
    """Base for server publishers: save the weights to `checkpoint_dir/v{version}`, then ask
    the server to load them (`_reload`). Older published directories beyond `keep` are
    removed, so a server that is still reading the previous one is not disturbed."""

    def __init__(self, url: str, checkpoint_dir: str | Path, *, tokenizer: Any = None,
                 timeout: float = 600.0, keep: int = 2, token: str | None = None) -> None:
        """`token`, when given, is sent as `Authorization: Bearer` with every reload call."""
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.checkpoint_dir = Path(checkpoint_dir)
        self.tokenizer = tokenizer
        self.timeout = timeout
        self.keep = max(1, keep)
        self.published: list[Path] = []

    def __call__(self, model: torch.nn.Module, version: int) -> None:
        target = self.checkpoint_dir / f"v{version:06d}"
        model.save_pretrained(str(target))
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(str(target))
        self._reload(target, version)
        self.published.append(target)
        while len(self.published) > self.keep:
            shutil.rmtree(self.published.pop(0), ignore_errors=True)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = httpx.post(f"{self.url}{path}", json=body, headers=self._headers,
                                  timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise PolicyError(f"weight reload at {self.url}{path} failed: {exc}; is the "
                              "server running?") from None
        if response.status_code >= 400:
            raise PolicyError(f"weight reload at {self.url}{path} answered "
                              f"{response.status_code}: {response.text[:200]}")
        try:
            return response.json() if response.content else {}
        except ValueError:
            return {}

    @abc.abstractmethod
    def _reload(self, path: Path, version: int) -> None:
        """Ask the server to load the `save_pretrained` directory `path` as `version`."""


class ServePolicyPublisher(CheckpointPublisher):
    """`corral serve-policy`: `POST /reload {"path": DIR, "version": N}`; the server then tags
    every token it samples with version N. `token` defaults to `CORRAL_RELOAD_TOKEN`, the
    variable serve-policy reads its reload token from."""

    def __init__(self, url: str, checkpoint_dir: str | Path, *, token: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(url, checkpoint_dir, token=token or os.environ.get(RELOAD_TOKEN_ENV),
                         **kwargs)

    def _reload(self, path: Path, version: int) -> None:
        answer = self._post("/reload", {"path": str(path.resolve()), "version": version})
        got = answer.get("version")
        if got is not None and int(got) != version:
            raise PolicyError(f"serve-policy at {self.url} reports version {got} after reload, "
                              f"expected {version}")


class SGLangPublisher(CheckpointPublisher):
    """SGLang: `POST /update_weights_from_disk {"model_path": DIR}` (untested here)."""

    def _reload(self, path: Path, version: int) -> None:
        answer = self._post("/update_weights_from_disk", {"model_path": str(path.resolve())})
        if answer.get("success") is False:
            raise PolicyError(f"SGLang at {self.url} refused the weights: "
                              f"{answer.get('message', answer)}")


class VLLMPublisher(CheckpointPublisher):
    """vLLM in dev mode: `POST /collective_rpc {"method": ..., "kwargs": {...}}` (untested
    here). `method` and `path_kwarg` name the worker call that loads weights from `DIR`."""

    def __init__(self, url: str, checkpoint_dir: str | Path, *, method: str = "reload_weights",
                 path_kwarg: str | None = None, **kwargs: Any) -> None:
        super().__init__(url, checkpoint_dir, **kwargs)
        self.method = method
        self.path_kwarg = path_kwarg

    def _reload(self, path: Path, version: int) -> None:
        body: dict[str, Any] = {"method": self.method}
        if self.path_kwarg:
            body["kwargs"] = {self.path_kwarg: str(path.resolve())}
        self._post("/collective_rpc", body)
        self._post("/reset_prefix_cache", {})  # cached prefixes were computed by old weights
