"""`LocalPolicy`: in-process sampling with transformers + torch, batched across coroutines.

Requests from concurrent coroutines are decoded together with a KV cache in a worker thread, so
the event loop stays free. Batching is continuous: between two decode steps, waiting requests
are prefilled and join the running batch (up to `max_batch` rows); rows that finish (stop
token, stop string, `max_tokens`) leave it at once (see `corral.runner.policy.decode`).

Behaviour log-probabilities: for each sampled token, `log_softmax(logits / temperature)` at that
token, in fp32, *before* top-p truncation (the distribution a trainer recomputes from logits).
With `temperature == 0` decoding is greedy and the log-probability is `log_softmax(logits)`.

Weights can be replaced in process (`load_weights`): new rows stop being admitted, the rows in
flight finish with the weights they started with, the weights change, and admission resumes.
Every returned token is therefore tagged with the version that really produced it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from corral.errors import PolicyError
from .base import Generation, GenerationRequest, Policy
from .decode import DecodeBatch, Row
from .models import load_model, stop_token_ids
from .sampling import check_sampling

__all__ = ["LocalPolicy", "LocalPolicyStats", "SMALL_MODEL_PARAMS"]

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
SMALL_MODEL_PARAMS = 50_000_000  # below this, CPU decoding is fastest on one thread


@dataclass(slots=True)
class LocalPolicyStats:
    """Counters of the decoding loop."""

    requests: int = 0
    generated_tokens: int = 0
    steps: int = 0           # decode steps (one token for every row in the batch)
    admissions: int = 0      # prefills; each admits every request waiting at that moment
    joined_running: int = 0  # requests that joined a batch already decoding
    shared_prefills: int = 0  # requests whose identical prompt was prefilled once for several
    batch_sizes: Counter = field(default_factory=Counter)  # rows per decode step

    @property
    def max_batch_size(self) -> int:
        return max(self.batch_sizes, default=0)


@dataclass(slots=True)
class _Pending:
    request: GenerationRequest
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued: float


def _resolve(future: asyncio.Future, result: Any) -> None:
    if not future.done():
        (future.set_exception if isinstance(result, BaseException) else future.set_result)(result)


def _answer(pending: _Pending, result: Any) -> None:
    """Hand `result` (a `Generation` or an exception) to the coroutine awaiting `pending`,
    from the decode thread; a loop that already ended has nobody left to answer."""
    with contextlib.suppress(RuntimeError):  # the loop closed between the check and the call
        pending.loop.call_soon_threadsafe(_resolve, pending.future, result)


def _request_failure(exc: Exception) -> Exception:
    """What the caller of one failed request sees: its own bad input stays a ValueError (a
    client error), anything else is an engine failure (a PolicyError, retried elsewhere)."""
    if isinstance(exc, (ValueError, PolicyError)):
        return exc
    return PolicyError(f"local generation failed for this request: {type(exc).__name__}: {exc}")


class LocalPolicy(Policy):
    """Samples from a transformers causal LM in this process (CPU or CUDA)."""

    def __init__(self, model: Any = "tiny", tokenizer: Any = None, *, device: str | None = None,
                 dtype: "torch.dtype | None" = None, max_batch: int = 16, seed: int = 0,
                 version: int = 0, eos_token_ids: list[int] | None = None,
                 name: str | None = None, threads: int | None = None) -> None:
        """`model` is a local directory, `"tiny"`, or a loaded model (then pass `tokenizer`).

        `threads` sets torch's intra-op threads of the decode thread only (OpenMP's setting is
        per thread). None picks: 1 for models under `SMALL_MODEL_PARAMS` on CPU (thread
        hand-offs cost more than small matmuls save, many times more on a busy machine), else
        torch's default.
        """
        import torch

        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        # checked here: the decode thread's torch.set_num_threads refused it, and every
        # generate() then waited forever
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                    or threads < 1):
            raise ValueError(f"threads must be an integer of at least 1 (or None), got {threads!r}")
        if isinstance(model, (str, os.PathLike)):
            self.name = name or ("tiny" if str(model) == "tiny" else os.path.basename(str(model)))
            model, loaded_tok = load_model(model, device=device, dtype=dtype)
            tokenizer = tokenizer or loaded_tok
        else:
            self.name = name or getattr(model.config, "name_or_path", None) or "local"
            if tokenizer is None:
                raise ValueError("LocalPolicy(model_object) needs tokenizer=; pass the model's "
                                 "tokenizer or a model path instead")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.max_batch = max_batch
        if threads is None and self.device.type == "cpu":
            small = sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMS
            threads = 1 if small else None
        self.threads = threads
        self.stats = LocalPolicyStats()
        self.stop_ids = set(eos_token_ids) if eos_token_ids else stop_token_ids(model, tokenizer)
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        pad = tokenizer.pad_token_id
        pad = pad if pad is not None else tokenizer.eos_token_id
        self._pad = int(pad if pad is not None else 0)
        self._version = version
        self._rng = torch.Generator().manual_seed(seed)
        params = inspect.signature(type(model).forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep")
                              if k in params), None)
        # Thread hand-off: coroutines put requests in the inbox; the decode thread runs while
        # there is work. Weight swaps wait until no row is in flight (see _exclusive).
        self._inbox: queue.SimpleQueue[_Pending] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._busy = False
        self._swaps_waiting = 0
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    # --- versions and weights ---------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    def _exclusive(self, change: Any) -> Any:
        """Run `change()` when no row is decoding; new rows wait until it is done."""
        with self._cond:
            self._swaps_waiting += 1
            try:
                self._cond.wait_for(lambda: not self._busy)
                return change()
            finally:
                self._swaps_waiting -= 1
                self._cond.notify_all()

    def set_version(self, version: int) -> None:
        """Tag tokens of requests admitted from now on with `version` (weights shared in place)."""
        def change() -> None:
            self._version = int(version)
        self._exclusive(change)

    def load_weights(self, weights: "Mapping[str, torch.Tensor] | str | os.PathLike[str]",
                     version: int | None = None) -> int:
        """Replace the weights (a state dict or a `save_pretrained` directory).

        Waits for the rows in flight to finish (new ones are held back meanwhile) and returns
        the new version (default: current + 1). From async code use `aload_weights`.
        """
        if isinstance(weights, (str, os.PathLike)):
            source, _ = load_model(weights, device=str(self.device), dtype=self.model.dtype)
            weights = source.state_dict()

        def change() -> int:
            self.model.load_state_dict(dict(weights), strict=True)
            self._version = self._version + 1 if version is None else int(version)
            log.info("local policy weights replaced, version %d", self._version)
            return self._version
        return self._exclusive(change)

    async def aload_weights(self, weights: "Mapping[str, torch.Tensor] | str | os.PathLike[str]",
                            version: int | None = None) -> int:
        """`load_weights` in a worker thread, so the event loop keeps serving."""
        return await asyncio.to_thread(self.load_weights, weights, version)

    # --- generation -------------------------------------------------------------------------
    def validate(self, request: GenerationRequest) -> None:
        """Raise a one-line `ValueError` when `request` cannot run on this model: sampling
        fields out of range (`corral.runner.policy.sampling`), token ids outside the
        vocabulary, or a prompt + `max_tokens` longer than the model's context."""
        check_sampling(request)
        ids = request.prompt_ids
        if not ids:
            raise ValueError("prompt_ids is empty; send at least one token")
        bad = next((t for t in ids if not 0 <= int(t) < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary "
                             f"[0, {self.vocab_size})")
        if self.max_positions and len(ids) + request.max_tokens > self.max_positions:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_tokens ({request.max_tokens}) "
                             f"exceeds the model's {self.max_positions} positions; shorten one "
                             "of them")

    async def generate(self, request: GenerationRequest) -> Generation:
        """Queue `request`; it joins the running batch at the next step."""
        self.validate(request)
        wake = self._ensure_worker()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._inbox.put(_Pending(request, future, loop, time.perf_counter()))
        wake.set()
        return await future

    def _ensure_worker(self) -> asyncio.Event:
        if self._closed:
            raise PolicyError("LocalPolicy is closed; create a new one")
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None and self._loop.is_running():
                raise PolicyError("LocalPolicy is already serving another event loop; "
                                  "use one policy per loop")
            self._loop, self._wake = loop, asyncio.Event()
            self._worker = loop.create_task(self._serve(), name="corral-local-policy")
        assert self._wake is not None
        return self._wake

    async def _serve(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(0)  # let coroutines scheduled in the same tick enqueue too
            while not self._inbox.empty():
                await asyncio.to_thread(self._run)

    def _take(self, limit: int) -> list[_Pending]:
        taken: list[_Pending] = []
        while len(taken) < limit:
            try:
                pending = self._inbox.get_nowait()
            except queue.Empty:
                break
            if not pending.future.cancelled():
                taken.append(pending)
        return taken

    def _run(self) -> None:
        """Decode until no row is left and nothing waits (runs in a worker thread)."""
        import torch

        if self.threads is not None:
            torch.set_num_threads(self.threads)  # this worker thread only
        with self._cond:
            self._cond.wait_for(lambda: self._swaps_waiting == 0)
            self._busy = True
        batch = DecodeBatch(self._forward, self._new_cache, self._sample, self._advance,
                            self._pad, self.device, self._rng)
        try:
            with torch.inference_mode():
                while True:
                    if self._closed:  # shutdown: stop mid-batch, do not decode to the end
                        self._fail_rows(batch.rows, PolicyError(
                            "LocalPolicy was closed while this request was decoding"))
                        return
                    # Callers that went away (client disconnect, server shutdown) free their row.
                    batch.remove(lambda row: row.payload.future.cancelled())
                    open_slots = self.max_batch - len(batch)
                    admitting = self._swaps_waiting == 0 and not self._closed
                    if admitting and open_slots > 0 and (batch.can_merge or not batch):
                        self._admit(batch, self._take(open_slots))
                    if not batch:
                        return
                    self.stats.steps += 1
                    self.stats.batch_sizes[len(batch)] += 1
                    batch.step(self._finish)
        except Exception as exc:  # noqa: BLE001 - a batched step failed: every row hears of it
            log.exception("local generation failed")
            self._fail_rows(batch.rows, PolicyError(
                f"local generation failed: {type(exc).__name__}: {exc}"))
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _fail_rows(self, rows: list[Row], error: Exception) -> None:
        for row in rows:
            _answer(row.payload, error)

    def _admit(self, batch: DecodeBatch, pending: list[_Pending]) -> None:
        """Prefill `pending` into `batch`. A request that cannot be admitted fails alone: the
        group is retried one request at a time to find it, and the running rows are untouched
        (`DecodeBatch.admit` changes nothing when it raises)."""
        if not pending:
            return
        if batch:
            self.stats.joined_running += len(pending)
        self.stats.admissions += 1
        self.stats.requests += len(pending)
        rows = [Row(p.request, self._version, payload=p) for p in pending]
        try:
            prefilled = batch.admit(rows)
        except Exception as exc:  # noqa: BLE001 - find the culprit below, fail only it
            if len(rows) == 1:
                log.warning("request refused at admission: %s: %s", type(exc).__name__, exc)
                _answer(rows[0].payload, _request_failure(exc))
                return
            prefilled = 0
            for row in rows:
                try:
                    prefilled += batch.admit([row])
                except Exception as one:  # noqa: BLE001
                    log.warning("request refused at admission: %s: %s", type(one).__name__, one)
                    _answer(row.payload, _request_failure(one))
        self.stats.shared_prefills += len(pending) - prefilled

    def _finish(self, row: Row) -> None:
        pending: _Pending = row.payload
        if row.error is not None:  # this row alone failed mid-decode (see DecodeBatch.step)
            _answer(pending, _request_failure(row.error))
            return
        try:
            text = self.tokenizer.decode(row.ids, skip_special_tokens=True)
        except Exception as exc:  # noqa: BLE001 - one undecodable row must not end the batch
            _answer(pending, _request_failure(exc))
            return
        if row.stop_at is not None:  # OpenAI semantics: the stop string is not in the text
            text = text[:row.stop_at]
        self.stats.generated_tokens += len(row.ids)
        gen = Generation(token_ids=row.ids, logprobs=row.logprobs, text=text, version=row.version,
                         finish_reason=row.finish or "length",
                         queue_seconds=max(0.0, row.admitted_at - pending.enqueued),
                         decode_seconds=row.done_at - row.admitted_at)
        _answer(pending, gen)

    def _new_cache(self) -> Any:
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.model.config)
        except TypeError:  # transformers 4.x takes no config
            return DynamicCache()

    def _forward(self, ids: "torch.Tensor", mask: "torch.Tensor", positions: "torch.Tensor",
                 cache: Any, last_only: bool = False) -> "torch.Tensor":
        kwargs: dict[str, Any] = {self._cache_kw: cache, "attention_mask": mask,
                                  "position_ids": positions, "use_cache": True}
        if last_only and self._keep_kw:
            kwargs[self._keep_kw] = 1
        return self.model(input_ids=ids, **kwargs).logits[:, -1].float()

    def _sample(self, logits: "torch.Tensor", temps: "torch.Tensor", top_ps: "torch.Tensor",
                gens: list["torch.Generator"]) -> tuple["torch.Tensor", "torch.Tensor"]:
        """Sample one token per row; returns (tokens, behaviour logprobs) — see module doc."""
        import torch

        greedy = temps <= 0
        logp = torch.log_softmax(logits / torch.where(greedy, 1.0, temps)[:, None], dim=-1)
        probs = logp.exp()
        if bool((top_ps < 1).any()):
            sorted_p, order = probs.sort(dim=-1, descending=True)
            outside = (sorted_p.cumsum(-1) - sorted_p) >= top_ps[:, None]  # keeps >= 1 token
            probs = torch.zeros_like(probs).scatter(1, order, sorted_p.masked_fill(outside, 0.0))
        cdf = probs.cumsum(-1)
        # One uniform per row from that request's own generator: seeded requests reproduce
        # whatever else shares their batch.
        u = torch.stack([torch.rand((), generator=g) for g in gens]).to(self.device)
        sampled = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1)
        tokens = torch.where(greedy, logits.argmax(-1), sampled.clamp(max=logits.shape[-1] - 1))
        return tokens, logp.gather(1, tokens[:, None]).squeeze(1)

    def _advance(self, row: Row, token: int, logprob: float) -> None:
        row.ids.append(token)
        row.logprobs.append(logprob)
        if token in self.stop_ids:
            row.finish = "stop"
        elif row.request.stop:
            text = self.tokenizer.decode(row.ids, skip_special_tokens=True)
            hits = [text.find(s) for s in row.request.stop if s and s in text]
            if hits:
                row.finish, row.stop_at = "stop", min(hits)
        if row.finish is None and len(row.ids) >= row.request.max_tokens:
            row.finish = "length"
        if row.finish is not None:
            row.done_at = time.perf_counter()

    async def close(self) -> None:
        """Stop the batching task and fail every request, waiting or decoding; idempotent.

        The decode thread notices at its next step (one forward pass) and fails its rows with
        `PolicyError`, so a server shutting down does not wait for generations to end."""
        self._closed = True
        worker, self._worker = self._worker, None
        if worker is not None and not worker.done():
            if self._loop is asyncio.get_running_loop():
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                    await worker
            elif self._loop is not None:
                # Serving another loop (a server thread closing a policy a test loop used):
                # tasks are cancelled on their own loop's thread; a closed loop has none left.
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(worker.cancel)
        error = PolicyError("LocalPolicy was closed before this request ran")
        for pending in self._take(10**9):
            _answer(pending, error)
