"""Turn boundaries at work: resume against restart after a SIGKILL, tree groups against flat.

    .venv/bin/python benchmarks/tree.py                   # both parts
    .venv/bin/python benchmarks/tree.py --part resume --episodes 8 --turns 20
    .venv/bin/python benchmarks/tree.py --part tree --batch 64 --group 8 --k 2 --turns 6

Both parts run a multi-turn terminal env in bubblewrap sandboxes with a scripted policy whose
generations take `--latency` seconds (a stand-in for decode time), and measure the two
variants side by side in one run.

**resume**: a collector (`python benchmarks/tree.py --worker ...`, a subprocess: a `Runner`
into a run directory, as `corral collect`) plays `--episodes` episodes of `--turns` turns and is
SIGKILLed once half of the batch's turns are done. Its run directory is copied twice; one copy
is resumed as it is (episodes continue from their last completed turn, on sandboxes restored
from their durable snapshots), the other without its turn log (episodes start again, as before
turn-level resume). Printed: regenerated tokens (the generated tokens of the resumed run) and
sandbox-seconds (time sandboxes were held by its episodes) of each, and the ratios.

**tree**: one batch of `--batch` trajectories in groups of `--group`, flat (every sample its
own sandbox and every turn) against tree groups sharing their first `--k` turns
(`AssemblyConfig(tree_turns=k)`). Printed, for the batch's trajectories: sandbox starts with
setup and snapshot restores (a branch starts on its root's snapshot, no setup), generated
tokens (a tree's shared turns once), sandbox-seconds (setup or restore to verify end), time to
the batch, and the flat/tree ratios; `generated_tokens_all` adds the look-ahead groups'
tokens (work for the next batch).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import corral as cr
from corral.runner import AssemblyConfig, Runner, ScriptedPolicy
from corral.runner.policy import ScriptedCall
from corral.runner.store import load_run
from corral.runner.trajectory import Trajectory
from corral.runner.turnlog import TURNS, TurnLog

__all__ = ["Count", "batch_generated_tokens", "held_seconds", "main", "solver"]


class Count(cr.TerminalEnv):
    """Append 1..n to /tmp/log, one number per turn (a multi-turn terminal workload)."""

    env_id = "bench/count-v0"
    tasks = cr.Dataset.from_list([{"n": 20}])
    max_turns = 20

    setup_files = 300  # the task's working tree, written by setup (a repository checkout)

    async def setup(self, sandbox: cr.sandbox.Sandbox, task: cr.Task) -> None:
        await sandbox.exec(f"mkdir -p /srv/repo && for i in $(seq 1 {self.setup_files}); do "
                           "head -c 4096 /dev/urandom > /srv/repo/f$i; done")

    def instruction(self, task: cr.Task) -> str:
        return f"Append 1 to {task.n} to /tmp/log, one number per turn."

    @cr.reward
    async def counted(self, sandbox: cr.sandbox.Sandbox, task: cr.Task) -> float:
        log = (await sandbox.exec("cat /tmp/log")).stdout.split()
        return float(log == [str(i) for i in range(1, task.n + 1)])


def counting(turns: int, setup_files: int = 300) -> type[Count]:
    """`Count` with `turns` turns and `setup_files` files of 4 KiB written by setup."""
    return type(f"Count{turns}", (Count,), {"tasks": cr.Dataset.from_list([{"n": turns}]),
                                            "max_turns": turns, "setup_files": setup_files})


def solver(call: ScriptedCall) -> str:
    """Turn t appends t (t read from the tool outputs so far) and a seeded number."""
    turn = len(re.findall(r"L\d+L", call.prompt)) + 1
    body = json.dumps({"name": "bash", "arguments": {"command": (
        f"echo {turn} >> /tmp/log && echo {(call.request.seed or 0) % 997} >> /tmp/pick "
        "&& printf 'L%sL' $(wc -l < /tmp/log)")}})
    return f"<tool_call>{body}</tool_call>"


def held_seconds(traj: Trajectory) -> float:
    """Seconds the trajectory held a sandbox: from its setup (or restore) to its last span."""
    setups = [s.start for s in traj.spans if s.phase == "setup"]
    return max(s.end for s in traj.spans) - min(setups) if setups else 0.0


# --- resume against restart --------------------------------------------------------------------
async def _collect(run_dir: str, episodes: int, turns: int, latency: float,
                   capacity: int, setup_files: int) -> dict[str, Any]:
    policy = ScriptedPolicy(solver, latency=latency)
    async with Runner([counting(turns, setup_files)], policy, run_dir=run_dir, seed=1,
                      sandbox_backend="bwrap", sandbox_capacity=capacity,
                      inference_concurrency=2 * capacity) as runner:
        await runner.collect(episodes, group=2)
    return {"generated_tokens": policy.stats.generated_tokens, **runner.stats()["counts"]}


def _worker(args: argparse.Namespace) -> None:
    result = asyncio.run(_collect(args.run_dir, args.episodes, args.turns, args.latency,
                                  args.capacity, args.setup_files))
    print(json.dumps(result))


def _spawn(run_dir: Path, args: argparse.Namespace) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", "--run-dir", str(run_dir), "--episodes",
         str(args.episodes), "--turns", str(args.turns), "--latency", str(args.latency),
         "--capacity", str(args.capacity), "--setup-files", str(args.setup_files)],
        text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def _stored(run_dir: Path) -> set[str]:
    path = run_dir / "trajectories.jsonl"
    if not path.exists():
        return set()
    return {json.loads(line)["id"] for line in path.read_bytes().splitlines(keepends=True)
            if line.endswith(b"\n")}


def _turns_done(run_dir: Path, turns: int) -> int:
    stored = _stored(run_dir)
    log = TurnLog(run_dir).open() if (run_dir / TURNS).exists() else {}
    return turns * len(stored) + sum(b.turn for i, b in log.items() if i not in stored)


def resume_part(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Kill a collector at half its turns; resume one copy, restart the other."""
    first = root / f"kill-{uuid.uuid4().hex[:6]}"
    proc = _spawn(first, args)
    half = args.episodes * args.turns // 2
    deadline = time.monotonic() + 600
    while _turns_done(first, args.turns) < half and time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("the collector finished before half its turns were done")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for state in Path("/sys/fs/cgroup/freezer/corral").glob(f"{first.name}*/freezer.state"):
        state.write_text("THAWED")  # a kill during a snapshot leaves the sandbox frozen
    done_at_kill = _turns_done(first, args.turns)
    kept = _stored(first)
    out: dict[str, Any] = {"turns_done_at_kill": done_at_kill,
                           "turns_in_batch": args.episodes * args.turns}
    for how in ("resume", "restart"):
        copy = root / f"{how}-{uuid.uuid4().hex[:6]}"
        shutil.copytree(first, copy)
        if how == "restart":
            (copy / TURNS).unlink(missing_ok=True)
        began = time.perf_counter()
        again = _spawn(copy, args)
        stdout, _ = again.communicate(timeout=900)
        counts = json.loads(stdout.strip().splitlines()[-1])
        _, trajs = load_run(copy)
        done = [t for t in trajs if t.reward == 1.0]
        fresh = [t for t in trajs if t.id not in kept]  # what the second run played
        out[how] = {"regenerated_tokens": counts["generated_tokens"],
                    "sandbox_seconds": round(sum(held_seconds(t) for t in fresh), 2),
                    "resumed_episodes": counts.get("resumed_turns", 0),
                    "solved": len(done), "episodes": len(trajs),
                    "wall_s": round(time.perf_counter() - began, 2)}
    out["restart_vs_resume_tokens"] = round(out["restart"]["regenerated_tokens"]
                                            / max(1, out["resume"]["regenerated_tokens"]), 2)
    out["restart_vs_resume_sandbox_seconds"] = round(
        out["restart"]["sandbox_seconds"] / max(1e-9, out["resume"]["sandbox_seconds"]), 2)
    return out


# --- tree groups against flat groups -----------------------------------------------------------
async def _one_batch(args: argparse.Namespace, k: int) -> dict[str, Any]:
    policy = ScriptedPolicy(solver, latency=args.latency)
    assembly = AssemblyConfig(tree_turns=k, tree_roots=args.roots, overprovision=0.0,
                              filter_zero_variance=False)
    async with Runner([counting(args.turns, args.setup_files)], policy, sandbox_backend="bwrap",
                      seed=2,
                      sandbox_capacity=args.capacity, inference_concurrency=4 * args.capacity,
                      assembly=assembly, run_id=f"bench-tree-{uuid.uuid4().hex[:6]}") as runner:
        began = time.perf_counter()
        async for batch in runner.batches(size=args.batch, group=args.group, max_batches=1):
            waited = time.perf_counter() - began
    trajs = batch.trajectories
    restored = [t for t in trajs if t.metadata.get("tree") and not _is_root(t)]
    return {"sandbox_starts_with_setup": len(trajs) - len(restored),
            "snapshot_restores": len(restored),
            "generated_tokens": batch_generated_tokens(trajs),
            "sandbox_seconds": round(sum(held_seconds(t) for t in trajs), 2),
            "time_to_batch_s": round(waited, 2),
            "generated_tokens_all": policy.stats.generated_tokens,
            "solved": sum(t.reward == 1.0 for t in trajs), "trajectories": len(trajs)}


def _is_root(traj: Trajectory) -> bool:
    return str(traj.metadata["tree"][0][0]).startswith(f"{traj.id}@")


def batch_generated_tokens(trajs: list[Trajectory]) -> int:
    """Tokens generated for these trajectories, a tree's shared turns counted once."""
    total = sum(t.generated_tokens for t in trajs)
    seen: set[str] = set()
    for traj in trajs:
        for node, end in traj.metadata.get("tree") or []:
            if node in seen:
                total -= sum(traj.loss_mask[:end])
            seen.add(node)
    return total


def tree_part(args: argparse.Namespace) -> dict[str, Any]:
    """One batch flat, one batch in tree groups, side by side."""
    flat = asyncio.run(_one_batch(args, 0))
    tree = asyncio.run(_one_batch(args, args.k))
    return {"flat": flat, "tree": tree, **{
        f"flat_vs_tree_{key}": round(flat[key] / max(1e-9, tree[key]), 2)
        for key in ("generated_tokens", "sandbox_seconds", "time_to_batch_s")}}


def main(argv: list[str] | None = None) -> None:
    """Parse flags and run the chosen parts (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=["resume", "tree", "both"], default="both")
    parser.add_argument("--episodes", type=int, default=8, help="resume: episodes in the batch")
    parser.add_argument("--turns", type=int, default=None,
                        help="turns per episode (default: 20 resume, 6 tree)")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per generation")
    parser.add_argument("--capacity", type=int, default=8, help="sandboxes at once")
    parser.add_argument("--setup-files", type=int, default=300,
                        help="4 KiB files each episode's setup writes (its task checkout)")
    parser.add_argument("--batch", type=int, default=64, help="tree: trajectories per batch")
    parser.add_argument("--group", type=int, default=8, help="tree: samples per group")
    parser.add_argument("--k", type=int, default=2, help="tree: shared turns")
    parser.add_argument("--roots", type=int, default=1, help="tree: roots per group")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args)
        return
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="corral-bench-tree-") as tmp:
        if args.part in ("resume", "both"):
            resume_args = argparse.Namespace(**{**vars(args), "turns": args.turns or 20})
            report["resume"] = resume_part(resume_args, Path(tmp))
        if args.part in ("tree", "both"):
            tree_args = argparse.Namespace(**{**vars(args), "turns": args.turns or 6})
            report["tree"] = tree_part(tree_args)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
