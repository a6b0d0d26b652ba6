"""External agents: the recording proxy's overhead per request, and time to a batch with
mini-swe-agent vs Corral's native episode loop.

    python benchmarks/agents.py [--requests 200] [--turns 8] [--trajectories 64] [--skip-batch]

1. Proxy overhead: an agent process (this script with --client, http.client over loopback,
   keep-alive)
   plays multi-turn chat conversations (a bash tool, each request extending the last) against
   the proxy; the engine is a `ScriptedPolicy` with the tiny model's tokenizer (its real chat
   template, no model compute), so what is measured is the proxy: HTTP, JSON, validation,
   rendering the new messages, recording. Overhead = the latency the agent saw minus the
   engine's own time (the episode's decode span), per request: median and p90; beside it the
   HTTP floor, a `GET .../v1/models` on the same connection (the same server, no work), and
   the proxy process's CPU time per turn (a chat request and a floor `GET`, the engine's
   time taken out), which a loaded machine disturbs less than the latencies, and of that the
   recording path's own CPU per request (`EpisodeRecord`, no HTTP).
2. Time to a batch: `--trajectories` trajectories (groups of 8) of `corral/term-files-v0`
   (bwrap sandboxes) with the tiny model (`LocalPolicy`), played by mini-swe-agent through the
   proxy and by the native loop, same tasks (seed), same limits, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time

BASH = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}]
ANSWER = '<tool_call>{"name": "bash", "arguments": {"command": "ls -S /var/log | head"}}' \
    '</tool_call>'


def opening() -> list[dict]:
    """A conversation's first messages."""
    return [{"role": "system", "content": "You are a careful shell agent."},
            {"role": "user", "content": "Find the biggest file in /var/log."}]


def tool_output(turn: int) -> dict:
    """The tool result the agent sends after turn `turn`'s reply."""
    return {"role": "tool", "tool_call_id": "c", "content": f"output {turn}\n" * 20}


async def proxy_overhead(requests: int, turns: int) -> dict[str, float]:
    from corral.runner.agents import AgentProxy, AgentSession, EpisodeRecord
    from corral.runner.episode import EpisodeLimits
    from corral.runner.policy import ScriptedPolicy, load_tokenizer
    from corral.runner.trajectory import Trajectory

    tokenizer = load_tokenizer("tiny")
    engine = ScriptedPolicy([ANSWER], tokenizer=tokenizer)
    conversations = max(1, requests // turns)
    async with AgentProxy() as proxy:
        sessions = [proxy.open(AgentSession(f"c{c}", EpisodeRecord(tokenizer), engine,
                                            EpisodeLimits(max_tokens=64), asyncio.Semaphore(8),
                                            traj=Trajectory(f"c{c}", "e", "t", "g")))
                    for c in range(conversations)]
        urls = {c: s.base_url for c, s in enumerate(sessions)}
        cpu = time.process_time()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--client", json.dumps(urls), "--conversations",
            str(conversations), "--turns", str(turns), stdout=subprocess.PIPE)
        out, _ = await proc.communicate()
        cpu = time.process_time() - cpu
    rows = [json.loads(line) for line in out.decode().splitlines()]
    seen = [row for row in rows if "conversation" in row]
    floor = statistics.median(row["floor"] for row in rows if "floor" in row)
    overheads, engine_s = [], []
    for c, session in enumerate(sessions):
        decodes = [s.seconds for s in session.traj.spans if s.phase == "decode"]
        mine = [row["seconds"] for row in seen if row["conversation"] == c]
        for agent_seconds, decode in zip(mine, decodes):
            overheads.append(agent_seconds - decode)
            engine_s.append(decode)
    overheads.sort()
    return {"requests": len(overheads), "overhead_median_ms": 1e3 * statistics.median(overheads),
            "overhead_p90_ms": 1e3 * overheads[int(0.9 * (len(overheads) - 1))],
            "engine_median_ms": 1e3 * statistics.median(engine_s),
            "proxy_cpu_per_turn_ms": 1e3 * (cpu - sum(engine_s)) / len(overheads),
            "http_floor_median_ms": 1e3 * floor,
            "record_cpu_per_request_ms": record_cpu(conversations, turns)}


def record_cpu(conversations: int, turns: int) -> float:
    """CPU ms per request of the recording path alone (`EpisodeRecord.chat_prompt` and
    `commit`, no HTTP), on the same conversations as the overhead figure."""
    from corral.runner.agents import EpisodeRecord
    from corral.runner.policy import load_tokenizer
    from corral.runner.policy.base import Generation

    tokenizer = load_tokenizer("tiny")
    ids = tokenizer.encode(ANSWER, add_special_tokens=False) + [tokenizer.eos_token_id]
    gen = Generation(token_ids=ids, logprobs=[-0.5] * len(ids), text=ANSWER,
                     finish_reason="stop", version=0)
    started = None
    for c in range(conversations + 1):  # the first warms the template caches, untimed
        if c == 1:
            started = time.process_time()
        record, messages = EpisodeRecord(tokenizer), opening()
        for turn in range(turns):
            reply = record.commit(record.chat_prompt(json.loads(json.dumps(messages)), BASH),
                                  gen, chat=True)
            messages += [reply, tool_output(turn)]
        assert len(record.segments) == 1
    assert started is not None
    return 1e3 * (time.process_time() - started) / (conversations * turns)


async def time_to_batch(trajectories: int) -> dict[str, float]:
    from corral.runner import EpisodeLimits, LocalPolicy, Runner
    from corral.runner.agents import ExternalAgent

    env = "corral/term-files-v0"
    limits = EpisodeLimits(max_tokens=32, max_turns=3, episode_deadline=120)
    results: dict[str, float] = {}
    async with LocalPolicy("tiny", max_batch=64, threads=1) as policy:
        for name, agent in (("native", None),
                            ("mini-swe-agent", ExternalAgent.named("mini-swe-agent",
                                                                   step_limit=3))):
            started = time.perf_counter()
            async with Runner([env], policy, agent=agent, limits=limits, sandbox_capacity=8,
                              inference_concurrency=64, sandbox_backend="bwrap",
                              seed=11) as runner:
                trajs = await runner.collect(trajectories, group=8)
            results[f"{name}_s"] = time.perf_counter() - started
            results[f"{name}_tokens"] = sum(t.generated_tokens for t in trajs)
            results[f"{name}_calls"] = sum(t.turns for t in trajs)
            results[f"{name}_trainable"] = sum(t.trainable for t in trajs)
    results["ratio_agent_over_native"] = results["mini-swe-agent_s"] / results["native_s"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--skip-batch", action="store_true")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--conversations", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        urls = json.loads(args.client)
        return client_many(urls, args.turns)
    figures = asyncio.run(proxy_overhead(args.requests, args.turns))
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                   for k, v in figures.items()), flush=True)
    if not args.skip_batch:
        batch = asyncio.run(time_to_batch(args.trajectories))
        print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in batch.items()), flush=True)


def client_many(urls: dict[str, str], turns: int) -> None:
    """The agent side, one conversation per episode URL: print each request's latency as a
    JSON line. A keep-alive `http.client` connection (a lean client: what is timed is the
    proxy, not a client library's own overhead)."""
    import http.client
    from urllib.parse import urlsplit

    for c, url in sorted(urls.items(), key=lambda kv: int(kv[0])):
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        messages = opening()
        for turn in range(turns):
            body = json.dumps({"model": "m", "messages": messages, "tools": BASH})
            started = time.perf_counter()
            conn.request("POST", parts.path + "/chat/completions", body,
                         {"Content-Type": "application/json"})
            reply = conn.getresponse()
            data = reply.read()
            seconds = time.perf_counter() - started
            if reply.status != 200:
                raise SystemExit(f"the proxy answered {reply.status}: {data[:200]!r}")
            message = json.loads(data)["choices"][0]["message"]
            messages += [message, tool_output(turn)]
            print(json.dumps({"conversation": int(c), "seconds": seconds}), flush=True)
        for _ in range(turns):  # the floor: the same HTTP stack and episode lookup, no work
            started = time.perf_counter()
            conn.request("GET", parts.path + "/models")
            conn.getresponse().read()
            print(json.dumps({"floor": time.perf_counter() - started}), flush=True)
        conn.close()


if __name__ == "__main__":
    main()
