"""Env server overhead: remote (loopback WebSocket) vs in-process, for text and terminal envs.

    python benchmarks/serve_env.py [--steps 300] [--episodes 4] [--concurrency 4]

Prints: median/p90 per-step latency of a text env (guess-number, a multi-turn game) and a
terminal env (term-files, `bash true` in bwrap) in-process and through `corral serve-env`,
the added median per step; sessions opened per second (sequential and 8 at once); and
episodes/s of the built-in terminal suite played by its oracle through one server vs
in-process at the same concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx

import corral as cr
from corral.agents import play

TEXT, TERM = "corral/guess-number-v0", "corral/term-files-v0"
SUITE = ["corral/term-data-v0", "corral/term-files-v0", "corral/term-git-v0",
         "corral/term-procs-v0", "corral/term-python-v0", "corral/term-text-v0"]


def start_server(env_ids: list[str], max_sessions: int) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "corral.cli", "serve-env", *env_ids,
                             "--port", str(port), "--max-sessions", str(max_sessions),
                             "--backend", "bwrap"], start_new_session=True,
                            stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)


async def step_times(env: Any, steps: int, action: Any, turns: int) -> list[float]:
    """Seconds per step over `steps` steps (a reset every `turns` steps, not timed)."""
    times: list[float] = []
    while len(times) < steps:
        await env.areset(seed=len(times))
        for _ in range(turns):
            start = time.perf_counter()
            _, _, terminated, truncated, _ = await env.astep(action)
            times.append(time.perf_counter() - start)
            if terminated or truncated:
                break
    await env.aclose()
    return times


def summary(label: str, local: list[float], remote: list[float]) -> None:
    lm, rm = statistics.median(local), statistics.median(remote)
    p90 = statistics.quantiles(remote, n=10)[-1]
    print(f"{label:<28} in-process {lm * 1e3:7.3f} ms   remote {rm * 1e3:7.3f} ms "
          f"(p90 {p90 * 1e3:.3f})   added {(rm - lm) * 1e3:+.3f} ms/step")


async def sessions_per_second(url: str, count: int, parallel: int) -> float:
    template = cr.remote(url, TEXT)

    async def one() -> None:
        env = template()  # another session of the same env (no description fetch)
        await env.areset(seed=0)
        await env.aclose()

    start = time.perf_counter()
    for _ in range(count // parallel):
        await asyncio.gather(*(one() for _ in range(parallel)))
    return (count // parallel * parallel) / (time.perf_counter() - start)


async def suite_rate(make_env: Any, episodes: int, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one(env_id: str, index: int) -> float:
        async with gate:
            result = await play(make_env(env_id), "oracle", seed=index,
                                options={"task_index": index})
            return result.reward

    jobs = [one(e, i) for e in SUITE for i in range(episodes)]
    start = time.perf_counter()
    rewards = await asyncio.gather(*jobs)
    rate = len(jobs) / (time.perf_counter() - start)
    solved = sum(r >= 1.0 for r in rewards)
    print(f"  ({solved}/{len(jobs)} episodes solved by the oracle)")
    return rate


async def main(args: argparse.Namespace) -> None:
    os.environ.setdefault("CORRAL_RUN_ID", "bench-serve-env")
    proc, url = start_server([TEXT, *SUITE], max_sessions=max(16, args.concurrency))
    try:
        guess = "1"  # a wrong guess: the game goes on for its 8 turns
        local = await step_times(cr.make(TEXT), args.steps, guess, 7)
        remote = await step_times(cr.remote(url, TEXT), args.steps, guess, 7)
        summary("text (guess-number)", local, remote)
        bash = {"name": "bash", "arguments": {"command": "true"}}
        local = await step_times(cr.make(TERM, backend="bwrap"), args.steps // 3, bash, 10)
        remote = await step_times(cr.remote(url, TERM), args.steps // 3, bash, 10)
        summary("terminal (term-files, bwrap)", local, remote)
        for parallel in (1, 8):
            rate = await sessions_per_second(url, 200, parallel)
            print(f"sessions opened+reset+closed, {parallel} at once: {rate:8.1f} /s")
        print(f"terminal suite, oracle, concurrency {args.concurrency}:")
        rate_local = await suite_rate(lambda e: cr.make(e, backend="bwrap"), args.episodes,
                                      args.concurrency)
        remotes = {e: cr.remote(url, e, oracle=True) for e in SUITE}
        rate_remote = await suite_rate(lambda e: remotes[e](), args.episodes,
                                       args.concurrency)
        print(f"  episodes/s in-process {rate_local:.2f}   through 1 server {rate_remote:.2f}")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--episodes", type=int, default=4, help="tasks per suite env")
    parser.add_argument("--concurrency", type=int, default=4)
    asyncio.run(main(parser.parse_args()))
