"""Time to a trainable batch: Corral's runner vs a Harbor-style harness, side by side.

    .venv/bin/python benchmarks/time_to_batch.py            # the published benchmark (~8 min)
    .venv/bin/python benchmarks/time_to_batch.py --quick    # 16 tasks x 4, capacity 16
    .venv/bin/python benchmarks/time_to_batch.py --quick --backend bwrap   # Corral on bwrap
    .venv/bin/python benchmarks/time_to_batch.py --quick --hosts URL,URL,...   # a Docker fleet

One invocation runs, on the same host, image, caps and modelled inference replicas:

1. Corral, cold: a fresh `Runner` collects one batch (`collect(tasks*group, group=group)`),
   all trajectories complete; the clock starts before the runner (and its sandbox pool) starts;
2. the baseline (`workload/baseline.py`) on the same tasks: fresh container per trajectory,
   `docker exec` per command, round-robin routing, concurrency = Corral's sandbox capacity,
   the batch handed over when every trajectory is done;
3. Corral, steady state: a fresh `Runner` yields `1 + --steady-batches` batches from
   `batches(size, group)`; time per batch = mean interval between consecutive batches after
   the first (work carried over from one batch to the next counts where it finishes).

Corral holds `--spares` warm sandboxes beyond its capacity (the runner's `warm_spares`), so a
container's start is not inside an episode's slot; the peak held is printed
(`corral_*_peak_sandboxes`). `--backend bwrap` runs Corral's side on bubblewrap over the same
image; the baseline is Docker either way. `--hosts` places Corral's containers on a fleet of
Docker daemons (`CORRAL_DOCKER_HOSTS` syntax; `python -m faultkit.fleetd start 2` starts two
extra ones on this machine) and prints what each host created; the baseline stays on the local
daemon.

The baseline has no carry-over, so its time per batch in steady state is its cold batch time.
Every trajectory's script comes from the seeded workload (`workload/plans.py`) through the
latency-modelled inference server (`workload/inference.py`); the lower bound comes from the
plans (`workload/bounds.py`). See docs/time_to_batch.md for the workload, the model and the
fairness rules.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run as a script: `benchmarks` is then a package too

import httpx  # noqa: E402

from benchmarks.workload.baseline import Baseline, TrialResult  # noqa: E402
from benchmarks.workload.bounds import Bound, lower_bound, sandbox_floor  # noqa: E402
from benchmarks.workload.env import ENV_ID, define_env  # noqa: E402
from benchmarks.workload.inference import CostModel  # noqa: E402
from benchmarks.workload.plans import Plan, WorkloadConfig, plan  # noqa: E402
from benchmarks.workload.script import PLAN_MARKER, Scripter  # noqa: E402
from benchmarks.window_noise import Caps, Replay  # noqa: E402

log = logging.getLogger("time_to_batch")


# --- command line ---------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Corral vs a Harbor-style harness: time to a "
                                     "trainable batch on a seeded Terminal-Bench-style workload.")
    work = parser.add_argument_group("workload (defaults are the published benchmark's)")
    for f in fields(WorkloadConfig):
        work.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    cost = parser.add_argument_group("modelled inference")
    for f in fields(CostModel):
        cost.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    cost.add_argument("--replicas", type=int, default=4)
    run = parser.add_argument_group("harnesses")
    run.add_argument("--capacity", type=int, default=32,
                     help="sandbox capacity (Corral) = trial concurrency (baseline)")
    run.add_argument("--inference-concurrency", type=int, default=128)
    run.add_argument("--steady-batches", type=int, default=None,
                     help="measured steady-state batches (one more is run first; default 4)")
    run.add_argument("--baseline", choices=["harbor", "tuned", "both", "none"], default="harbor",
                     help="baseline teardown: Harbor's default (10 s stop wait), tuned (SIGKILL)")
    run.add_argument("--filter-zero-variance", action="store_true",
                     help="let Corral drop equal-reward groups (the baseline cannot)")
    run.add_argument("--skip-steady", action="store_true")
    run.add_argument("--executor-threads", type=int, default=0,
                     help="diagnostic: size of asyncio's default thread pool, which Corral's "
                     "Docker backend uses for blocking SDK calls (0: Python's default, "
                     "min(32, cores + 4))")
    run.add_argument("--backend", choices=["docker", "bwrap"], default="docker",
                     help="Corral's sandbox backend over the same image: docker (like for like "
                     "with the baseline) or bwrap (Corral's daemonless sandbox); the baseline "
                     "always runs Docker")
    run.add_argument("--hosts", default=None,
                     help="Corral's sandboxes on this fleet of Docker hosts: comma-separated "
                     "URL[?capacity=N&rate=R&burst=B] (as CORRAL_DOCKER_HOSTS); docker only")
    run.add_argument("--spares", type=int, default=None,
                     help="warm spare sandboxes held beyond --capacity (Runner(warm_spares=)); "
                     "default: the runner's default (capacity // 2 on docker, capacity // 4 "
                     "on bwrap); 0 turns them off")
    run.add_argument("--quick", action="store_true",
                     help="smaller run: 16 tasks x 4, capacity 16 (4 steady batches unless "
                     "--steady-batches says otherwise)")
    run.add_argument("--json", type=Path, help="also write every figure to this file")
    run.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.hosts and args.backend != "docker":
        parser.error("--hosts places Docker containers: it needs --backend docker")
    if args.quick:
        args.tasks, args.capacity = 16, 16
    if args.steady_batches is None:
        args.steady_batches = 4
    if args.steady_batches < 1:
        parser.error("--steady-batches must be at least 1")
    return args


def workload_of(args: argparse.Namespace) -> WorkloadConfig:
    return WorkloadConfig(**{f.name: getattr(args, f.name) for f in fields(WorkloadConfig)})


def cost_of(args: argparse.Namespace) -> CostModel:
    return CostModel(**{f.name: getattr(args, f.name) for f in fields(CostModel)})


# --- the modelled inference server ----------------------------------------------------------
@contextlib.contextmanager
def inference_server(config: WorkloadConfig, cost: CostModel, replicas: int) -> Iterator[list[str]]:
    """Start the replicas in a child process; yields their base URLs."""
    argv = [sys.executable, "-m", "workload.inference", "--ports", ",".join(["0"] * replicas),
            "--workload-json", json.dumps(config.as_dict())]
    for f in fields(CostModel):
        argv += [f"--{f.name.replace('_', '-')}", str(getattr(cost, f.name))]
    proc = subprocess.Popen(argv, cwd=HERE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until READY (or the child dies: empty line)
        if not line.startswith("READY "):
            raise RuntimeError(f"the inference server did not start (exit {proc.poll()}): {line!r}")
        yield line.split()[1].split(",")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


async def server_stats(urls: list[str], reset: bool = False) -> dict[str, Any]:
    """Summed replica counters (prefix-cache hit rate, queueing); optionally reset them."""
    async with httpx.AsyncClient(timeout=30) as client:
        stats = [(await client.get(f"{u}/stats")).json() for u in urls]
        if reset:
            await client.post(f"{urls[0]}/reset")
    total = {k: sum(s[k] for s in stats) for k in ("requests", "prompt_tokens", "cached_tokens",
                                                   "output_tokens", "queue_s", "prefill_s",
                                                   "decode_s")}
    total["cache_hit_rate"] = total["cached_tokens"] / max(1, total["prompt_tokens"])
    total["requests_per_replica"] = [s["requests"] for s in stats]
    return total


# --- plans of finished work -----------------------------------------------------------------
def plan_of_messages(config: WorkloadConfig, messages: list[dict[str, Any]]) -> Plan | None:
    """The plan a trajectory followed, from the marker in its first assistant message."""
    for message in messages:
        if message.get("role") == "assistant":
            found = PLAN_MARKER.search(message.get("content") or "")
            if found:
                return plan(config, int(found.group(1)), int(found.group(2)))
    return None


class Bounds:
    """Lower bounds of sets of plans with this run's caps."""

    def __init__(self, scripter: Scripter, cost: CostModel, capacity: int, replicas: int) -> None:
        self.scripter, self.cost, self.capacity, self.replicas = scripter, cost, capacity, replicas

    def turn_tokens(self, p: Plan) -> list[int]:
        """The tokens the modelled server returns at each turn of `p`."""
        return [len(self.scripter.turn(p, i)[1]) for i in range(p.turns)]

    def sandbox_floor(self, p: Plan) -> float:
        """The least time `p` holds a sandbox: its critical path without the first turn."""
        return sandbox_floor(p, self.cost, self.turn_tokens(p))

    def of(self, plans: list[Plan]) -> Bound:
        return lower_bound(plans, self.cost, capacity=self.capacity, replicas=self.replicas,
                           turn_tokens=self.turn_tokens)


def ideal_ratio(args: argparse.Namespace, config: WorkloadConfig, cost: CostModel,
                bounds: Bounds) -> float:
    """`ratio_to_lower_bound` of this run's window for a zero-overhead runner (window_noise)."""
    from corral.runner import AssemblyConfig
    from corral.runner.runner import deck_depth, default_spares

    spares = default_spares(args.capacity, slow_starts=args.backend == "docker") \
        if args.spares is None else args.spares
    caps = Caps(capacity=args.capacity, spares=spares, groups_per_batch=config.tasks,
                group=config.group, overprovision=AssemblyConfig().overprovision,
                on_deck=deck_depth(args.capacity, spares))
    return Replay(config, caps, bounds.scripter, cost).ratio(args.steady_batches)


# --- Corral -----------------------------------------------------------------------------------
def make_policy(urls: list[str], tokenizer: Any) -> Any:
    from corral.runner.policy import OpenAIPolicy, Router

    return OpenAIPolicy(urls, tokenizer, router=Router(urls), model="bench-scripted",
                        timeout=600.0)


def phase_means(trajectories: list[Any]) -> dict[str, float]:
    totals: dict[str, list[float]] = {}
    for traj in trajectories:
        for phase, seconds in traj.phase_seconds().items():
            totals.setdefault(phase, []).append(seconds)
    return {k: round(statistics.fmean(v), 3) for k, v in sorted(totals.items())}


def sandbox_hold(traj: Any) -> float:
    """Seconds from the sandbox in hand (the last "sandbox_wait" span's end: the pool handing
    it over, after the slot was granted) to the trajectory's last phase's end. A wait for the
    pool inside the slot is not in it: `pool_wait` is."""
    admitted = max((s.end for s in traj.spans if s.phase == "sandbox_wait"), default=None)
    start = admitted if admitted is not None else min(s.start for s in traj.spans)
    return max(s.end for s in traj.spans) - start


def pool_wait(traj: Any) -> float:
    """Seconds a trajectory waited for its sandbox with its slot granted: its last
    "sandbox_wait" span, the pool's (waits on deck and for a slot come before it)."""
    waits = [s for s in traj.spans if s.phase == "sandbox_wait"]
    return waits[-1].end - waits[-1].start if waits else 0.0


def request_ms(server: dict[str, Any], cost: CostModel,
               client_seconds: float | None = None) -> dict[str, float]:
    """Per model request: the modelled server's queue, prefill and decode time, the decode at
    base speed (what the bound counts), the prompt tokens not in the prefix cache and, given
    the harness's own total wait for answers, the rest (HTTP, event loops, scheduling)."""
    n = max(1, server["requests"])
    out = {k: round(1000 * server[f"{k}_s"] / n, 1) for k in ("queue", "prefill", "decode")}
    out["base_decode"] = round(server["output_tokens"] * cost.decode_ms / n, 1)
    out["uncached_tokens"] = round((server["prompt_tokens"] - server["cached_tokens"]) / n)
    if client_seconds is not None:
        out["overhead"] = round(1000 * client_seconds / n - out["queue"] - out["prefill"]
                                - out["decode"], 1)
    return out


def runner_kwargs(args: argparse.Namespace, config: WorkloadConfig) -> dict[str, Any]:
    from corral.runner import AssemblyConfig, EpisodeLimits

    return dict(sandbox_capacity=args.capacity, inference_concurrency=args.inference_concurrency,
                seed=config.seed, limits=EpisodeLimits(max_tokens=4096),
                assembly=AssemblyConfig(filter_zero_variance=args.filter_zero_variance),
                sandbox_backend=sandbox_backend(args), warm_spares=args.spares,
                run_id="bench-corral")


def sandbox_backend(args: argparse.Namespace) -> Any:
    """Corral's sandbox backend: a name, or the Docker fleet of `--hosts`."""
    from corral.sandbox.docker import DockerConfig

    return DockerConfig(hosts=args.hosts) if args.hosts else args.backend


def fleet_figures(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per host of `--hosts`: containers this process created there, images copied to it."""
    from corral.sandbox.fleet import DockerFleet

    fleet = DockerFleet.from_configs(sandbox_backend(args).hosts)  # the process's shared hosts
    return [{k: h[k] for k in ("url", "capacity", "created", "loads", "state")}
            for h in fleet.snapshot()]


async def corral_cold(args: argparse.Namespace, config: WorkloadConfig, urls: list[str],
                      tokenizer: Any) -> dict[str, Any]:
    from corral.runner.runner import Runner

    n = config.tasks * config.group
    policy = make_policy(urls, tokenizer)
    started = time.perf_counter()
    async with Runner(envs=[ENV_ID], policy=policy, **runner_kwargs(args, config)) as runner:
        trajectories = await runner.collect(n, group=config.group)
        elapsed = time.perf_counter() - started
        stats = runner.stats()
    await policy.close()
    return {"seconds": elapsed, "trajectories": trajectories, "stats": stats,
            "router": policy.router.stats.as_dict()}


async def corral_steady(args: argparse.Namespace, config: WorkloadConfig, urls: list[str],
                        tokenizer: Any) -> dict[str, Any]:
    from corral.runner.runner import Runner

    size = config.tasks * config.group
    policy = make_policy(urls, tokenizer)
    stamps, batches = [], []
    started = time.perf_counter()
    async with Runner(envs=[ENV_ID], policy=policy, **runner_kwargs(args, config)) as runner:
        async for batch in runner.batches(size=size, group=config.group,
                                          max_batches=1 + args.steady_batches):
            stamps.append(time.perf_counter() - started)
            batches.append(batch)
            print(f"  corral steady: batch {len(batches)} at {stamps[-1]:.1f} s "
                  f"({len(batch)} trajectories, {runner.inflight} in flight)", file=sys.stderr)
        stats = runner.stats()
        inflight = runner.inflight
    await policy.close()
    return {"stamps": stamps, "batches": batches, "stats": stats, "inflight_at_end": inflight,
            "router": policy.router.stats.as_dict()}


# --- baseline -------------------------------------------------------------------------------
async def baseline(args: argparse.Namespace, config: WorkloadConfig, urls: list[str],
                   tools: list[dict[str, Any]], tasks: list[int], teardown: str) -> dict[str, Any]:
    done = []

    def progress(res: TrialResult) -> None:
        done.append(res)
        if len(done) % max(1, len(tasks) // 8) == 0:
            print(f"  baseline ({teardown}): {len(done)}/{len(tasks)} done", file=sys.stderr)

    harness = Baseline(config, urls, tools, concurrency=args.capacity, teardown=teardown,
                       run_label=f"bench-baseline-{os.getpid()}", on_done=progress)
    started = time.time()
    results = await harness.run(tasks)
    ready = max(r.ready for r in results) - started
    return {"seconds": ready, "all_removed": max(r.end for r in results) - started,
            "results": results}


# --- reporting --------------------------------------------------------------------------------
def emit(figures: dict[str, Any], key: str, value: Any) -> None:
    figures[key] = value
    shown = f"{value:.3f}" if isinstance(value, float) else value
    print(f"{key}={shown}", flush=True)


def zero_variance_groups(rewards_by_group: dict[Any, list[float]]) -> int:
    return sum(1 for r in rewards_by_group.values() if len(set(r)) == 1)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from corral.runner.policy.models import load_tokenizer
    from corral.sandbox.baseimage import ensure_base_image

    config, cost = workload_of(args), cost_of(args)
    if args.executor_threads:
        from concurrent.futures import ThreadPoolExecutor

        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=args.executor_threads))
    figures: dict[str, Any] = {"workload": config.as_dict(), "cost_model": cost.__dict__,
                               "capacity": args.capacity, "replicas": args.replicas}
    print(f"workload: {json.dumps(config.as_dict())}")
    print(f"inference model: {json.dumps(cost.__dict__)} replicas={args.replicas}")
    print(f"caps: sandbox_capacity={args.capacity} baseline_concurrency={args.capacity} "
          f"inference_concurrency={args.inference_concurrency} corral_backend={args.backend} "
          f"warm_spares={'default' if args.spares is None else args.spares}"
          + (f" hosts={args.hosts}" if args.hosts else ""))
    await asyncio.to_thread(ensure_base_image)
    env_cls = define_env(config)
    tools = env_cls().tool_schemas()
    tokenizer = await asyncio.to_thread(load_tokenizer, "tiny")
    bounds = Bounds(Scripter(tokenizer), cost, args.capacity, args.replicas)
    n = config.tasks * config.group

    with inference_server(config, cost, args.replicas) as urls:
        await server_stats(urls, reset=True)
        # (a) cold batch, Corral
        print("corral cold batch ...", file=sys.stderr)
        cold = await corral_cold(args, config, urls, tokenizer)
        cold_server = await server_stats(urls, reset=True)
        trajs = cold["trajectories"]
        plans = [plan_of_messages(config, t.messages) for t in trajs]
        known = [p for p in plans if p is not None]
        tasks = [int(t.metadata["task_index"]) for t in trajs]
        cold_bound = bounds.of(known)
        emit(figures, "corral_cold_seconds", cold["seconds"])
        emit(figures, "corral_cold_complete", sum(t.status.value == "complete" for t in trajs))
        emit(figures, "corral_cold_failed", sum(not t.trainable for t in trajs))
        emit(figures, "corral_cold_cache_hit_rate", cold_server["cache_hit_rate"])
        figures["corral_cold_phases"] = phase_means(trajs)
        figures["corral_cold_pool"] = {k: v for k, v in cold["stats"]["executor"]["pool"].items()
                                       if not isinstance(v, list)}
        print(f"corral_cold_phase_means={json.dumps(figures['corral_cold_phases'])}")
        figures["corral_cold_request_ms"] = request_ms(cold_server, cost, sum(
            t.phase_seconds().get("decode", 0.0) + t.phase_seconds().get("queue", 0.0)
            for t in trajs))
        print(f"corral_cold_request_ms={json.dumps(figures['corral_cold_request_ms'])}")
        print(f"corral_cold_pool={json.dumps(figures['corral_cold_pool'])}")
        # spares are held beyond the slots: the peak is what the host really carried
        emit(figures, "corral_cold_peak_sandboxes", cold["stats"]["executor"]["pool"]["peak_live"])

        # (a) cold batch, baseline(s), same tasks in group order
        teardowns = {"harbor": ["harbor"], "tuned": ["tuned"], "both": ["harbor", "tuned"],
                     "none": []}[args.baseline]
        base_seconds: dict[str, float] = {}
        for teardown in teardowns:
            print(f"baseline ({teardown}) cold batch ...", file=sys.stderr)
            base = await baseline(args, config, urls, tools, tasks, teardown)
            base_server = await server_stats(urls, reset=True)
            results = base["results"]
            base_seconds[teardown] = base["seconds"]
            prefix = "baseline" if teardown == "harbor" else f"baseline_{teardown}"
            emit(figures, f"{prefix}_seconds", base["seconds"])
            emit(figures, f"{prefix}_failed", sum(r.error is not None for r in results))
            emit(figures, f"{prefix}_cache_hit_rate", base_server["cache_hit_rate"])
            phases = {k: round(statistics.fmean(r.phases.get(k, 0.0) for r in results), 3)
                      for k in ("start", "setup", "inference", "commands", "verify", "teardown")}
            figures[f"{prefix}_phases"] = phases
            print(f"{prefix}_phase_means={json.dumps(phases)}")
            figures[f"{prefix}_request_ms"] = request_ms(
                base_server, cost, sum(r.phases.get("inference", 0.0) for r in results))
            print(f"{prefix}_request_ms={json.dumps(figures[f'{prefix}_request_ms'])}")
            groups: dict[tuple[int, int], list[float]] = {}
            for i, r in enumerate(results):
                groups.setdefault((i // config.group, r.task), []).append(r.reward)
            emit(figures, f"{prefix}_zero_variance_groups", zero_variance_groups(groups))
            same = sorted((r.task, r.sample) for r in results) == sorted(
                (p.task, p.sample) for p in known)
            emit(figures, f"{prefix}_same_plans_as_corral", same)

        emit(figures, "lower_bound_cold_seconds", cold_bound.value)
        print(f"lower_bound_cold_terms=critical_path:{cold_bound.critical_path:.1f} "
              f"occupancy:{cold_bound.occupancy:.1f} decode:{cold_bound.decode:.1f} "
              f"(commands only: {cold_bound.sandbox_work:.1f})")
        emit(figures, "cold_ratio_to_lower_bound", cold["seconds"] / cold_bound.value)

        # (b) steady state, Corral
        if not args.skip_steady:
            print("corral steady state ...", file=sys.stderr)
            steady = await corral_steady(args, config, urls, tokenizer)
            steady_server = await server_stats(urls, reset=True)
            stamps = steady["stamps"]
            intervals = [b - a for a, b in zip(stamps, stamps[1:])]
            per_batch = statistics.fmean(intervals)
            batch_bounds = [bounds.of([p for p in (plan_of_messages(config, t.messages)
                                                   for t in b.trajectories) if p is not None])
                            for b in steady["batches"][1:]]
            # In steady state a long trajectory spans several batch intervals, so one
            # trajectory's critical path does not bound the time per batch; the throughput
            # terms do (the critical path is printed beside them).
            steady_bound = statistics.fmean(max(b.occupancy, b.decode) for b in batch_bounds)
            assembly = steady["stats"]["assembly"]
            counts = steady["stats"]["counts"]
            emit(figures, "corral_first_batch_seconds", stamps[0])
            emit(figures, "corral_steady_batches", len(intervals))
            emit(figures, "corral_steady_seconds_per_batch", per_batch)
            figures["corral_steady_intervals"] = intervals
            print(f"corral_steady_intervals={[round(x, 1) for x in intervals]}")
            emit(figures, "corral_steady_cache_hit_rate", steady_server["cache_hit_rate"])
            emit(figures, "corral_steady_launched", counts["launched"])
            emit(figures, "corral_steady_in_flight_at_end", steady["inflight_at_end"])
            emit(figures, "corral_steady_discarded_groups",
                 assembly["filtered_groups"] + assembly["discarded_groups"])
            emit(figures, "corral_steady_discarded_trajectories",
                 assembly["filtered_trajectories"] + assembly["discarded_trajectories"])
            emit(figures, "corral_steady_infra_failed", assembly["infra_failed"])
            emit(figures, "lower_bound_steady_seconds_per_batch", steady_bound)
            print(f"lower_bound_steady_terms="
                  f"occupancy:{statistics.fmean(b.occupancy for b in batch_bounds):.1f} "
                  f"decode:{statistics.fmean(b.decode for b in batch_bounds):.1f} "
                  f"(critical_path, not binding per batch: "
                  f"{statistics.fmean(b.critical_path for b in batch_bounds):.1f}; commands only: "
                  f"{statistics.fmean(b.sandbox_work for b in batch_bounds):.1f})")
            emit(figures, "ratio_to_lower_bound", per_batch / steady_bound)
            # the same window replayed with zero overhead: what a runner at the physical limit
            # would measure here (carry-over makes a short window stray; window_noise.py)
            emit(figures, "ideal_ratio_to_lower_bound", ideal_ratio(args, config, cost, bounds))
            steady_trajs = [t for b in steady["batches"][1:] for t in b.trajectories]
            figures["corral_steady_phases"] = phase_means(steady_trajs)
            print(f"corral_steady_phase_means={json.dumps(figures['corral_steady_phases'])}")
            # (no client-side overhead here: the server also served the work still in flight)
            figures["corral_steady_request_ms"] = request_ms(steady_server, cost)
            print(f"corral_steady_request_ms={json.dumps(figures['corral_steady_request_ms'])}")
            # where the rest goes: how long each trajectory held its sandbox against the least
            # its plan needs (the occupancy term's share), and how busy the slots were (held
            # time / capacity x time)
            holds = [sandbox_hold(t) for t in steady_trajs]
            floors = [bounds.sandbox_floor(p) for p in (plan_of_messages(config, t.messages)
                                                        for t in steady_trajs) if p is not None]
            emit(figures, "corral_steady_hold_per_trajectory", statistics.fmean(holds))
            emit(figures, "sandbox_floor_per_trajectory", statistics.fmean(floors))
            emit(figures, "corral_steady_slot_use",
                 sum(holds) / (args.capacity * per_batch * len(intervals)))
            pool = steady["stats"]["executor"]["pool"]
            emit(figures, "corral_steady_peak_sandboxes", pool["peak_live"])
            # a fresh sandbox per trajectory: starts over the whole run, waits in the window
            # (the run's first batch waits for the cold starts of the first slots)
            emit(figures, "corral_steady_pool_start_seconds_mean",
                 statistics.fmean(pool["start_seconds"] or [0]))
            emit(figures, "corral_steady_pool_wait_seconds_mean",
                 statistics.fmean(map(pool_wait, steady_trajs)))
            if "harbor" in base_seconds:
                emit(figures, "speedup_vs_baseline", base_seconds["harbor"] / per_batch)
                # what a harness running exactly at the lower bound would get: no runner can
                # beat it, so it says how much of a speedup target this workload allows
                emit(figures, "speedup_at_lower_bound", base_seconds["harbor"] / steady_bound)
            if "tuned" in base_seconds:
                emit(figures, "speedup_vs_tuned_baseline", base_seconds["tuned"] / per_batch)
        if "harbor" in base_seconds:
            emit(figures, "cold_speedup_vs_baseline", base_seconds["harbor"] / cold["seconds"])
        if "tuned" in base_seconds:
            emit(figures, "cold_speedup_vs_tuned_baseline", base_seconds["tuned"] / cold["seconds"])
        emit(figures, "trajectories_per_batch", n)
        if args.hosts:  # where Corral's containers went (cold and steady runs together)
            figures["fleet"] = fleet_figures(args)
            for host in figures["fleet"]:
                print(f"fleet_host {host['url']}: created={host['created']} "
                      f"images_copied={host['loads']} capacity={host['capacity']} "
                      f"state={host['state']}")
    return figures


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    started = time.perf_counter()
    figures = asyncio.run(main_async(args))
    figures["benchmark_wall_seconds"] = time.perf_counter() - started
    print(f"benchmark_wall_seconds={figures['benchmark_wall_seconds']:.1f}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
