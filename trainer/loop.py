"""The training loop: a `Runner` collecting rollouts and a `Trainer` learning from them.

`await train(TrainConfig(...))` builds a `LocalPolicy` (the rollout engine) and a `Trainer`
on a second copy of the model; weights go from trainer to policy in-process after every
applied step (`LocalPublisher`). Collection and training overlap: while step k trains in a
worker thread, the runner keeps collecting and up to `async_level` batches may be taken from
it ahead of the trainer (`async_level=0` is synchronous: the next batch is asked for only
after the step). After each step the runner is told the new version; when the trainer's
throttle signal says divergence is rising, in-flight rollouts are cut.

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
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from contextlib import AsyncExitStack
from typing import Any, Callable, Union

import torch

from corral.errors import CorralError
from corral.fileio import write_json_atomic
from corral.runner.trajectory import Batch, Trajectory

from . import distributed
from .config import TrainConfig
from .publish import LocalPublisher
from .report import TRAIN_CONFIG, ReportRefresher
from .sft import supervised_warmup
from .sinks import open_sinks
from .tasks import split_envs
from .trainer import StepResult, Trainer
from .usage import UsageSampler
from .zerosignal import nothing_to_learn, zero_signal_warner

__all__ = ["CHECKPOINT", "EnvEntry", "LORA_ADAPTER", "StepCallback", "TRAIN_LOG", "TrainResult",
           "check_envs", "oracle_examples", "train"]

log = logging.getLogger(__name__)

TRAIN_LOG = "train.jsonl"
LORA_ADAPTER = "corral-lora"  # the adapter's name on a vLLM engine (requests ask for it)
CHECKPOINT = "checkpoint"


@dataclass
class TrainResult:
    """What a `train` call did."""

    run_dir: Path
    steps: int                         # trainer step counter at the end
    version: int                       # policy version at the end
    records: list[dict[str, Any]] = field(default_factory=list)   # this call's step lines
    sft: list[dict[str, Any]] = field(default_factory=list)
    rft: list[dict[str, Any]] = field(default_factory=list)   # one record per RFT round
    evals: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: int | None = None    # step of the checkpoint resumed from
    wall_s: float = 0.0


StepCallback = Callable[[dict[str, Any]], None]


def check_envs(env_ids: list[str]) -> None:
    """Raise the registry's one-line error (with suggestions) for an unknown env id."""
    from corral.registry import spec

    for env_id in env_ids:
        spec(env_id)


EnvEntry = Union[str, Callable[[], Any]]


def _make(entry: EnvEntry) -> Any:
    import corral as cr

    return cr.make(entry) if isinstance(entry, str) else entry()


async def oracle_examples(envs: list[EnvEntry], tokenizer: Any, n: int, seed: int
                          ) -> list[Trajectory]:
    """Up to `n` supervised examples: each env's prompt (the same chat rendering the runner
    uses) followed by its oracle's final answer. `envs` are env ids or factories (a task
    slice's train envs). Envs whose oracle is not a single text answer (multi-turn, tool
    calls) are skipped with a log line."""
    from corral.runner import ChatTranscript

    end = tokenizer.convert_tokens_to_ids("<|im_end|>") if hasattr(
        tokenizer, "convert_tokens_to_ids") else None
    end = end if isinstance(end, int) and end >= 0 else tokenizer.eos_token_id
    examples: list[Trajectory] = []
    per_env = math.ceil(n / len(envs))
    for entry in envs:
        env = _make(entry)
        env_id = str(env.env_id or entry)
        try:
            for i in range(per_env):
                await env.areset(seed=seed * 100_003 + i)
                answer = env.solution(env.episode.task)
                if not isinstance(answer, str):
                    log.info("warm-up skips %s: its oracle is not a single text answer", env_id)
                    break
                prompt = ChatTranscript(tokenizer, env.episode.messages,
                                        tools=env.tool_schemas() or None).ids
                completion = [*tokenizer.encode(answer, add_special_tokens=False), end]
                traj = Trajectory(id=f"sft-{env_id}-{i}", env_id=env_id, task_id=str(i),
                                  group_id=f"sft-{i}")
                traj.append(prompt, generated=False)
                traj.append(completion, generated=True, logprobs=[0.0] * len(completion),
                            version=0)
                examples.append(traj)
        finally:
            await env.aclose()
    return examples[:n]


class _Log:
    """Append-only JSON lines, fsync'd per line so a kill loses at most the line being written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.on_append: Callable[[dict[str, Any]], None] | None = None  # metric sinks, report

    def append(self, record: dict[str, Any]) -> int:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=float) + "\n")
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        if self.on_append is not None:
            self.on_append(record)
        return size

    def size(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0


def _rewind(run_dir: Path, extra: dict[str, Any]) -> None:
    """Put the run back where the checkpoint was: the step log is cut to its length then
    (steps logged after it are redone), and the runner cursor is set to the checkpoint's
    batch, so batches taken after it are handed out again from the store."""

    log_path = run_dir / TRAIN_LOG
    if log_path.exists() and "log_bytes" in extra:
        with open(log_path, "r+b") as f:
            f.truncate(int(extra["log_bytes"]))
    manifest = run_dir / "manifest.json"
    if manifest.exists() and "cursor" in extra:
        data = json.loads(manifest.read_text())
        data["cursor"] = extra["cursor"]
        write_json_atomic(manifest, data)


def _record(result: StepResult, batch: Batch, timing: dict[str, float],
            runner_stats: dict[str, Any]) -> dict[str, Any]:
    rewards = [t.reward for g in batch.groups for t in g]
    rollouts = batch.stats.get("rollouts") or {}
    record: dict[str, Any] = {
        "step": result.step, "version": result.version, "applied": result.applied,
        "skipped_reason": result.skipped_reason,
        # every rollout of the groups completed since the last batch, filtered ones included
        "rollout_reward_mean": rollouts.get("reward_mean"),
        "rollout_pass_rate": rollouts.get("pass_rate"),
        "rollout_episodes": rollouts.get("episodes", 0),
        "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,  # the trained groups
        "batch_index": batch.stats.get("index"), "batch_version": batch.policy_version,
        "trajectories": len(rewards), **timing,
        "reward_by_env": _by_env(batch.trajectories),
        "generated_tokens": sum(t.generated_tokens for t in batch.trajectories),
        "metrics": {k: (v if math.isfinite(v) else str(v)) for k, v in result.metrics.items()},
        "cut_inflight": runner_stats.get("cut", 0)}
    if result.staleness is not None:
        record["staleness_hist"] = _hist(result.staleness.age_histogram())
        record["divergence_hist"] = _hist(result.staleness.divergence_histogram())
    if result.numerics is not None:
        record["numerics"] = _jsonable(result.numerics)
    return record


def _by_env(trajectories: list[Trajectory]) -> dict[str, float]:
    """Mean reward per env (the report draws one curve per env)."""
    sums: dict[str, list[float]] = {}
    for traj in trajectories:
        sums.setdefault(traj.env_id, []).append(traj.reward)
    return {env: sum(v) / len(v) for env, v in sums.items()}


def _hist(hist: tuple[Any, Any]) -> dict[str, list[float]]:
    counts, edges = hist
    return {"counts": [int(c) for c in counts], "edges": [float(e) for e in edges]}


def _jsonable(value: Any) -> Any:
    for name in ("to_dict", "model_dump", "as_dict"):
        if hasattr(value, name):
            return getattr(value, name)()
    from dataclasses import asdict, is_dataclass

    return asdict(value) if is_dataclass(value) else str(value)


async def _evaluate(config: TrainConfig, policy: Any, step: int, envs: list[EnvEntry],
                    stage: str = "rl") -> dict[str, Any]:
    """Mean reward on held-out tasks (a task slice's test part, else a separate seed's task
    plan over the whole dataset), one sample per task."""
    from corral.runner import Runner

    async with Runner(envs, policy, sandbox_capacity=config.sandbox_capacity,
                      inference_concurrency=config.inference_concurrency,
                      limits=config.episode_limits(), seed=config.seed + 1_000_003,
                      env_weights=config.env_weights(), agent=config.external_agent()) as ev:
        trajs = await ev.collect(config.eval_tasks, group=1)
        thresholds = {source.label: source.threshold for source in ev.sources}
    rewards = [t.reward for t in trajs]
    solved = sum(t.reward >= thresholds.get(t.env_id, 1.0) - 1e-9 for t in trajs)
    return {"step": step, "stage": stage, "version": policy.version, "tasks": len(rewards),
            "reward_mean": sum(rewards) / max(1, len(rewards)),
            "pass_rate": solved / max(1, len(rewards)), "by_env": _by_env(trajs)}


async def _rollout_engine(config: TrainConfig, source: Any, model: Any, tokenizer: Any,
                          stack: AsyncExitStack) -> tuple[Any, Callable[..., Any]]:
    """The rollout policy and its weight publisher; a vLLM engine is started (and stopped
    with `stack`), and its logprobs are checked against the trainer's before any rollout."""
    from corral.runner import LocalPolicy

    if config.engine == "local":
        # every generate call the runner may have in flight decodes in one batch: a decode
        # step costs far less per row in a wide batch (benchmarks/rollout_engine.py)
        policy = await asyncio.to_thread(LocalPolicy, config.model,
                                         max_batch=config.inference_concurrency)
        return policy, LocalPublisher(policy)
    from corral.runner.engines.vllm import VLLMEngine

    from .probe import check_gap, probe_gap
    from .publish import VLLMPublisher

    lora = config.lora
    engine = VLLMEngine(source, replicas=config.engine_replicas,
                        log_dir=config.run_dir / "engine", adapter=LORA_ADAPTER if lora else None,
                        lora_rank=lora.rank if lora else 16)
    stack.push_async_callback(asyncio.to_thread, engine.stop)
    await asyncio.to_thread(engine.start)
    publish = VLLMPublisher.for_engine(engine, config.run_dir / "published", tokenizer=tokenizer,
                                       temperature=config.temperature,
                                       max_gap=config.engine_max_gap)
    if lora:  # requests name the adapter: it must be loaded (version 0: B = 0) before any
        await asyncio.to_thread(publish, model, 0)
    report = await asyncio.to_thread(probe_gap, engine.replica_policy, engine.urls, model,
                                     tokenizer, version=0, temperature=config.temperature)
    _Log(config.run_dir / "engine.jsonl").append({"event": "start-up probe",
                                                  **report.to_dict()})
    check_gap(report, config.engine_max_gap, "engine start-up probe")
    policy = engine.policy(tokenizer)
    stack.push_async_callback(policy.close)
    return policy, publish


async def train(config: TrainConfig, *, resume: bool = False,
                on_step: StepCallback | None = None, agent: Any = None) -> TrainResult:
    """Run (or, with `resume`, continue) a training run; see the module docstring. `agent`:
    an `ExternalAgent` playing the episodes (default: `config.external_agent()`, else the
    native episode loop; docs/agents.md). Launched
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
                                  agent if agent is not None else config.external_agent())
        failed = False
        return result
    finally:
        distributed.finish(ctx, failed=failed)


async def _train(config: TrainConfig, resume: bool, on_step: StepCallback | None,
                 stack: AsyncExitStack, agent: Any = None) -> TrainResult:
    from corral.runner import AssemblyConfig, Runner, load_model
    from corral.runner.policy.models import resolve_model_path

    started = time.perf_counter()
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    env_ids = config.env_ids()
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
    step_log, sft_log, eval_log = (_Log(run_dir / n) for n in
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

    model, tokenizer = await asyncio.to_thread(load_model, source)
    if config.lora is not None:  # only the adapter trains; the engines get it after each step
        from .lora import apply_lora

        model = apply_lora(model, config.lora)
    policy, publish = await _rollout_engine(config, source, model, tokenizer, stack)
    result = TrainResult(run_dir=run_dir, steps=0, version=0)
    if resume and has_ckpt:
        trainer = await asyncio.to_thread(distributed.build_trainer, model, tokenizer,
                                          config.step_config(), publish, ckpt_dir)
        _rewind(run_dir, trainer.extra)
        await asyncio.to_thread(trainer.publish_weights)
        result.resumed_from = trainer.step_count
        log.info("resumed %s at step %d (version %d)", run_dir, trainer.step_count,
                 trainer.version)
    else:
        if resume:
            log.info("no checkpoint in %s: starting from scratch", run_dir)
        trainer = await asyncio.to_thread(distributed.build_trainer, model, tokenizer,
                                          config.step_config(), publish)
        warm = config.sft_steps or config.rft_rounds
        if warm and config.eval_every:  # the warm-up's own gain, reported apart
            result.evals.append(await _evaluate(config, policy, 0, eval_envs, "before_sft"))
            eval_log.append(result.evals[-1])
        if config.sft_steps:
            if config.sft_from:
                from .sft import dataset_examples

                vocab = int(model.get_input_embeddings().weight.shape[0])
                examples = await asyncio.to_thread(dataset_examples, config.sft_from,
                                                   tokenizer, vocab)
            else:
                examples = await oracle_examples(train_envs, tokenizer, config.sft_examples,
                                                 config.seed)
            if not examples:
                raise CorralError(f"no oracle text answers for a warm-up in {env_ids}; "
                                  "pass --sft-steps 0")
            steps = await asyncio.to_thread(
                supervised_warmup, trainer, examples, config.sft_steps,
                batch_size=min(config.sft_batch, len(examples)), lr=config.sft_lr or config.lr)
            for r in steps:
                rec = {"step": r.step, "sft_loss": r.metrics.get("sft_loss"),
                       "applied": r.applied}
                sft_log.append(rec)
                result.sft.append(rec)
        if config.rft_rounds:
            from .rft import rft_round

            rft_log = _Log(run_dir / "rft.jsonl")
            for index in range(1, config.rft_rounds + 1):
                record = await rft_round(config, index, policy, trainer, train_envs,
                                         lambda rec: (sft_log.append(rec),
                                                      result.sft.append(rec)))
                rft_log.append(record)
                result.rft.append(record)
        trainer.step_count = 0  # RL steps are counted from 0; warm-ups have their own logs
    ev_every = config.eval_every
    if ev_every and result.resumed_from is None:
        result.evals.append(await _evaluate(config, policy, 0, eval_envs))
        eval_log.append(result.evals[-1])

    runner = Runner(train_envs, policy, sandbox_capacity=config.sandbox_capacity,
                    inference_concurrency=config.inference_concurrency,
                    limits=config.episode_limits(),
                    assembly=AssemblyConfig(
                        filter_zero_variance=config.filter_zero_variance,
                        first_signal_groups=(config.zero_signal_groups
                                             if config.zero_signal == "stop" else None),
                        dynamic_sampling=config.dynamic_sampling),
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
        from corral.runner.runner import NoTrainableGroups

        try:
            await _drive(config, runner, trainer, step_log, eval_log, policy, result, on_step,
                         eval_envs, started)
        except NoTrainableGroups as exc:
            raise CorralError(nothing_to_learn(config, exc.streak, exc.seen,
                                               first=exc.first)) from None
        await asyncio.to_thread(trainer.save_checkpoint, ckpt_dir, trainer.extra)
    await refresher.finish()
    result.steps, result.version = trainer.step_count, trainer.version
    result.wall_s = time.perf_counter() - started
    return result


async def _drive(config: TrainConfig, runner: Any, trainer: Trainer, step_log: _Log,
                 eval_log: _Log, policy: Any, result: TrainResult,
                 on_step: StepCallback | None, eval_envs: list[EnvEntry],
                 started: float) -> None:
    """Feed batches to the trainer with `async_level` batches of look-ahead."""
    remaining = config.steps - trainer.step_count
    if remaining <= 0:
        return
    batches = runner.batches(config.batch_size, config.group)
    # A slot is a batch the collector may take before the trainer has started on it; the
    # trainer gives a slot back when it takes a batch, so step k trains while k+1 collects.
    slots = asyncio.Semaphore(max(1, config.async_level))
    ready: asyncio.Queue[tuple[Batch, dict[str, Any], float, float]] = asyncio.Queue()

    async def next_batch() -> tuple[Batch, dict[str, Any], float, float]:
        asked = time.time()
        batch = await anext(batches)
        cursor = runner.store.cursor if runner.store is not None else {}
        return batch, cursor, asked, time.time()

    async def collect() -> None:
        for _ in range(remaining):
            await slots.acquire()
            await ready.put(await next_batch())

    collector = asyncio.create_task(collect()) if config.async_level else None
    try:
        for _ in range(remaining):
            wait_start = time.perf_counter()
            if collector is not None:
                getter = asyncio.ensure_future(ready.get())
                done, _ = await asyncio.wait({getter, collector},
                                             return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:  # the collector died: surface its error
                    getter.cancel()
                    collector.result()
                item = getter.result()
                slots.release()
            else:
                item = await next_batch()
            batch, cursor, asked, got = item
            data_wait = time.perf_counter() - wait_start
            train_start = time.time()
            step = await asyncio.to_thread(trainer.step, batch)
            train_end = time.time()
            if step.applied:
                runner.on_policy_update(step.version)
            elif step.metrics.get("nonfinite"):
                log.error("step %d: non-finite values (%s); weights kept, run continues",
                          step.step, step.skipped_reason)
            else:
                log.info("step %d skipped: %s", step.step, step.skipped_reason)
            cut = 0
            if trainer.throttle_signal().cut_inflight:
                cut = runner.cut_inflight()
                log.info("divergence rising: cut %d in-flight rollouts", cut)
            timing = {"time/collect_start": asked, "time/collect_end": got,
                      "time/train_start": train_start, "time/train_end": train_end,
                      "time/data_wait_s": data_wait,
                      "time/step_s": train_end - train_start,
                      "time/sync_s": step.metrics.get("time/sync_s", 0.0)}
            record = _record(step, batch, timing, {"cut": cut})
            published = getattr(trainer.publish, "last", None)
            if step.applied and published:  # an engine's publish: replicas, times, gap
                record["publish"] = published
            size = step_log.append(record)
            result.records.append(record)
            trainer.extra = {"cursor": cursor, "log_bytes": size}
            if trainer.step_count % config.checkpoint_every == 0:
                await asyncio.to_thread(trainer.save_checkpoint, config.run_dir / CHECKPOINT,
                                        trainer.extra)
            over = (config.time_budget_s is not None
                    and time.perf_counter() - started > config.time_budget_s)
            if config.eval_every and (trainer.step_count % config.eval_every == 0 or over):
                result.evals.append(await _evaluate(config, policy, trainer.step_count,
                                                    eval_envs))
                eval_log.append(result.evals[-1])
            if on_step is not None:  # with the latest held-out figure, for progress displays
                held = [e for e in result.evals if e.get("stage") != "before_sft"]
                on_step({**record, "held_out": held[-1] if held else None})
            if over:
                log.warning("time budget of %.0f s reached after step %d; stopping here",
                            config.time_budget_s, trainer.step_count)
                break
    finally:
        if collector is not None:
            collector.cancel()
            await asyncio.gather(collector, return_exceptions=True)
        await batches.aclose()
