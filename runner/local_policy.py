"""`LocalPolicy`: in-process sampling with transformers + torch, batched across coroutines.

Requests from concurrent coroutines queue up; a background task takes everything pending (up to
`max_batch`), left-pads the prompts and decodes them together with a KV cache in a worker
thread, so the event loop stays free. Rows that finish (stop token, stop string, `max_tokens`)
leave the batch and their cache rows are dropped.

Behaviour log-probabilities: for each sampled token, `log_softmax(logits / temperature)` at that
token, in fp32, *before* top-p truncation (the distribution a trainer recomputes from logits).
With `temperature == 0` decoding is greedy and the log-probability is `log_softmax(logits)`.

Weights can be replaced in process (`load_weights`) between batches; a batch that is running
finishes with the weights and version it started with, so every returned token is tagged with
the version that really produced it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from corral.errors import PolicyError
from corral.runner.models import load_model, stop_token_ids
from corral.runner.policy import Generation, GenerationRequest, Policy

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LocalPolicyStats:
    """Counters of the batching loop."""

    requests: int = 0
    batches: int = 0
    generated_tokens: int = 0
    batch_sizes: Counter = field(default_factory=Counter)

    @property
    def max_batch_size(self) -> int:
        return max(self.batch_sizes, default=0)


@dataclass(slots=True)
class _Pending:
    request: GenerationRequest
    future: asyncio.Future
    enqueued: float


@dataclass(slots=True)
class _Row:
    """Decode state of one request inside a batch."""

    request: GenerationRequest
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    stop_at: int | None = None  # char offset of a matched stop string in the decoded text
    done_at: float = 0.0


class LocalPolicy(Policy):
    """Samples from a transformers causal LM in this process (CPU or CUDA)."""

    def __init__(self, model: Any = "tiny", tokenizer: Any = None, *, device: str | None = None,
                 dtype: "torch.dtype | None" = None, max_batch: int = 16, seed: int = 0,
                 version: int = 0, eos_token_ids: list[int] | None = None,
                 name: str | None = None) -> None:
        """`model` is a local directory, `"tiny"`, or a loaded model (then pass `tokenizer`)."""
        import torch

        if isinstance(model, (str, os.PathLike)):
            self.name = name or ("tiny" if str(model) == "tiny" else os.path.basename(str(model)))
            model, loaded_tok = load_model(model, device=device, dtype=dtype)
            tokenizer = tokenizer or loaded_tok
        else:
            self.name = name or getattr(model.config, "name_or_path", None) or "local"
            if tokenizer is None:
                raise ValueError("LocalPolicy(model_object) needs tokenizer=; pass the model's "
                                 "tokenizer or a model path instead")
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.max_batch = max_batch
        self.stats = LocalPolicyStats()
        self.stop_ids = set(eos_token_ids) if eos_token_ids else stop_token_ids(model, tokenizer)
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._pad = int(pad if pad is not None else 0)
        self._version = version
        self._rng = torch.Generator().manual_seed(seed)
        self._lock = threading.Lock()  # held while a batch decodes or weights change
        params = inspect.signature(type(model).forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    # --- versions and weights ---------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        """Tag tokens from the next batch on with `version` (weights shared with a trainer)."""
        with self._lock:
            self._version = int(version)

    def load_weights(self, weights: "Mapping[str, torch.Tensor] | str | os.PathLike[str]",
                     version: int | None = None) -> int:
        """Replace the weights (a state dict or a `save_pretrained` directory) between batches.

        Blocks until the running batch ends; returns the new version (default: current + 1).
        From async code use `aload_weights`.
        """
        if isinstance(weights, (str, os.PathLike)):
            source, _ = load_model(weights, device=str(self.device), dtype=self.model.dtype)
            weights = source.state_dict()
        with self._lock:
            self.model.load_state_dict(dict(weights), strict=True)
            self._version = self._version + 1 if version is None else int(version)
            log.info("local policy weights replaced, version %d", self._version)
            return self._version

    async def aload_weights(self, weights: "Mapping[str, torch.Tensor] | str | os.PathLike[str]",
                            version: int | None = None) -> int:
        """`load_weights` in a worker thread, so the event loop keeps serving."""
        return await asyncio.to_thread(self.load_weights, weights, version)

    # --- generation -------------------------------------------------------------------------
    def _check(self, request: GenerationRequest) -> None:
        ids = request.prompt_ids
        if not ids:
            raise ValueError("prompt_ids is empty; send at least one token")
        bad = next((t for t in ids if not 0 <= int(t) < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {request.max_tokens}")
        if self.max_positions and len(ids) + request.max_tokens > self.max_positions:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_tokens ({request.max_tokens}) exceeds "
                             f"the model's {self.max_positions} positions; shorten one of them")
        if not 0.0 < request.top_p <= 1.0 or request.temperature < 0:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")

    async def generate(self, request: GenerationRequest) -> Generation:
        """Queue `request` for the next batch and wait for its result."""
        self._check(request)
        queue = self._ensure_worker()
        future = asyncio.get_running_loop().create_future()
        queue.put_nowait(_Pending(request, future, time.perf_counter()))
        return await future

    def _ensure_worker(self) -> asyncio.Queue[_Pending]:
        if self._closed:
            raise PolicyError("LocalPolicy is closed; create a new one")
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None and self._loop.is_running():
                raise PolicyError("LocalPolicy is already serving another event loop; "
                                  "use one policy per loop")
            self._loop, self._queue = loop, asyncio.Queue()
            self._worker = loop.create_task(self._serve(), name="corral-local-policy")
        assert self._queue is not None
        return self._queue

    async def _serve(self) -> None:
        assert self._queue is not None
        while True:
            batch = [await self._queue.get()]
            await asyncio.sleep(0)  # let coroutines scheduled in the same tick enqueue too
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            batch = [p for p in batch if not p.future.cancelled()]
            if not batch:
                continue
            try:
                started, results = await asyncio.to_thread(self._decode,
                                                           [p.request for p in batch])
            except Exception as exc:  # noqa: BLE001 - every waiter must hear about the failure
                log.exception("local generation failed")
                err = PolicyError(f"local generation failed: {type(exc).__name__}: {exc}")
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(err)
                continue
            for pending, gen in zip(batch, results):
                gen.queue_seconds = max(0.0, started - pending.enqueued)
                if not pending.future.done():
                    pending.future.set_result(gen)

    def _decode(self, requests: list[GenerationRequest]) -> tuple[float, list[Generation]]:
        """Decode one batch to completion (runs in a worker thread); returns its start time."""
        import torch

        with self._lock, torch.inference_mode():
            version = self._version
            t0 = time.perf_counter()
            rows = [_Row(r) for r in requests]
            ids, mask = self._left_pad([r.prompt_ids for r in requests])
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            cache = self._new_cache()
            logits = self._forward(ids, mask, positions, cache, last_only=True)
            next_pos = positions[:, -1]
            live = list(range(len(rows)))  # cache row -> index in `rows`
            temps = torch.tensor([max(r.temperature, 0.0) for r in requests], device=self.device)
            top_ps = torch.tensor([r.top_p for r in requests], device=self.device)
            gens = [torch.Generator().manual_seed(r.seed) if r.seed is not None else self._rng
                    for r in requests]
            while True:
                tokens, logps = self._sample(logits, temps, top_ps, [gens[i] for i in live])
                for tok, lp, i in zip(tokens.tolist(), logps.tolist(), live):
                    self._advance(rows[i], tok, lp)
                keep = [j for j, i in enumerate(live) if rows[i].finish is None]
                if not keep:
                    break
                if len(keep) < len(live):  # finished rows leave the batch and the cache
                    sel = torch.tensor(keep, device=self.device)
                    cache.batch_select_indices(sel)
                    mask, tokens, next_pos = mask[sel], tokens[sel], next_pos[sel]
                    temps, top_ps = temps[sel], top_ps[sel]
                    live = [live[j] for j in keep]
                mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
                next_pos = next_pos + 1
                logits = self._forward(tokens[:, None], mask, next_pos[:, None], cache)
            self.stats.batches += 1
            self.stats.batch_sizes[len(rows)] += 1
            self.stats.requests += len(rows)
            self.stats.generated_tokens += sum(len(r.ids) for r in rows)
            return t0, [self._result(r, version, t0) for r in rows]

    def _left_pad(self, prompts: list[list[int]]) -> tuple["torch.Tensor", "torch.Tensor"]:
        import torch

        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self._pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            mask[i, width - len(prompt):] = 1
        return ids.to(self.device), mask.to(self.device)

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

    def _advance(self, row: _Row, token: int, logprob: float) -> None:
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

    def _result(self, row: _Row, version: int, started: float) -> Generation:
        text = self.tokenizer.decode(row.ids, skip_special_tokens=True)
        if row.stop_at is not None:  # OpenAI semantics: the stop string is not in the text
            text = text[:row.stop_at]
        return Generation(token_ids=row.ids, logprobs=row.logprobs, text=text, version=version,
                          finish_reason=row.finish or "length",
                          decode_seconds=row.done_at - started)

    async def close(self) -> None:
        """Stop the batching task and fail requests still waiting; idempotent."""
        self._closed = True
        worker, self._worker = self._worker, None
        if worker is not None and not worker.done():
            worker.cancel()
            try:
                await worker
            except (asyncio.CancelledError, RuntimeError):
                pass
        while self._queue is not None and not self._queue.empty():
            pending = self._queue.get_nowait()
            if not pending.future.done():
                pending.future.set_exception(PolicyError("LocalPolicy was closed before this "
                                                         "request ran"))
