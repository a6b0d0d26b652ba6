"""Data-parallel training: one `Trainer` step spread over N processes with torch.distributed.

`corral train --nproc N` starts N copies of the same `corral train` command under torch's
elastic launcher (what `torchrun` runs; launching under `torchrun` directly works the same).
Each process finds its rank in the launcher's environment (`RANK`, `WORLD_SIZE`, ...):

* rank 0 runs the whole loop of `corral.trainer.loop`: the runner collecting rollouts, the
  rollout engine, the logs, reports and evaluations, and it alone publishes weights;
* every rank holds a shard of the model and the optimizer state (FSDP2,
  `torch.distributed.fsdp.fully_shard`, per decoder layer and at the root). On GPUs each rank
  uses its own GPU over NCCL; on CPU, gloo (FSDP2 runs on CPU/gloo in torch >= 2.13: the tests
  use it, no DDP fallback);
* rank 0 announces each trainer call (`step(batch)`, `sft_step`, `publish_weights`,
  `save_checkpoint`, ...) on a gloo control group; the other ranks (`follow`) make the same
  call. Every rank builds the same padded batch, takes every N-th micro-batch (rank r: chunks
  r, r+N, ...; padding micro-batches of zero weight keep the collectives in step), and
  FSDP averages the gradients. The loss is normalised by whole-step counts and scaled by N, so
  the average is the sum of the ranks' shares: the one-process gradient, up to the order of
  float additions. The recompute's logprobs are summed over ranks (each entry comes from one
  rank, so exactly) and the staleness filter, importance weights and throttle see the whole
  batch on every rank.

Checkpoints are sharded with torch.distributed.checkpoint (`shards/`), plus each rank's RNG
states and, from rank 0, the gathered full weights in `model/` (loadable by serve-policy and
transformers); resuming reloads the shards and continues bitwise. A checkpoint resumes with
any number of processes: DCP reshards `shards/` to another N (or to one process,
`Trainer.resume`), and a one-process checkpoint's weights and optimizer state are split over
the ranks.

A rank that dies or hangs stops the run: the launcher stops the other ranks at once, and a
collective that waits longer than `CORRAL_DIST_TIMEOUT` seconds (default 1800) fails instead of
hanging. The error names the rank; `--resume` continues from the last checkpoint.

Limits: prompt-prefix sharing (`share_prefix_min`) is off in data-parallel steps (whether a
micro-batch shares a prefix differs between ranks, and FSDP needs every rank to run the same
number of forwards); the rollout engine must be `local`; LoRA runs use one process; a
multi-node run needs `--run-dir` on a filesystem every node sees.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from corral.errors import CorralError

from . import checkpoint as ckpt
from .batching import TensorBatch
from .config import StepConfig
from .lora import is_adapter_dir
from .trainer import LossFn, NonFinite, Publisher, Trainer, merge_parts

__all__ = ["DEFAULT_TIMEOUT_S", "DistContext", "DistributedTrainer", "F", "FullWeights",
           "RESUME_HINT", "TIMEOUT_ENV", "build_trainer", "check_supported", "collective",
           "communication_error", "finish", "follow", "init", "launch", "lost_contact",
           "shard_model", "strip_nproc", "world_size"]

log = logging.getLogger(__name__)

TIMEOUT_ENV = "CORRAL_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 1800.0
RESUME_HINT = "continue from the last checkpoint with --resume"


@dataclass
class DistContext:
    """This process's place in a data-parallel run."""

    rank: int
    world_size: int
    device: torch.device
    control: Any                 # gloo group for announcements and small Python objects
    timeout_s: float
    busy: bool = False           # inside a collective trainer call

    @property
    def is_main(self) -> bool:
        """Rank 0: the runner, the logs and weight publishing live here."""
        return self.rank == 0


_context: DistContext | None = None


def world_size() -> int:
    """Processes in this run (`WORLD_SIZE`, set by torchrun and `corral train --nproc`)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init() -> DistContext | None:
    """Join the process group when launched as one of several ranks (None: one process)."""
    global _context
    if _context is not None or world_size() <= 1:
        return _context
    timeout_s = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    timeout = timedelta(seconds=timeout_s)
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():  # NCCL refuses two ranks on one GPU
            raise CorralError(f"local rank {local} needs GPU {local}, this machine has "
                              f"{torch.cuda.device_count()}; use --nproc <= the GPU count")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)  # "cuda" now means this rank's GPU (model loading)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
        control = dist.new_group(backend="gloo", timeout=timeout)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
        control = dist.group.WORLD
    _context = DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(),
                           device=device, control=control, timeout_s=timeout_s)
    log.info("rank %d of %d on %s", _context.rank, _context.world_size, device)
    return _context


def check_supported(engine: str, lora: Any) -> None:
    """Raise a one-line error for settings a data-parallel run does not support."""
    if engine != "local":
        raise CorralError(f"--nproc > 1 trains with the local rollout engine only; drop "
                          f"--engine {engine} or train in one process")
    if lora is not None:
        raise CorralError("--nproc > 1 does not train LoRA adapters; drop --nproc or the "
                          "LoRA flags")


def finish(ctx: DistContext | None, *, failed: bool) -> None:
    """Tell the other ranks to stop (from rank 0, unless it failed inside a collective: then
    the launcher or the timeout stops them) and leave the process group."""
    global _context
    if ctx is None:
        return
    try:
        if ctx.is_main and not ctx.busy:
            _send(ctx, ("stop", (failed,), {}))
    except Exception as exc:  # the others are gone already; nothing left to tell
        log.debug("stop not delivered: %s", exc)
    finally:
        dist.destroy_process_group()
        _context = None


def build_trainer(model: torch.nn.Module, tokenizer: Any, config: StepConfig,
                  publish: Publisher | None, resume_from: Path | None = None) -> Trainer:
    """The loop's trainer: a `Trainer` in one process; on rank 0 of several, a
    `DistributedTrainer` whose construction the other ranks (`follow`) repeat."""
    ctx = _context
    if ctx is None:
        if resume_from is not None:
            return Trainer.resume(resume_from, model, tokenizer, config, publish)
        return Trainer(model, tokenizer, config, publish)
    _send(ctx, ("start", (config.model_dump(mode="json"),
                          None if resume_from is None else str(resume_from)), {}))
    return _start(ctx, model, tokenizer, config, publish, resume_from)


def follow(ctx: DistContext, model: torch.nn.Module, tokenizer: Any = None) -> tuple[int, int]:
    """A rank > 0, with the same model as rank 0's: build the trainer rank 0 announces and
    make every trainer call it makes until it stops; returns (steps, version)."""
    name, args, _ = _receive(ctx)
    if name == "stop":  # rank 0 ended before training (an error it reports itself)
        return 0, 0
    config, resume_from = args
    trainer = _start(ctx, model, tokenizer, StepConfig(**config), None,
                     None if resume_from is None else Path(resume_from))
    trainer.serve()
    return trainer.step_count, trainer.version


def _start(ctx: DistContext, model: torch.nn.Module, tokenizer: Any, config: StepConfig,
           publish: Publisher | None, resume_from: Path | None) -> "DistributedTrainer":
    if resume_from is not None:
        return DistributedTrainer.resume(resume_from, model, tokenizer, config, publish,
                                         ctx=ctx)
    return DistributedTrainer(model, tokenizer, config, publish, ctx=ctx)


def _send(ctx: DistContext, message: tuple[str, tuple[Any, ...], dict[str, Any]]) -> None:
    _broadcast(ctx, [message])


def _receive(ctx: DistContext) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    box: list[Any] = [None]
    _broadcast(ctx, box)
    return box[0]


def _broadcast(ctx: DistContext, box: list[Any]) -> None:
    """Rank 0's `box[0]` into every rank's `box` (control group); a lost rank is one line."""
    try:
        dist.broadcast_object_list(box, src=0, group=ctx.control)
    except RuntimeError as exc:
        if communication_error(exc):
            raise lost_contact(ctx, exc) from exc
        raise


def communication_error(exc: BaseException) -> bool:
    """Whether `exc` is a failed collective (gloo raises a bare RuntimeError: "Connection
    closed by peer", "Timed out ...")."""
    text = str(exc)
    return isinstance(exc, dist.DistError) or (isinstance(exc, RuntimeError) and any(
        mark in text for mark in ("gloo", "nccl", "NCCL", "Connection", "Timed out")))


def lost_contact(ctx: DistContext, exc: BaseException) -> CorralError:
    """The one-line error of a rank whose collective failed (a rank died or hung)."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    return CorralError(f"rank {ctx.rank}: lost contact with the other ranks ({first}); one of "
                       f"them died or hung longer than {TIMEOUT_ENV}={ctx.timeout_s:.0f} s; "
                       f"the run stopped: {RESUME_HINT}")


F = TypeVar("F", bound=Callable[..., Any])


def collective(method: F) -> F:
    """A trainer call every rank makes: rank 0 announces it first (unless it is already inside
    one, e.g. the publish at the end of a step); communication errors become one line."""
    @functools.wraps(method)
    def call(self: "DistributedTrainer", *args: Any, **kwargs: Any) -> Any:
        ctx = self.ctx
        outer = not ctx.busy
        ctx.busy = True
        try:
            if outer and ctx.is_main:
                _send(ctx, (method.__name__, args, kwargs))
            return method(self, *args, **kwargs)
        except RuntimeError as exc:
            if communication_error(exc):
                raise lost_contact(ctx, exc) from exc
            raise
        finally:
            ctx.busy = not outer
    return call  # type: ignore[return-value]


class FullWeights:
    """Rank 0's view of a sharded model with its gathered full weights, given to publishers:
    `state_dict()` and `save_pretrained()` give the full weights, other attributes are the
    model's (its `config`, ...)."""

    def __init__(self, model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
        self._model, self._state = model, state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._state

    def save_pretrained(self, directory: Any, **kwargs: Any) -> Any:
        return self._model.save_pretrained(directory, **{"state_dict": self._state, **kwargs})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def shard_model(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """FSDP2 in place: each decoder layer its own unit (gathered only while it runs), the
    embeddings and head in the root's."""
    from torch.distributed.fsdp import fully_shard

    model.to(device)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in (
                "layers", "h", "blocks"):
            for layer in module:
                fully_shard(layer)
            break
    fully_shard(model)
    return model


class DistributedTrainer(Trainer):
    """A `Trainer` whose model and optimizer are sharded over the ranks of `ctx` (see the
    module docstring). Rank 0 is driven like a `Trainer`; the others run `serve()`."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any = None,
                 config: StepConfig | None = None, publish: Publisher | None = None, *,
                 ctx: DistContext, version: int = 0) -> None:
        self.ctx = ctx
        self._full: dict[str, torch.Tensor] = {}
        super().__init__(shard_model(model, ctx.device), tokenizer, config, publish,
                         version=version)
        self._cache_keyword = None  # prefix sharing off: see the module docstring

    # --- the calls rank 0 announces ----------------------------------------------------------
    @collective
    def step(self, batch: Any) -> Any:
        return super().step(batch)

    @collective
    def sft_step(self, examples: Sequence[Any], *, lr: float | None = None,
                 publish: bool = True) -> Any:
        return super().sft_step(examples, lr=lr, publish=publish)

    @collective
    def reset_optimizer(self, *, keep_second_moments: bool = False) -> None:
        super().reset_optimizer(keep_second_moments=keep_second_moments)

    @collective
    def publish_weights(self) -> float:
        """Gather the full weights (every rank) and publish them (rank 0)."""
        self._full = self.full_state_dict()
        try:
            return super().publish_weights() if self.ctx.is_main else 0.0
        finally:
            self._full = {}

    @collective
    def save_checkpoint(self, path: str | Path, extra: dict[str, Any] | None = None) -> Path:
        """Write a sharded checkpoint atomically (every rank writes its shards)."""
        ctx = self.ctx
        if extra is not None:
            self.extra = dict(extra)
        target = Path(path).resolve()
        box: list[Any] = [str(ckpt.staging_dir(target)) if ctx.is_main else None]
        dist.broadcast_object_list(box, src=0, group=ctx.control)
        tmp = Path(box[0])
        try:
            if ctx.is_main:
                (tmp / "rng").mkdir(parents=True)
            dist.barrier(group=ctx.control)
            ckpt.save_shards(tmp, self.model, self.optimizer)
            full = self.full_state_dict()
            torch.save(ckpt.rng_state(), tmp / "rng" / f"rank{ctx.rank}.pt")
            dist.barrier(group=ctx.control)
            if ctx.is_main:
                ckpt.write_model(tmp, self.model, self.tokenizer, state_dict=full)
                ckpt.write_state(tmp, {**self._checkpoint_state(),
                                       "world_size": ctx.world_size})
                ckpt.commit(tmp, target)
            dist.barrier(group=ctx.control)
        finally:
            if ctx.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
        log.info("sharded checkpoint step %d version %d written to %s", self.step_count,
                 self.version, target)
        return target

    @classmethod
    def resume(cls, path: str | Path, model: torch.nn.Module | None = None,  # type: ignore[override]
               tokenizer: Any = None, config: StepConfig | None = None,
               publish: Publisher | None = None, *, ctx: DistContext | None = None,
               device: Any = None) -> "DistributedTrainer":
        """Rebuild from a checkpoint (every rank, the same `path`) of a run with any number
        of processes: a sharded one is resharded to this run's ranks by
        torch.distributed.checkpoint; a one-process one's full weights and optimizer state are
        split over them."""
        if model is None or ctx is None:
            raise TypeError("DistributedTrainer.resume needs the model and the DistContext")
        where = ckpt.resolve(path)
        state = ckpt.read_json_state(where)
        sharded = ckpt.is_sharded(state)
        if not sharded:
            if is_adapter_dir(where / "model"):
                raise CorralError(f"{where} holds a LoRA adapter (a one-process run, "
                                  f"world_size 1) and --nproc {ctx.world_size} does not train "
                                  "LoRA; resume it without --nproc")
            ckpt.load_weights_into(model, where)  # whole, before `cls` shards the model
        trainer = cls(model, tokenizer, config or StepConfig(**state["config"]), publish,
                      ctx=ctx, version=state["version"])
        if sharded:
            ckpt.load_shards(where, trainer.model, trainer.optimizer)
        else:
            ckpt.load_full_optimizer(where, trainer.model, trainer.optimizer)
        rng = ckpt.rng_file(where, ctx.rank)
        trainer._load_progress(state, torch.load(rng, weights_only=False))
        log.info("rank %d resumed from %s at step %d, version %d", ctx.rank, where,
                 trainer.step_count, trainer.version)
        return trainer

    # --- ranks > 0 -----------------------------------------------------------------------------
    def serve(self) -> None:
        """Make every call rank 0 announces until it says stop."""
        while True:
            name, args, kwargs = _receive(self.ctx)
            if name == "stop":
                return
            getattr(self, name)(*args, **kwargs)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights on rank 0's CPU ({} on the others); every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.model, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))

    # --- the data-parallel parts of a step -----------------------------------------------------
    def _mine(self, chunks: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """This rank's micro-batches (every N-th), padded with None to the same count on
        every rank: FSDP gathers weights in each forward, so all ranks run as many."""
        ctx = self.ctx
        own: list[torch.Tensor | None] = list(chunks[ctx.rank::ctx.world_size])
        return own + [None] * (math.ceil(len(chunks) / ctx.world_size) - len(own))

    @torch.no_grad()
    def _recompute(self, tb: TensorBatch, chunks: list[torch.Tensor]) -> torch.Tensor:
        prox = torch.zeros_like(tb.behaviour_logprobs)
        for idx in self._mine(chunks):
            logp = self._forward_logprobs(tb.select(chunks[0] if idx is None else idx))
            if idx is not None:
                prox[idx, : logp.shape[1]] = logp
        dist.all_reduce(prox)  # each entry was written by one rank: the sum is exact
        return prox

    def _accumulate(self, tb: TensorBatch, chunks: list[torch.Tensor], loss_fn: LossFn
                    ) -> tuple[float, dict[str, float]]:
        ctx = self.ctx
        mine = self._mine(chunks)
        total, sums, bad = 0.0, {}, None
        for n, idx in enumerate(mine):
            self.model.set_requires_gradient_sync(n == len(mine) - 1)  # reduce once, at the end
            real = chunks[0] if idx is None else idx
            mb = tb.select(real)
            loss, parts = loss_fn(mb, self._forward_logprobs(mb), real)
            # FSDP averages gradients over the ranks; scaled by N, the average is the sum of
            # the ranks' shares (the one-process gradient). Padding adds zero.
            (loss * (ctx.world_size if idx is not None else 0.0)).backward()
            if idx is None:
                continue
            if not bool(torch.isfinite(loss)) and bad is None:
                bad = (f"non-finite loss ({float(loss.detach())}) in micro-batch "
                       f"{ctx.rank + n * ctx.world_size}")
            total += float(loss.detach())
            merge_parts(sums, parts)
        shares: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(shares, (total, sums, bad), group=ctx.control)
        problems = [share[2] for share in shares if share[2]]
        if problems:  # every rank stops the step the same way
            raise NonFinite(problems[0])
        merged: dict[str, float] = {}
        for _, part, _ in shares:
            for key, value in part.items():
                merged[key] = (max(merged.get(key, 0.0), value) if key == "ratio_max"
                               else merged.get(key, 0.0) + value)
        return sum(share[0] for share in shares), merged

    def _clip_grad_norm(self, clip: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.params, clip)  # a global norm over shards
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def _publish_view(self) -> Any:
        return FullWeights(self.model, self._full)


def launch(nproc: int, argv: Sequence[str], *, what: str = "corral train") -> int:
    """Run `python *argv` (e.g. `-m corral.cli train ...`) as `nproc` ranks under torch's
    elastic launcher (what `torchrun --standalone` runs) and return the exit status. A rank
    that fails stops the others at once; a rank killed by a signal is reported in one line
    (naming `what`)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # the launcher's own multi-line logs would bury the ranks' one-line errors
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        # the launcher's per-rank folders (empty: nothing is redirected) go with the launch;
        # by default each launch left a torchelastic_* folder in /tmp
        with tempfile.TemporaryDirectory(prefix="corral-ranks-") as logs:
            config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc,
                                  run_id=f"corral-{uuid.uuid4().hex[:8]}", rdzv_backend="c10d",
                                  rdzv_endpoint="localhost:0", max_restarts=0,
                                  monitor_interval=0.2,
                                  logs_specs=DefaultLogsSpecs(log_dir=logs))
            elastic_launch(config, sys.executable)(*argv)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if failure.exitcode >= 0:  # the rank printed its own error
            return failure.exitcode or 1
        name = failure.signal_name()
        print(f"error: {what} --nproc {nproc}: rank {rank} (pid {failure.pid}) was "
              f"killed by {name}; the other ranks were stopped: {RESUME_HINT}",
              file=sys.stderr)
        return 128 - failure.exitcode  # the shell's code for a signal death
    return 0


def strip_nproc(argv: Sequence[str]) -> list[str]:
    """`argv` without `--nproc N` / `--nproc=N` (the ranks run the rest)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out
