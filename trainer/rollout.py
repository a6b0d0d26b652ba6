"""The rollout engine of a training run and the publisher that hands it new weights.

`engine="local"` is a `LocalPolicy` in this process, fed by a `LocalPublisher`; `"vllm"`
starts a `VLLMEngine` (stopped with the run's exit stack) whose logprobs are checked against
the trainer's before any rollout (`corral.trainer.probe`).
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import Any, Callable

from .config import TrainConfig
from .publish import LocalPublisher
from .runlog import RunLog

__all__ = ["LORA_ADAPTER", "rollout_engine"]

LORA_ADAPTER = "corral-lora"  # the adapter's name on a vLLM engine (requests ask for it)


async def rollout_engine(config: TrainConfig, source: Any, model: Any, tokenizer: Any,
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
    RunLog(config.run_dir / "engine.jsonl").append({"event": "start-up probe",
                                                    **report.to_dict()})
    check_gap(report, config.engine_max_gap, "engine start-up probe")
    policy = engine.policy(tokenizer)
    stack.push_async_callback(policy.close)
    return policy, publish
