"""`Trainer`: one GRPO step per runner `Batch`, with staleness control and weight publishing.

A step, in order:

1. pad the batch (`build_tensor_batch`); samples with zero advantage carry no gradient and are
   left out (counted);
2. recompute the logprobs of every generated token without gradient: this is the proximal
   policy of decoupled PPO and the "current policy" of the staleness filter (a prompt prefix
   that every sample of a micro-batch shares runs once, here and in the loss pass: see
   `corral.trainer.prefix`);
3. staleness filter (age backstop, divergence threshold), importance weights, numerics report;
4. loss over micro-batches with gradient accumulation (normalised by whole-step counts), grad
   clipping, one optimizer step;
5. bump the policy version and `publish(model, version)` (timed).

A NaN/inf in the recompute, a micro-batch loss or the gradient norm stops the step before the
optimizer runs: weights and optimizer state stay those of the last good step, the step is
reported with `applied=False`, and the next `step` proceeds normally. A batch without learnable
signal is a logged skip. The model stays in `eval()` mode: dropout would make the trainer score
tokens with a different distribution from the one that sampled them.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from corral.runner.trajectory import Batch, Trajectory

from . import checkpoint as ckpt
from .batching import TensorBatch, build_tensor_batch
from .config import StepConfig
from .loss import importance_weights, policy_loss, sft_loss, token_logprobs
from .numerics import NumericsReport, numerics_report
from .prefix import cache_keyword, shared_prefix_length, suffix_logits
from .sft import SFTExample, encode_example
from .staleness import StalenessReport, ThrottleController, ThrottleSignal, assess_staleness
from .tree import signal_rows, tree_token_weights

__all__ = ["LossFn", "NonFinite", "Publisher", "StepResult", "Trainer", "merge_parts",
           "resolve_dtype"]

log = logging.getLogger(__name__)

Publisher = Callable[[torch.nn.Module, int], Any]
LossFn = Callable[[TensorBatch, torch.Tensor, torch.Tensor],
                  tuple[torch.Tensor, dict[str, float]]]


@dataclass
class StepResult:
    """The outcome of one `Trainer.step` / `sft_step`."""

    step: int                       # index of this call (applied or not)
    version: int                    # policy version after the call
    applied: bool                   # whether the weights changed
    skipped_reason: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    staleness: StalenessReport | None = None
    numerics: NumericsReport | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able record for run logs and reports (histograms as lists)."""
        return {"step": self.step, "version": self.version, "applied": self.applied,
                "skipped_reason": self.skipped_reason, "metrics": self.metrics,
                "staleness": self.staleness.to_dict() if self.staleness else None,
                "numerics_warning": self.numerics.warning if self.numerics else None}


class NonFinite(Exception):
    """Internal: a NaN/inf appeared; the step is stopped before any update."""


class Trainer:
    """GRPO-family trainer over runner batches (see the module docstring).

    `publish(model, version)` is called synchronously after every applied update (for example
    `LocalPolicy.load_weights`, or a function that saves a checkpoint and calls a server's
    reload endpoint). Call `step` from a worker thread in async code (`asyncio.to_thread`).
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any = None,
                 config: StepConfig | None = None, publish: Publisher | None = None, *,
                 version: int = 0) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or StepConfig()
        self.publish = publish
        self.version = version
        self.step_count = 0
        self.updates = 0
        self.extra: dict[str, Any] = {}
        self.device = next(model.parameters()).device
        self.compute_dtype = resolve_dtype(self.config.dtype, self.device)
        self.params = [p for p in model.parameters() if p.requires_grad]
        cfg = self.config
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=cfg.betas,
                                           eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
        self.throttle = ThrottleController.from_config(cfg)
        self.fresh_updates = 0  # updates since the optimizer was created or reset (warm-up)
        self._cache_keyword = cache_keyword(model)
        self.model.eval()

    # --- the RL step --------------------------------------------------------------------------
    def step(self, batch: Batch | Sequence[Sequence[Trajectory]]) -> StepResult:
        """One policy-gradient update from `batch` (see the module docstring)."""
        started = time.perf_counter()
        cfg = self.config
        full = build_tensor_batch(batch, cfg)
        metrics: dict[str, float] = {
            "samples": float(full.size), "excluded": float(full.excluded),
            "zero_variance_groups": float(full.zero_variance_groups),
            "reward_mean": float(full.rewards.mean()) if full.size else 0.0,
        }
        tb = full.select(signal_rows(full.advantages, full.token_advantages, full.group_index,
                                     full.loss_mask))  # NaN stays in
        metrics["zero_advantage_samples"] = float(full.size - tb.size)
        if tb.size == 0 or not bool((tb.loss_mask > 0).any()):
            return self._skip("no learnable signal (all advantages are zero or no generated "
                              "tokens)", metrics, started)
        tb = _to_device(tb, self.device)
        chunks = [torch.arange(i, min(i + cfg.micro_batch_size, tb.size), device=self.device)
                  for i in range(0, tb.size, cfg.micro_batch_size)]

        t0 = time.perf_counter()
        prox = self._recompute(tb, chunks)
        metrics["time/recompute_s"] = time.perf_counter() - t0
        on = tb.loss_mask > 0
        if not bool(torch.isfinite(prox[on]).all()):
            return self._skip("non-finite logprobs in the recompute (model weights or inputs "
                              "are broken)", metrics, started, nonfinite=True)

        stale = assess_staleness(prox, tb.behaviour_logprobs, tb.loss_mask, tb.versions,
                                 self.version, cfg)
        stale.sample_ids = list(tb.sample_ids)
        isw = importance_weights(
            prox, tb.behaviour_logprobs, tb.loss_mask, mode=cfg.is_mode,
            truncate_cap=cfg.is_truncate_cap, token_low=cfg.is_token_mask_low,
            token_high=cfg.is_token_mask_high, seq_low=cfg.is_seq_mask_low,
            seq_high=cfg.is_seq_mask_high)
        numerics = numerics_report(prox, tb.behaviour_logprobs, tb.loss_mask, tb.versions,
                                   self.version, isw, warn_kl=cfg.numerics_warn_kl,
                                   warn_mean_abs=cfg.numerics_warn_mean_abs)
        metrics.update(stale.summary())
        metrics.update(numerics.summary())
        finite_div = stale.divergences[np.isfinite(stale.divergences)]
        self.throttle.update(float(finite_div.mean()) if finite_div.size else float("nan"))
        metrics["throttle/cut_inflight"] = float(self.throttle.signal().cut_inflight)
        if stale.dropped_age or stale.dropped_divergence or stale.downweighted:
            log.info("staleness: dropped %d by age, %d by divergence, down-weighted %d of %d",
                     stale.dropped_age, stale.dropped_divergence, stale.downweighted, tb.size)

        weights = torch.as_tensor(stale.weights, dtype=torch.float32, device=self.device)
        keep = weights > 0
        if not bool(keep.any()):
            return self._skip("no learnable signal (every sample dropped as stale)", metrics,
                              started, staleness=stale, numerics=numerics)
        num_tokens = float(on[keep].sum())
        num_seqs = float((on[keep].any(dim=-1)).sum())
        metrics["loss_tokens"] = num_tokens
        token_w = None
        if tb.token_advantages is not None:  # tree groups: shared tokens once, summed weights
            token_w = tree_token_weights(isw.weights * weights.unsqueeze(-1), tb.loss_mask,
                                         tb.shares, cfg.loss_agg)
            keep = (token_w != 0).any(dim=-1)
            metrics["tree_shared_tokens"] = float(sum(
                (s.end - s.start) * (len(s.rows) - 1) for s in tb.shares))

        def loss_fn(mb: TensorBatch, logp: torch.Tensor, idx: torch.Tensor
                    ) -> tuple[torch.Tensor, dict[str, float]]:
            width = logp.shape[1]
            if token_w is not None:
                return policy_loss(
                    logp, prox[idx, :width], mb.token_advantages, mb.loss_mask,
                    is_weights=token_w[idx, :width], clip_eps_low=cfg.clip_eps_low,
                    clip_eps_high=cfg.clip_eps_high, agg=cfg.loss_agg, num_tokens=num_tokens,
                    num_seqs=num_seqs)
            return policy_loss(
                logp, prox[idx, :width], mb.advantages, mb.loss_mask,
                is_weights=isw.weights[idx, :width], sample_weights=weights[idx],
                clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high,
                agg=cfg.loss_agg, num_tokens=num_tokens, num_seqs=num_seqs)

        for group in self.optimizer.param_groups:
            group["lr"] = self.rl_lr()
        # Same chunks as the recompute (bitwise ratio 1 on-policy), minus dropped samples.
        train_chunks = [c[keep[c]] for c in chunks]
        train_chunks = [c for c in train_chunks if c.numel()]
        return self._update(tb, train_chunks, loss_fn, metrics, started,
                            staleness=stale, numerics=numerics)

    # --- supervised warm start ----------------------------------------------------------------
    def sft_step(self, examples: Sequence[SFTExample], *, lr: float | None = None,
                 publish: bool = True) -> StepResult:
        """One supervised step (mean NLL over completion tokens) on `examples`."""
        started = time.perf_counter()
        trajs = [encode_example(e, self.tokenizer, self.version, i) for i, e in enumerate(examples)]
        tb = _to_device(build_tensor_batch([[t] for t in trajs], self.config), self.device)
        on = tb.loss_mask > 0
        metrics = {"samples": float(tb.size), "loss_tokens": float(on.sum())}
        if tb.size == 0 or not bool(on.any()):
            return self._skip("no tokens to imitate", metrics, started)
        num_tokens = float(on.sum())
        mbs = self.config.micro_batch_size
        chunks = [torch.arange(i, min(i + mbs, tb.size), device=self.device)
                  for i in range(0, tb.size, mbs)]

        def loss_fn(mb: TensorBatch, logp: torch.Tensor, idx: torch.Tensor
                    ) -> tuple[torch.Tensor, dict[str, float]]:
            return sft_loss(logp, mb.loss_mask, num_tokens=num_tokens), {}

        saved_lr = [g["lr"] for g in self.optimizer.param_groups]
        if lr is not None:
            for g in self.optimizer.param_groups:
                g["lr"] = lr
        try:
            result = self._update(tb, chunks, loss_fn, metrics, started, publish=publish)
        finally:
            for g, value in zip(self.optimizer.param_groups, saved_lr):
                g["lr"] = value
        if "loss" in result.metrics:
            result.metrics["sft_loss"] = result.metrics.pop("loss")
        return result

    # --- weights, throttle, checkpoints -------------------------------------------------------
    def publish_weights(self) -> float:
        """Call `publish(model, version)` now; returns the seconds it took (0 without one)."""
        if self.publish is None:
            return 0.0
        t0 = time.perf_counter()
        outcome = self.publish(self._publish_view(), self.version)
        if inspect.isawaitable(outcome):
            if hasattr(outcome, "close"):
                outcome.close()
            raise TypeError("publish must be synchronous; wrap an async reloader, e.g. "
                            "lambda m, v: asyncio.run_coroutine_threadsafe(reload(m, v), "
                            "loop).result()")
        seconds = time.perf_counter() - t0
        log.info("published weights version %d in %.3f s", self.version, seconds)
        return seconds

    def _publish_view(self) -> Any:
        """What the publisher is given: the model (a data-parallel trainer gives its full
        weights)."""
        return self.model

    def reset_optimizer(self, *, keep_second_moments: bool = False) -> None:
        """Forget the optimizer's moments (AdamW's running gradient averages), keeping the
        weights, version and config: the next update starts like a fresh run's first one.

        `keep_second_moments=True` zeroes only the momentum (the running gradient direction)
        and keeps the per-weight gradient scale, so no update of the past is replayed while
        the next ones stay scaled by the gradients seen so far (a fresh AdamW moves every
        weight by about lr on its first updates, noise-dominated ones included).
        """
        if keep_second_moments:
            for state in self.optimizer.state.values():
                if "exp_avg" in state:
                    state["exp_avg"].zero_()
        else:
            self.optimizer.state.clear()
        self.fresh_updates = 0

    def rl_lr(self) -> float:
        """The learning rate of the next RL update (`lr` after `lr_warmup_steps`)."""
        warmup = self.config.lr_warmup_steps
        return self.config.lr * (min(1.0, (self.fresh_updates + 1) / warmup) if warmup else 1.0)

    def throttle_signal(self) -> ThrottleSignal:
        """Whether the runner should cut in-flight work now (polled after each step)."""
        return self.throttle.signal()

    def save_checkpoint(self, path: str | Path, extra: dict[str, Any] | None = None) -> Path:
        """Write an atomic checkpoint; `extra` (JSON-able, e.g. the runner cursor) comes back
        as `trainer.extra` after `Trainer.resume`."""
        if extra is not None:
            self.extra = dict(extra)
        where = ckpt.write_checkpoint(path, model=self.model, optimizer=self.optimizer,
                                      tokenizer=self.tokenizer, state=self._checkpoint_state())
        log.info("checkpoint step %d version %d written to %s", self.step_count, self.version,
                 where)
        return where

    def _checkpoint_state(self) -> dict[str, Any]:
        """The JSON trainer state a checkpoint carries (`trainer_state.json`)."""
        dtype = next(self.model.parameters()).dtype
        return {"step": self.step_count, "updates": self.updates, "version": self.version,
                "fresh_updates": self.fresh_updates,
                "config": self.config.model_dump(mode="json"), "extra": self.extra,
                "throttle": self.throttle.state_dict(),
                "model_dtype": str(dtype).removeprefix("torch.")}

    def _load_progress(self, state: dict[str, Any], rng: dict[str, Any]) -> None:
        """After the optimizer state is loaded: the config's optimizer settings, the
        counters, `extra`, the throttle and the RNG states of a checkpoint."""
        for group in self.optimizer.param_groups:  # the config given now wins over saved
            group.update(lr=self.config.lr, betas=self.config.betas,
                         eps=self.config.adam_eps, weight_decay=self.config.weight_decay)
        self.step_count = state["step"]
        self.updates = state["updates"]
        self.fresh_updates = state.get("fresh_updates", state["updates"])
        self.extra = state.get("extra", {})
        self.throttle.load_state_dict(state.get("throttle", {}))
        ckpt.restore_rng(rng)

    @classmethod
    def resume(cls, path: str | Path, model: torch.nn.Module | None = None,
               tokenizer: Any = None, config: StepConfig | None = None,
               publish: Publisher | None = None, *,
               device: str | torch.device | None = None) -> "Trainer":
        """Rebuild a trainer from `save_checkpoint` output.

        Without `model`, the saved model is loaded with transformers' `from_pretrained` onto
        `device` (CUDA when available); with one, the saved weights are copied into it.
        RNG states are restored, so the next step matches an uninterrupted run. A
        data-parallel run's sharded checkpoint loads too, resharded to this one process.
        """
        where = ckpt.resolve(path)
        state = ckpt.read_json_state(where)
        if model is None:
            from transformers import AutoModelForCausalLM

            target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
            dtype = getattr(torch, state["model_dtype"])
            if (where / "model" / "adapter_config.json").is_file():  # a LoRA run: base + adapter
                from peft import AutoPeftModelForCausalLM

                model = AutoPeftModelForCausalLM.from_pretrained(
                    str(where / "model"), is_trainable=True, dtype=dtype).to(target)
                model.eval()
            else:
                model = AutoModelForCausalLM.from_pretrained(str(where / "model"),
                                                             dtype=dtype).to(target)
        else:
            ckpt.load_weights_into(model, where)
        if tokenizer is None and (where / "tokenizer").is_dir():
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(where / "tokenizer"))
        trainer = cls(model, tokenizer, config or StepConfig(**state["config"]), publish,
                      version=state["version"])
        if ckpt.is_sharded(state):  # a data-parallel run's: its shards, resharded to one
            ckpt.load_shards(where, trainer.model, trainer.optimizer)
            rng = torch.load(ckpt.rng_file(where, 0), weights_only=False)
        else:
            saved = ckpt.read_state(where, device=trainer.device)
            trainer.optimizer.load_state_dict(saved.optimizer)
            rng = saved.rng
        trainer._load_progress(state, rng)
        log.info("resumed from %s at step %d, version %d", where, trainer.step_count,
                 trainer.version)
        return trainer

    # --- internals ----------------------------------------------------------------------------
    def _forward_logprobs(self, mb: TensorBatch) -> torch.Tensor:
        autocast = (torch.autocast(self.device.type, dtype=torch.bfloat16)
                    if self.compute_dtype == torch.bfloat16 else nullcontext())
        prefix = self._shared_prefix(mb)
        with autocast:
            if prefix:
                logits = suffix_logits(self.model, mb.input_ids, mb.attention_mask, prefix,
                                       str(self._cache_keyword))
            else:
                logits = self.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                                    use_cache=False).logits
        logp = token_logprobs(logits, mb.input_ids[:, prefix:], self.config.temperature)
        return torch.nn.functional.pad(logp, (prefix, 0), value=0.0)

    def _shared_prefix(self, mb: TensorBatch) -> int:
        """Length of the prompt prefix to run once for the whole micro-batch (0: none)."""
        least = self.config.share_prefix_min
        if not least or mb.size < 2 or self._cache_keyword is None:
            return 0
        prefix = shared_prefix_length(mb.input_ids, mb.attention_mask, mb.loss_mask)
        return prefix if prefix >= least else 0

    @torch.no_grad()
    def _recompute(self, tb: TensorBatch, chunks: list[torch.Tensor]) -> torch.Tensor:
        prox = torch.zeros_like(tb.behaviour_logprobs)
        for idx in chunks:
            mb = tb.select(idx)
            logp = self._forward_logprobs(mb)
            prox[idx, : logp.shape[1]] = logp
        return prox

    def _update(self, tb: TensorBatch, chunks: list[torch.Tensor], loss_fn: LossFn,
                metrics: dict[str, float], started: float, *, publish: bool = True,
                staleness: StalenessReport | None = None,
                numerics: NumericsReport | None = None) -> StepResult:
        """Accumulate gradients over `chunks`, clip, step, publish; stop on NaN/inf."""
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        try:
            total, sums = self._accumulate(tb, chunks, loss_fn)
            clip = self.config.grad_clip if self.config.grad_clip > 0 else float("inf")
            grad_norm = self._clip_grad_norm(clip)
            if not np.isfinite(grad_norm):
                raise NonFinite(f"non-finite gradient norm ({grad_norm})")
        except NonFinite as stop:
            self.optimizer.zero_grad(set_to_none=True)
            return self._skip(f"{stop}; no update applied, weights kept from the last good "
                              "step", metrics, started, nonfinite=True, staleness=staleness,
                              numerics=numerics)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        self.updates += 1
        self.fresh_updates += 1
        metrics["time/train_s"] = time.perf_counter() - t0
        metrics["time/sync_s"] = self.publish_weights() if publish else 0.0
        weight = max(metrics.get("loss_tokens", 0.0), 1.0)
        for key, value in sums.items():
            metrics[key] = value if key == "ratio_max" else value / weight
        metrics.update({"loss": total, "grad_norm": grad_norm, "nonfinite": 0.0,
                        "lr": float(self.optimizer.param_groups[0]["lr"])})
        return self._finish(True, None, metrics, started, staleness, numerics)

    def _accumulate(self, tb: TensorBatch, chunks: list[torch.Tensor], loss_fn: LossFn
                    ) -> tuple[float, dict[str, float]]:
        """Backward every micro-batch of `chunks`; returns the summed loss and the loss parts
        (token-weighted sums, `ratio_max` a max). Raises `NonFinite` at a NaN/inf loss."""
        total = 0.0
        sums: dict[str, float] = {}
        for n, idx in enumerate(chunks):
            mb = tb.select(idx)
            loss, parts = loss_fn(mb, self._forward_logprobs(mb), idx)
            if not bool(torch.isfinite(loss)):
                raise NonFinite(f"non-finite loss ({float(loss.detach())}) in micro-batch {n}")
            loss.backward()
            total += float(loss.detach())
            merge_parts(sums, parts)
        return total, sums

    def _clip_grad_norm(self, clip: float) -> float:
        """Clip the gradients to norm `clip`; returns their norm before clipping."""
        return float(torch.nn.utils.clip_grad_norm_(self.params, clip))

    def _skip(self, reason: str, metrics: dict[str, float], started: float, *,
              nonfinite: bool = False, staleness: StalenessReport | None = None,
              numerics: NumericsReport | None = None) -> StepResult:
        metrics["nonfinite"] = float(nonfinite)
        (log.error if nonfinite else log.warning)("step %d skipped: %s", self.step_count, reason)
        return self._finish(False, reason, metrics, started, staleness, numerics)

    def _finish(self, applied: bool, reason: str | None, metrics: dict[str, float],
                started: float, staleness: StalenessReport | None,
                numerics: NumericsReport | None) -> StepResult:
        metrics["applied"] = float(applied)
        metrics["time/step_s"] = time.perf_counter() - started
        result = StepResult(step=self.step_count, version=self.version, applied=applied,
                            skipped_reason=reason, metrics=metrics, staleness=staleness,
                            numerics=numerics)
        self.step_count += 1
        return result


def merge_parts(sums: dict[str, float], parts: dict[str, float]) -> None:
    """Add one micro-batch's loss parts to `sums`: token-weighted, `ratio_max` as a max."""
    tokens = parts.get("loss_tokens", 0.0)
    for key, value in parts.items():
        if key == "ratio_max":
            sums[key] = max(sums.get(key, 0.0), value)
        elif key != "loss_tokens":  # token-weighted average over micro-batches
            sums[key] = sums.get(key, 0.0) + value * tokens


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The compute dtype for `StepConfig.dtype` on `device`."""
    if name == "bfloat16":
        return torch.bfloat16
    if name == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def _to_device(tb: TensorBatch, device: torch.device) -> TensorBatch:
    if tb.input_ids.device == device:
        return tb
    moved = {name: getattr(tb, name).to(device) for name in (
        "input_ids", "attention_mask", "loss_mask", "behaviour_logprobs", "versions",
        "advantages", "rewards", "group_index", "lengths")}
    token_adv = None if tb.token_advantages is None else tb.token_advantages.to(device)
    return TensorBatch(**moved, sample_ids=tb.sample_ids,
                       zero_variance_groups=tb.zero_variance_groups, excluded=tb.excluded,
                       token_advantages=token_adv, shares=tb.shares)
