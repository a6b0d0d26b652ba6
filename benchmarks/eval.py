"""Evaluation throughput: `corral eval` (the Runner, 8 episodes at once) vs a sequential loop.

    .venv/bin/python benchmarks/eval.py                       # term-text-v0, 16 tasks x 2
    .venv/bin/python benchmarks/eval.py --tasks 8 --samples 2 --latency 0.2

Both sides run the same episodes of `corral/term-text-v0` (the first `--tasks` tasks of its
eval split, `--samples` each) in real sandboxes (backend "auto": bubblewrap where it works,
else Docker), with the same policy: a `ScriptedPolicy` that runs one bash command then
answers, each call paying `--latency` seconds (a stand-in for a model's decode time, so the
figures do not depend on a model). Side A is `aevaluate` with sandbox capacity and inference
concurrency 8. Side B is the loop a script written around `cr.make` would be: one env, for
each task and sample `reset`, generate, `step` until done, one episode after the other, a
fresh sandbox per episode. Prints `name=value` figures: trajectories/s of each and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import corral as cr
from corral.runner import ChatTranscript, EpisodeLimits, GenerationRequest
from corral.runner.eval.evaluation import aevaluate
from corral.runner.policy import ScriptedPolicy

ENV = "corral/term-text-v0"
SCRIPT = ['<tool_call>{"name": "bash", "arguments": {"command": "ls /root"}}</tool_call>',
          "done"]


async def sequential(tasks: list[dict[str, Any]], samples: int, policy: ScriptedPolicy
                     ) -> int:
    """Run every (task, sample) episode one after the other; returns how many ran."""
    env = cr.make(ENV)
    done = 0
    for index, task in enumerate(tasks):
        for sample in range(samples):
            await env.areset(seed=sample, options={"task": task})
            transcript = ChatTranscript(policy.tokenizer, env.episode.messages,
                                        tools=env.tool_schemas() or None)
            while not env.episode.done:
                gen = await policy.generate(GenerationRequest(
                    prompt_ids=list(transcript.ids), max_tokens=128,
                    session_id=f"seq-{index}-{sample}"))
                before = len(env.episode.messages)
                await env.astep(gen.text)
                transcript.add_generation(gen.token_ids, gen.text)
                transcript.add_messages(env.episode.messages[before + 1:])
            await env.aclose()
            done += 1
    return done


async def main(args: argparse.Namespace) -> dict[str, float]:
    run_dir = Path(tempfile.mkdtemp(prefix="corral-bench-eval-"))
    try:
        policy = ScriptedPolicy(SCRIPT, latency=args.latency)
        started = time.perf_counter()
        result = await aevaluate([ENV], policy, tasks=args.tasks, samples=args.samples,
                                 run_dir=run_dir, sandbox_capacity=8, inference_concurrency=8,
                                 limits=EpisodeLimits(max_tokens=128), report=False)
        concurrent_s = time.perf_counter() - started
        plan = json.loads((run_dir / "eval_plan.json").read_text())["envs"][ENV]["tasks"]
        started = time.perf_counter()
        count = await sequential(plan, args.samples,
                                 ScriptedPolicy(SCRIPT, latency=args.latency))
        sequential_s = time.perf_counter() - started
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    figures = {"episodes": float(count), "latency_s": args.latency,
               "eval_c8_s": concurrent_s, "eval_c8_traj_per_s": result.trajectories / concurrent_s,
               "sequential_s": sequential_s, "sequential_traj_per_s": count / sequential_s,
               "pass_at_1": result.summary["overall"]["pass"]["1"] or 0.0}
    figures["speedup"] = figures["eval_c8_traj_per_s"] / figures["sequential_traj_per_s"]
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--latency", type=float, default=0.1,
                        help="seconds per generate call (modelled decode time)")
    for name, value in asyncio.run(main(parser.parse_args())).items():
        print(f"{name}={value:.3f}")
