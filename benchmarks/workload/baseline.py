"""The baseline: what a standard harness does, re-created after Harbor's local-Docker trial loop.

Per trajectory (a Harbor "trial"): create and start a fresh container from the task image
(`sleep infinity` as its command, as Harbor's compose file has it), copy the task files in,
run the agent loop (one `POST /v1/chat/completions` per turn with the whole conversation as
messages, replicas picked round-robin; one `docker exec` per command), run the check script
with `docker exec`, then stop and remove the container. A fixed number of trials run at once
(Corral's sandbox capacity) and the batch is handed over when all of them are done.

`teardown="harbor"` stops the container the way `docker compose down` does: SIGTERM, which
`sleep infinity` as pid 1 ignores, so the 10 s stop timeout runs out before SIGKILL (measured
in Harbor 0.26 here: 10.5 s per trial). `teardown="tuned"` gives the container SIGKILL as its
stop signal (Harbor's "STOPSIGNAL SIGKILL" tuning), so it stops at once.

Not re-created (each would make the baseline slower): Harbor's per-trial image rebuild, its
tmux-based agent I/O and its docker CLI subprocesses (the docker SDK used here is faster).
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import os
import socket
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

from .plans import WorkloadConfig, instruction, task_data
from .script import PLAN_MARKER

LABEL = "corral.bench"
# The base image carries `corral.managed=1`; an owner label marks these containers as alive
# so `corral sandbox gc` run by anyone else meanwhile does not reap them as orphans.
OWNER_LABEL = "corral.owner"
STOP_TIMEOUT = 10  # docker's (and compose's) default


@dataclass
class TrialResult:
    """One baseline trajectory: plan identity, reward and phase timings (wall clock)."""

    task: int
    sample: int = -1
    reward: float = 0.0
    turns: int = 0
    start: float = 0.0
    ready: float = 0.0        # verification done: the trajectory is usable
    end: float = 0.0          # container removed: the concurrency slot is free
    phases: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def _tar(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, content in files.items():
            data = content.encode()
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mtime = len(data), time.time()
            info.mode = 0o755 if path.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _format(exit_code: int, output: str) -> str:
    # The same observation text Corral's bash tool returns, so prompts grow alike.
    if output and not output.endswith("\n"):
        output += "\n"
    return f"{output}[exit code {exit_code}]"


class Baseline:
    """Runs trials with a fixed concurrency; `run(tasks)` returns when all are done."""

    def __init__(self, config: WorkloadConfig, urls: list[str], tools: list[dict[str, Any]], *,
                 concurrency: int, image: str = "corral/base:bookworm", teardown: str = "harbor",
                 cpus: float = 1.0, memory: str = "512m", run_label: str = "baseline",
                 on_done: Callable[[TrialResult], None] | None = None) -> None:
        import docker

        if teardown not in ("harbor", "tuned"):
            raise ValueError("teardown must be 'harbor' or 'tuned'")
        self.config, self.urls, self.tools = config, urls, tools
        self.concurrency, self.image, self.teardown = concurrency, image, teardown
        self.cpus, self.memory, self.run_label = cpus, memory, run_label
        self.on_done = on_done
        self._round_robin = itertools.cycle(range(len(urls)))
        # Blocking docker SDK calls get their own threads (and as many pooled connections): a
        # small default pool would throttle the baseline below what Harbor's
        # subprocess-per-call does.
        threads = 4 * concurrency + 8
        self._docker = docker.from_env(timeout=120, max_pool_size=threads)
        self._threads = ThreadPoolExecutor(max_workers=threads,
                                           thread_name_prefix="baseline-docker")

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, lambda: fn(*args, **kwargs))

    async def _exec(self, container: Any, argv: list[str]) -> tuple[int, str]:
        result = await self._call(container.exec_run, argv, demux=False)
        return result.exit_code, (result.output or b"").decode("utf-8", "replace")

    async def trial(self, client: httpx.AsyncClient, task: int) -> TrialResult:
        """One trajectory from container creation to removal."""
        res = TrialResult(task=task, start=time.time())
        mark = time.time()

        def lap(phase: str) -> None:
            nonlocal mark
            now = time.time()
            res.phases[phase] = res.phases.get(phase, 0.0) + now - mark
            mark = now

        kwargs: dict[str, Any] = dict(
            image=self.image, command=["sleep", "infinity"], detach=True,
            labels={LABEL: self.run_label,
                    OWNER_LABEL: f"{socket.gethostname()}:{os.getpid()}"}, network_mode="none",
            nano_cpus=int(self.cpus * 1e9), mem_limit=self.memory, working_dir="/root")
        if self.teardown == "tuned":
            kwargs["stop_signal"] = "SIGKILL"
        container = await self._call(self._docker.containers.run, **kwargs)
        try:
            lap("start")
            await self._call(container.put_archive, "/", _tar(task_data(self.config, task).files))
            lap("setup")
            messages: list[dict[str, Any]] = [{"role": "user", "content": instruction(task)}]
            while True:
                url = self.urls[next(self._round_robin)]
                answer = await client.post(f"{url}/v1/chat/completions", json={
                    "model": "bench", "messages": messages, "tools": self.tools})
                answer.raise_for_status()
                message = answer.json()["choices"][0]["message"]
                lap("inference")
                res.turns += 1
                if res.sample < 0:
                    found = PLAN_MARKER.search(message.get("content") or "")
                    res.sample = int(found.group(2)) if found else -1
                messages.append({k: v for k, v in message.items() if v is not None})
                calls = message.get("tool_calls") or []
                if not calls:
                    break
                for call in calls:
                    command = json.loads(call["function"]["arguments"])["command"]
                    code, output = await self._exec(container, ["bash", "-lc", command])
                    messages.append({"role": "tool", "tool_call_id": call["id"],
                                     "name": call["function"]["name"],
                                     "content": _format(code, output)})
                lap("commands")
            code, _ = await self._exec(container, ["bash", "/work/check.sh"])
            res.reward = float(code == 0)
            lap("verify")
            res.ready = time.time()
        except Exception as exc:  # recorded; the batch still needs every trial to end
            res.error = f"{type(exc).__name__}: {exc}"
            res.ready = time.time()
        finally:
            try:
                await self._call(container.stop, timeout=STOP_TIMEOUT)
                await self._call(container.remove, force=True)
            except Exception as exc:  # removed behind our back: recorded, the batch goes on
                res.error = res.error or f"teardown: {type(exc).__name__}: {exc}"
            lap("teardown")
            res.end = time.time()
        if self.on_done is not None:
            self.on_done(res)
        return res

    async def run(self, tasks: list[int]) -> list[TrialResult]:
        """Run one trial per entry of `tasks` (a task index; repeats make a GRPO group)."""
        slots = asyncio.Semaphore(self.concurrency)
        limits = httpx.Limits(max_connections=4 * self.concurrency)

        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
            async def guarded(task: int) -> TrialResult:
                async with slots:
                    return await self.trial(client, task)

            try:
                return list(await asyncio.gather(*(guarded(t) for t in tasks)))
            finally:
                self._threads.shutdown(wait=False)
