"""The RL steps of a training run: batches from the runner fed to the trainer.

Collection and training overlap: while step k trains in a worker thread, the runner keeps
collecting and up to `async_level` batches may be taken from it ahead of the trainer
(`async_level=0` is synchronous: the next batch is asked for only after the step). After each
step the runner is told the new version; when the trainer's throttle signal says divergence is
rising, in-flight rollouts are cut. Every step is a line of `train.jsonl`; checkpoints carry the
runner cursor of their batch and the log's length, and held-out evaluations run on schedule.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from corral.runner.trajectory import Batch

from .config import TrainConfig
from .heldout import held_out_eval
from .runlog import CHECKPOINT, RunLog, TrainResult, step_record
from .tasks import EnvEntry
from .trainer import Trainer

__all__ = ["StepCallback", "drive"]

log = logging.getLogger(__name__)

StepCallback = Callable[[dict[str, Any]], None]


async def drive(config: TrainConfig, runner: Any, trainer: Trainer, step_log: RunLog,
                eval_log: RunLog, policy: Any, result: TrainResult,
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
            record = step_record(step, batch, timing, {"cut": cut})
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
                result.evals.append(await held_out_eval(config, policy, trainer.step_count,
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
