"""LocalPolicy generation speed for one RL batch, side by side in one run.

    .venv/bin/python benchmarks/rollout_engine.py --rounds 6

The shape is `corral demo`'s: the tiny model it trains (hidden 128, 2 layers), 64 rollouts of
28 sampled tokens on real `corral/word-sort-v0` prompts, all requested at once. Two things are
varied, interleaved round by round so machine noise hits every row alike:

- prompts: `grouped` (8 tasks x 8 samples, a GRPO batch: identical prompts are prefilled once)
  or `distinct` (64 tasks, nothing to share);
- `max_batch` of the policy: 16 (the old default of `corral train`) or 64 (now `corral train`
  passes its `inference_concurrency`).

Prints the median seconds per batch of every row and `grouped_speedup=`, `wide_batch_speedup=`
and `speedup_vs_old_default=` lines.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from corral.registry import make
from corral.runner.policy import GenerationRequest, LocalPolicy, build_tiny_model, load_tokenizer
from learning import prompt_ids  # the prompt exactly as the runner encodes it

ENV = "corral/word-sort-v0"


def prompts(tokenizer, tasks: int) -> list[list[int]]:
    env = make(ENV)
    return [prompt_ids(tokenizer, env, env.pick_task({"task_index": i})) for i in range(tasks)]


async def one_batch(policy: LocalPolicy, batch: list[list[int]], max_tokens: int,
                    seed: int) -> float:
    started = time.perf_counter()
    await asyncio.gather(*(policy.generate(GenerationRequest(
        ids, max_tokens=max_tokens, temperature=1.0, seed=seed * 1000 + i))
        for i, ids in enumerate(batch)))
    return time.perf_counter() - started


async def main_async(args: argparse.Namespace) -> None:
    model = build_tiny_model(Path(tempfile.mkdtemp()) / "tiny", hidden=128, layers=2, heads=4)
    tokenizer = load_tokenizer(model)
    distinct = prompts(tokenizer, args.batch)
    grouped = [distinct[i // args.group] for i in range(args.batch)]
    print(f"rollouts={args.batch} group={args.group} max_tokens={args.max_tokens} "
          f"prompt_tokens_mean={statistics.fmean(map(len, distinct)):.0f}")
    policies = {width: LocalPolicy(model, max_batch=width) for width in (16, args.batch)}
    times: dict[tuple[int, str], list[float]] = {}
    for round_ in range(args.rounds + 1):  # round 0 warms up and is not counted
        for width, policy in policies.items():
            for name, batch in (("grouped", grouped), ("distinct", distinct)):
                seconds = await one_batch(policy, batch, args.max_tokens, round_)
                if round_:
                    times.setdefault((width, name), []).append(seconds)
    median = {key: statistics.median(v) for key, v in times.items()}
    print(f"{'max_batch':>9}  {'prompts':<9} {'s per batch':>11}")
    for (width, name), seconds in median.items():
        print(f"{width:>9}  {name:<9} {seconds:>11.3f}")
    wide = args.batch
    print(f"grouped_speedup={median[(wide, 'distinct')] / median[(wide, 'grouped')]:.2f}")
    print(f"wide_batch_speedup={median[(16, 'grouped')] / median[(wide, 'grouped')]:.2f}")
    print(f"speedup_vs_old_default={median[(16, 'distinct')] / median[(wide, 'grouped')]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=28)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
