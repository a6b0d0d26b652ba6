"""The training loop: a `Runner` collecting rollouts and a `Trainer` learning from them.

`await train(TrainConfig(...))` builds a `LocalPolicy` (the rollout engine) and a `Trainer`
on a second copy of the model; weights go from trainer to policy in-process after every
applied step (`LocalPublisher`), or to a vLLM engine (`corral.trainer.rollout`). Collection
and training overlap (`corral.trainer.drive`).

Files in `run_dir`: the runner's store (`trajectories.jsonl`, `manifest.json`,
`metrics.json`), `train.jsonl` (one JSON line per step), `sft.jsonl` (warm-up steps),
`rft.jsonl` (rejection-sampling fine-tuning rounds, `corral.trainer.rft`),
`eval.jsonl` (held-out evaluations; with a warm-up, the first is taken before it, marked
`"stage": "before_sft"`), `checkpoint/` (every `checkpoint_every` steps and at
the end), `train_config.json`, `usage.jsonl` (CPU / GPU / sandbox samples) and `report.html`
(the training dashboard, `corral.trainer.report`, rewritten every few steps and at the end);
with `log_to`, `tb/` (TensorBoard) and `wandb/` (an offline W&B run). A checkpoint carries
the runner cursor of its batch and the byte length of `train.jsonl`; `train(config,
resume=True)` restores both, so a killed run continues with no gap or duplicate in the step
log, and re-collects nothing it already stored.

`TrainConfig.tasks` (a `TaskSlice`) restricts every env to a documented subset of its tasks
and holds part of it out: rollouts and the warm-up use the train part, evaluations the test
part. Without it, evaluations draw tasks with a different seed from the whole dataset.
`time_budget_s` ends the RL loop early (logged) once the call has run that long.
`lora` trains a peft adapter instead of the full weights (`corral.trainer.lora`): the local
engine gets the merged weights, a vLLM engine the adapter alone.

This module sets a run up and tears it down; each job of the run has its own module:
`runlog` (the run's JSON-lines files, the step record, rewinding to a checkpoint),
`rollout` (the rollout engine and its publisher), `warmup` (SFT and RFT before RL),
`drive` (the RL steps with look-ahead), `heldout` (held-out evaluations).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import torch

from corral.errors import CorralError
from corral.fileio import write_json_atomic
from corral.runner.eval.evaluation import PhaseCallback

from . import distributed
from .config import TrainConfig
from .drive import StepCallback, drive
from .heldout import held_out_eval
from .report import TRAIN_CONFIG, ReportRefresher
from .rollout import LORA_ADAPTER, rollout_engine
from .runlog import CHECKPOINT, TRAIN_LOG, RunLog, TrainResult, rewind
from .sft import oracle_examples
from .sinks import open_sinks
from .tasks import EnvEntry, check_envs, split_envs
from .usage import UsageSampler
from .warmup import warm_up
from .zerosignal import nothing_to_learn, zero_signal_warner

# the names this module has always offered; each is defined in the module of its job
__all__ = ["CHECKPOINT", "EnvEntry", "LORA_ADAPTER", "StepCallback", "TRAIN_LOG", "TrainConfig",
           "TrainResult", "check_envs", "oracle_examples", "train"]

log = logging.getLogger(__name__)


async def train(config: TrainConfig, *, resume: bool = False,
                on_step: StepCallback | None = None, agent: Any = None,
                on_phase: PhaseCallback | None = None) -> TrainResult:
    """Run (or, with `resume`, continue) a training run; see the module docstring. `agent`:
    an `ExternalAgent` playing the episodes (default: `config.external_agent()`, else the
    native episode loop; docs/agents.md). `on_step(record)` hears every RL step;
    `on_phase(what, steps)` what runs before the first one (the model loading, the engine
    starting, the warm-up, the step-0 evaluation, the first batch) and `config.steps`. Launched
    as several ranks (`corral train --nproc N`, torchrun), rank 0 runs the loop and the others
    follow its trainer calls (`corral.trainer.distributed`)."""
    if distributed.world_size() > 1:  # before joining: every rank refuses alike, none waits
        distributed.check_supported(config.engine, config.lora)
    ctx = distributed.init()
    failed = True
    try:
        if ctx is not None:
            if config.torch_threads:
                torch.set_num_threads(config.torch_threads)
            if not ctx.is_main:
                from corral.runner import load_model

                model, tokenizer = await asyncio.to_thread(load_model, config.model,
                                                           str(ctx.device))
                steps, version = await asyncio.to_thread(distributed.follow, ctx, model,
                                                         tokenizer)
                failed = False
                return TrainResult(run_dir=config.run_dir, steps=steps, version=version)
        async with AsyncExitStack() as stack:  # a vLLM engine stops with it, even on errors
            result = await _train(config, resume, on_step, stack,
                                  agent if agent is not None else config.external_agent(),
                                  on_phase or (lambda _what, _steps: None))
        failed = False
        return result
    finally:
        distributed.finish(ctx, failed=failed)


async def _train(config: TrainConfig, resume: bool, on_step: StepCallback | None,
                 stack: AsyncExitStack, agent: Any, on_phase: PhaseCallback) -> TrainResult:
    from corral.runner import AssemblyConfig, Runner, load_model
    from corral.runner.policy.models import resolve_model_path

    def phase(what: str) -> None:
        on_phase(what, config.steps)

    started = time.perf_counter()
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    env_ids = config.env_ids()
    phase("preparing the envs")
    if config.env_servers:  # envs hosted by `corral serve-env`: corral.trainer.remote
        from .remote import remote_envs

        train_envs, eval_envs, split_record = await asyncio.to_thread(
            remote_envs, env_ids, config.env_servers,
            oracle=bool(config.sft_steps and not config.sft_from))
    else:
        await asyncio.to_thread(check_envs, env_ids)
        # never an eval-split task in training (corral.splits); the run manifest records it
        train_envs, eval_envs, split_record = await asyncio.to_thread(
            split_envs, env_ids, config.tasks, config.eval_tasks, config.band())
    if config.tasks is not None:
        log.info("task slice %s: training and held-out envs built", config.tasks.describe())
    run_dir = config.run_dir
    ckpt_dir = run_dir / CHECKPOINT
    step_log, sft_log, eval_log = (RunLog(run_dir / n) for n in
                                   (TRAIN_LOG, "sft.jsonl", "eval.jsonl"))
    has_ckpt = ckpt_dir.exists() or Path(f"{ckpt_dir}.old").exists()
    if not resume and (step_log.size() or has_ckpt):
        raise CorralError(f"{run_dir} already holds a training run; pass --resume to continue "
                          "it or choose another --run-dir")
    if resume and not has_ckpt and not step_log.size() and not (run_dir / "manifest.json"
                                                                ).exists():
        raise CorralError(f"--resume: {run_dir} holds no training run to continue; drop "
                          "--resume to start one there")
    # a --model that is not there fails before RUN_DIR is touched (a resumed run's
    # train_config.json would be overwritten)
    await asyncio.to_thread(resolve_model_path, config.model)
    source: Any = config.model
    if config.engine == "vllm":  # the same weights on both sides: "tiny" has a vLLM variant
        from corral.runner.engines.vllm import check_engine_model, engine_model, vllm_python

        source = await asyncio.to_thread(engine_model, config.model)
        # what the engine would refuse, refused before anything runs (not after an SFT
        # warm-up, at its start or its first publish)
        await asyncio.to_thread(check_engine_model, source,
                                lora_rank=config.lora.rank if config.lora else None)
        await asyncio.to_thread(vllm_python)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / TRAIN_CONFIG, config.model_dump(mode="json"))
    refresher = ReportRefresher(run_dir)  # report.html every few steps, in a thread
    # --log-to sinks open before the model loads: a missing package fails fast
    sinks = await asyncio.to_thread(open_sinks, config.log_to, run_dir,
                                    config.model_dump(mode="json"))
    stack.push_async_callback(asyncio.to_thread, sinks.close)
    eval_log.on_append, sft_log.on_append = sinks.log_eval, sinks.log_sft
    step_log.on_append = lambda record: (sinks.log_step(record), refresher.poke())

    phase(f"loading {config.model}")
    model, tokenizer = await asyncio.to_thread(load_model, source)
    if config.lora is not None:  # only the adapter trains; the engines get it after each step
        from .lora import apply_lora

        model = apply_lora(model, config.lora)
    phase(f"starting the {config.engine} engine")
    policy, publish = await rollout_engine(config, source, model, tokenizer, stack)
    result = TrainResult(run_dir=run_dir, steps=0, version=0)
    if resume and has_ckpt:
        phase("restoring the checkpoint")
        trainer = await asyncio.to_thread(distributed.build_trainer, model, tokenizer,
                                          config.step_config(), publish, ckpt_dir)
        rewind(run_dir, trainer.extra)
        await asyncio.to_thread(trainer.publish_weights)
        result.resumed_from = trainer.step_count
        log.info("resumed %s at step %d (version %d)", run_dir, trainer.step_count,
                 trainer.version)
    else:
        if resume:
            log.info("no checkpoint in %s: starting from scratch", run_dir)
        trainer = await asyncio.to_thread(distributed.build_trainer, model, tokenizer,
                                          config.step_config(), publish)
        await warm_up(config, trainer, policy, model, tokenizer, train_envs, eval_envs,
                      sft_log, eval_log, result, phase)
    ev_every = config.eval_every
    if ev_every and result.resumed_from is None:
        phase("held-out evaluation at step 0")
        result.evals.append(await held_out_eval(config, policy, 0, eval_envs))
        eval_log.append(result.evals[-1])

    runner = Runner(train_envs, policy, sandbox_capacity=config.sandbox_capacity,
                    inference_concurrency=config.inference_concurrency,
                    limits=config.episode_limits(),
                    assembly=AssemblyConfig(
                        filter_zero_variance=config.filter_zero_variance,
                        first_signal_groups=(config.zero_signal_groups
                                             if config.zero_signal == "stop" else None),
                        dynamic_sampling=config.dynamic_sampling,
                        tree_turns=config.tree_turns, tree_roots=config.tree_roots,
                        tree_branch=config.tree_branch, tree_entropy=config.tree_entropy),
                    run_dir=run_dir, seed=config.seed, env_weights=config.env_weights(),
                    agent=agent)
    if config.zero_signal == "warn":
        runner.add_listener(zero_signal_warner(config, runner))
    async with runner:
        if runner.store is not None:
            runner.store.manifest["splits"] = split_record
            await asyncio.to_thread(write_json_atomic, runner.store.manifest_path,
                                    runner.store.manifest)
        sampler = asyncio.ensure_future(UsageSampler(run_dir, runner.stats).run())
        stack.callback(sampler.cancel)  # CPU / GPU / sandbox samples for the report
        # on_step takes over from the batch's step on
        phase("collecting the first batch" if result.resumed_from is None
              else "collecting the next batch")
        from corral.runner.runner import NoTrainableGroups

        try:
            await drive(config, runner, trainer, step_log, eval_log, policy, result, on_step,
                        eval_envs, started)
        except NoTrainableGroups as exc:
            raise CorralError(nothing_to_learn(config, exc.streak, exc.seen,
                                               first=exc.first)) from None
        await asyncio.to_thread(trainer.save_checkpoint, ckpt_dir, trainer.extra)
    await refresher.finish()
    result.steps, result.version = trainer.step_count, trainer.version
    result.wall_s = time.perf_counter() - started
    return result


