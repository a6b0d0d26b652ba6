"""A latency-modelled, OpenAI-compatible inference server: N replicas, scripted answers.

No model runs here. Each replica answers `/v1/completions` (token-id prompts; returns token ids,
logprobs and text, as vLLM/`corral serve-policy` do) and `/v1/chat/completions` (messages and
tools, rendered with the same chat template) with the *scripted* turn of the trajectory's plan
(`script.py`), and takes as long as the cost model says a real engine would:

- queueing: at most `max_seqs` sequences decode at once per replica; the rest wait (FIFO);
- prefill: `prefill_ms` per prompt token NOT found in the replica's prefix cache. The cache is
  per replica, LRU over 16-token blocks (hash-chained, as vLLM's automatic prefix caching), up
  to `cache_tokens`; a prompt hits the longest cached prefix of whole blocks. After a request
  its prompt and output are cached. So routing a trajectory's turns to one replica matters;
- decode: `decode_ms` per output token at concurrency 1, times `(1 + alpha * (c - 1))` where c
  is the number of sequences decoding on the replica, re-evaluated every 8 tokens. The replica
  sleeps to an absolute schedule, so timer overshoot on a busy host does not add up.

Which plan a request belongs to: the task index comes from the `[bench-task N]` marker in the
instruction; the sample index k is the order in which that task's trajectories first reached
any replica (0, 1, 2, ...); later turns are matched by the session id (`X-Session-Id` header, or
the body's `user` field), falling back to the `plan T.k` marker the server wrote into its own
earlier answers. The turn index is the number of assistant turns already in the prompt. The
plans are a pure function of the workload seed (`plans.py`), so every harness runs the same
scripts. All replicas run in this one process (one uvicorn server per port) so they share the
session table; each has its own cache, queue and load.

Run: `python -m workload.inference --ports 8101,8102,8103,8104 --workload-json '{...}'` (from
`benchmarks/`); prints `READY url,url,...` when every replica accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import sys
import time
from collections import OrderedDict, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .plans import Plan, WorkloadConfig, plan
from .script import PLAN_MARKER, TASK_MARKER, Scripter

BLOCK = 16
SESSION_HEADER = "x-session-id"
MODEL = "bench-scripted"


@dataclass(frozen=True)
class CostModel:
    """Inference cost parameters (the defaults are the published benchmark's)."""

    decode_ms: float = 3.0
    alpha: float = 0.02
    max_seqs: int = 64
    prefill_ms: float = 0.02
    cache_tokens: int = 131072

    def decode_capacity(self) -> float:
        """Base-speed decode seconds one replica completes per second at full load."""
        return self.max_seqs / (1.0 + self.alpha * (self.max_seqs - 1))


@dataclass
class ReplicaStats:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    max_active: int = 0


class Replica:
    """One modelled engine: a prefix cache, decode slots and a load-dependent token time."""

    def __init__(self, name: str, cost: CostModel) -> None:
        self.name, self.cost = name, cost
        self.reset()

    def reset(self) -> None:
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.slots = asyncio.Semaphore(self.cost.max_seqs)
        self.active = 0
        self.stats = ReplicaStats()

    @staticmethod
    def _blocks(ids: list[int]) -> list[int]:
        hashes, h = [], 0
        for i in range(0, len(ids) - BLOCK + 1, BLOCK):
            h = hash((h, tuple(ids[i:i + BLOCK])))
            hashes.append(h)
        return hashes

    def _cached(self, blocks: list[int]) -> int:
        hit = 0
        for h in blocks:
            if h not in self.cache:
                break
            self.cache.move_to_end(h)
            hit += 1
        return hit * BLOCK

    def _insert(self, blocks: list[int]) -> None:
        for h in blocks:
            self.cache[h] = None
            self.cache.move_to_end(h)
        while len(self.cache) * BLOCK > self.cost.cache_tokens:
            self.cache.popitem(last=False)

    async def run(self, prompt: list[int], output: list[int]) -> dict[str, float]:
        """Spend the modelled time of one request; returns its phase timings."""
        t0 = time.perf_counter()
        async with self.slots:
            t1 = time.perf_counter()
            self.active += 1
            self.stats.max_active = max(self.stats.max_active, self.active)
            try:
                blocks = self._blocks(prompt)
                cached = self._cached(blocks)
                prefill = (len(prompt) - cached) * self.cost.prefill_ms / 1000.0
                # one absolute schedule for prefill and decode: the event loop's timer
                # overshoot (1-20 ms per sleep on a busy host, more under load) is not
                # engine time and must not add up across a request's sleeps
                due = t1 + prefill
                if prefill > 0:
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                t2 = time.perf_counter()
                remaining = len(output)
                while remaining > 0:
                    step = min(8, remaining)
                    load = 1.0 + self.cost.alpha * (self.active - 1)
                    due += step * self.cost.decode_ms / 1000.0 * load
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                    remaining -= step
                t3 = time.perf_counter()
                self._insert(self._blocks(prompt + output))
            finally:
                self.active -= 1
        s = self.stats
        s.requests += 1
        s.prompt_tokens += len(prompt)
        s.cached_tokens += cached
        s.output_tokens += len(output)
        s.queue_s += t1 - t0
        s.prefill_s += t2 - t1
        s.decode_s += t3 - t2
        return {"queue_s": t1 - t0, "prefill_s": t2 - t1, "decode_s": t3 - t2,
                "cached_tokens": cached}


@dataclass
class Sessions:
    """Which plan each trajectory follows (shared by all replicas of the process)."""

    config: WorkloadConfig
    by_session: dict[str, Plan] = field(default_factory=dict)
    next_sample: defaultdict[int, int] = field(default_factory=lambda: defaultdict(int))

    def reset(self) -> None:
        self.by_session.clear()
        self.next_sample.clear()

    def resolve(self, session: str | None, turn: int, text: str) -> Plan:
        """The plan of a request: known session, new trajectory, or the marker fallback."""
        if session is not None and session in self.by_session and turn > 0:
            return self.by_session[session]
        if turn > 0:
            found = PLAN_MARKER.findall(text)
            if found:
                task, sample = map(int, found[-1])
                chosen = plan(self.config, task, sample)
                if session is not None:
                    self.by_session[session] = chosen
                return chosen
        task_match = TASK_MARKER.search(text)
        if task_match is None:
            raise ValueError("the prompt names no task: the instruction must contain "
                             "'[bench-task N]' (use the benchmark's environment)")
        task = int(task_match.group(1))
        sample = self.next_sample[task]
        self.next_sample[task] += 1
        chosen = plan(self.config, task, sample)
        if session is not None:
            self.by_session[session] = chosen
        return chosen


class ModelledServer:
    """All replicas plus the shared tokenizer, scripter and session table."""

    def __init__(self, tokenizer: Any, config: WorkloadConfig, cost: CostModel,
                 names: list[str]) -> None:
        self.tokenizer, self.config, self.cost = tokenizer, config, cost
        self.scripter = Scripter(tokenizer)
        self.sessions = Sessions(config)
        self.replicas = [Replica(n, cost) for n in names]
        start = tokenizer.convert_tokens_to_ids("<|im_start|>")
        role = tokenizer.encode("assistant", add_special_tokens=False)
        self._assistant = [start, *role]

    def count_assistant_turns(self, ids: list[int]) -> int:
        """Assistant headers in the prompt, minus the trailing generation prompt."""
        pattern, n, count = self._assistant, len(self._assistant), 0
        first = pattern[0]
        for i, tok in enumerate(ids):
            if tok == first and ids[i:i + n] == pattern:
                count += 1
        return max(0, count - 1)

    def logprobs(self, chosen: Plan, turn: int, n: int) -> list[float]:
        rng = random.Random(hash((self.config.seed, chosen.task, chosen.sample, turn)))
        return [-rng.uniform(0.001, 1.5) for _ in range(n)]

    def app(self, replica: Replica) -> FastAPI:
        app = FastAPI(title=f"modelled replica {replica.name}")

        @app.exception_handler(ValueError)
        async def bad_request(_: Request, exc: ValueError) -> JSONResponse:
            return JSONResponse({"error": {"message": str(exc)}}, status_code=400)

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return {"status": "ok", "replica": replica.name}

        @app.get("/version")
        async def version() -> dict[str, Any]:
            return {"version": 0}

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}

        @app.get("/stats")
        async def stats() -> dict[str, Any]:
            return {"replica": replica.name, **asdict(replica.stats),
                    "cache_blocks": len(replica.cache)}

        @app.post("/reset")
        async def reset() -> dict[str, Any]:
            # Every harness starts from empty caches and sample counters.
            for r in self.replicas:
                r.reset()
            self.sessions.reset()
            return {"ok": True}

        @app.post("/v1/completions")
        async def completions(request: Request) -> dict[str, Any]:
            body = await request.json()
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
                prompt = prompt[0]
            if isinstance(prompt, str):
                prompt = self.tokenizer.encode(prompt, add_special_tokens=False)
            if not prompt:
                raise ValueError("prompt is empty; send token ids")
            turn = self.count_assistant_turns(prompt)
            session = request.headers.get(SESSION_HEADER) or body.get("user")
            text = "" if (session in self.sessions.by_session and turn > 0) else \
                self.tokenizer.decode(prompt, skip_special_tokens=False)
            chosen = self.sessions.resolve(session, turn, text)
            out_text, out_ids, _ = self.scripter.turn(chosen, turn)
            timing = await replica.run(prompt, out_ids)
            return {"id": f"cmpl-{replica.name}-{replica.stats.requests}",
                    "object": "text_completion",
                    "model": MODEL, "policy_version": 0,
                    "choices": [{"index": 0, "text": out_text, "token_ids": out_ids,
                                 "logprobs": {"token_logprobs":
                                              self.logprobs(chosen, turn, len(out_ids))},
                                 "finish_reason": "stop", "policy_version": 0}],
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(out_ids)},
                    "timing": timing}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> dict[str, Any]:
            body = await request.json()
            messages = body.get("messages") or []
            text = self.tokenizer.apply_chat_template(messages, tools=body.get("tools"),
                                                      add_generation_prompt=True, tokenize=False)
            prompt = self.tokenizer.encode(text, add_special_tokens=False)
            turn = sum(1 for m in messages if m.get("role") == "assistant")
            session = request.headers.get(SESSION_HEADER) or body.get("user")
            chosen = self.sessions.resolve(session, turn, text)
            out_text, out_ids, call = self.scripter.turn(chosen, turn)
            timing = await replica.run(prompt, out_ids)
            message: dict[str, Any] = {"role": "assistant", "content": out_text}
            if call is not None:
                message["content"] = out_text.split("\n<tool_call>")[0]
                message["tool_calls"] = [{
                    "id": f"call_{chosen.task}_{chosen.sample}_{turn}", "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]
            return {"id": f"chat-{replica.name}-{replica.stats.requests}",
                    "object": "chat.completion", "model": MODEL,
                    "choices": [{"index": 0, "message": message,
                                 "finish_reason": "tool_calls" if call else "stop"}],
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(out_ids)},
                    "timing": timing}

        return app


async def serve(server: ModelledServer, ports: list[int], host: str = "127.0.0.1") -> None:
    """Run one uvicorn server per replica on this loop until cancelled."""
    servers = []
    for replica, port in zip(server.replicas, ports):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        config = uvicorn.Config(server.app(replica), log_level="warning", access_log=False,
                                backlog=4096, timeout_keep_alive=120)
        servers.append((uvicorn.Server(config), sock))
    tasks = [asyncio.create_task(s.serve(sockets=[sock])) for s, sock in servers]
    while not all(s.started for s, _ in servers):
        if any(t.done() for t in tasks):
            for t in tasks:
                t.result()
        await asyncio.sleep(0.01)
    urls = ",".join(f"http://{host}:{sock.getsockname()[1]}" for _, sock in servers)
    print(f"READY {urls}", flush=True)
    await asyncio.gather(*tasks)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ports", default="0,0,0,0", help="comma-separated; 0 picks a free port")
    parser.add_argument("--tokenizer", default="tiny", help="model directory or 'tiny'")
    parser.add_argument("--workload-json", default="{}", help="WorkloadConfig fields as JSON")
    for f in CostModel.__dataclass_fields__.values():
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default),
                            default=f.default)
    args = parser.parse_args(argv)
    from corral.runner.policy.models import load_tokenizer

    cost = CostModel(**{name: getattr(args, name) for name in CostModel.__dataclass_fields__})
    config = WorkloadConfig(**json.loads(args.workload_json))
    ports = [int(p) for p in args.ports.split(",")]
    server = ModelledServer(load_tokenizer(args.tokenizer), config, cost,
                            [f"r{i}" for i in range(len(ports))])
    try:
        asyncio.run(serve(server, ports))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
