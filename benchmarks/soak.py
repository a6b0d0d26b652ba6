"""Soak: collect for N minutes while the infrastructure fails under the collector.

    python benchmarks/soak.py --minutes 10 --restart-every 120 [--kill-every 150]

Collection runs as `corral collect` processes (the CLI's collection path with a scripted policy
on a cheap terminal env: `faultkit.collector`), one run directory per round of `--round-n`
trajectories, back to back. Meanwhile dockerd is restarted every `--restart-every` seconds
(SIGTERM, then started again as scripts/dev.sh starts it), and with `--kill-every` the collector
is SIGKILLed and started again on the same run directory (a resume). After each round, with no
collector alive, the census counts what the round lost, duplicated and left behind. Prints:

    lost=0 duplicated=0 leaked_containers=0 leaked_processes=0 infra_error_share=0.0000 ...

Needs root (it restarts dockerd) and the base image; loopback only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run as a script: `benchmarks` is then a package too

from benchmarks.faultkit import census  # noqa: E402
from benchmarks.faultkit.dockerd import restart_dockerd, start_dockerd  # noqa: E402


def _spawn(run_dir: Path, args: argparse.Namespace, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, census.MARKER: run_dir.name,
           "PYTHONPATH": f"{HERE.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "benchmarks.faultkit.collector", str(run_dir),
             "--n", str(args.round_n),
             "--group", str(args.group), "--backend", args.backend,
             "--capacity", str(args.capacity), "--hold", str(args.hold)],
            env=env, stdout=out, stderr=subprocess.STDOUT)


def _stored(run_dir: Path) -> int:
    path = run_dir / "trajectories.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--restart-every", type=float, default=120.0,
                        help="seconds between dockerd restarts (0: none)")
    parser.add_argument("--kill-every", type=float, default=0.0,
                        help="seconds between SIGKILLs of the collector, each resumed (0: none)")
    parser.add_argument("--backend", default="docker")
    parser.add_argument("--round-n", type=int, default=48, help="trajectories per round")
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--capacity", type=int, default=4)
    parser.add_argument("--hold", type=float, default=0.3, help="seconds each episode sleeps")
    parser.add_argument("--dir", type=Path, default=None, help="where run directories go")
    args = parser.parse_args()

    start_dockerd()
    root = args.dir or Path(tempfile.mkdtemp(prefix="corral-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    log = root / "collector.log"
    tag = uuid.uuid4().hex[:6]
    began = time.monotonic()
    deadline = began + args.minutes * 60
    inf = float("inf")
    next_restart = began + args.restart_every if args.restart_every else inf
    next_kill = began + args.kill_every if args.kill_every else inf
    rounds: list[census.Census] = []
    restarts, kills, failed_rounds, downtime = 0, 0, 0, 0.0
    while time.monotonic() < deadline:
        run_dir = root / f"soak-{tag}-r{len(rounds):03d}"
        proc = _spawn(run_dir, args, log)
        while proc.poll() is None:
            now = time.monotonic()
            if now >= next_restart:
                downtime += restart_dockerd()
                restarts += 1
                next_restart = time.monotonic() + args.restart_every
            if now >= next_kill and _stored(run_dir):
                proc.kill()
                proc.wait()
                kills += 1
                proc = _spawn(run_dir, args, log)  # the resume
                next_kill = time.monotonic() + args.kill_every
            time.sleep(0.1)
        failed_rounds += proc.returncode != 0
        rounds.append(census.take(run_dir, run_dir.name, args.round_n, args.group))
        print(f"round {len(rounds)}: {rounds[-1].line()}", flush=True)
    total = census.Census(*(sum(getattr(r, f) for r in rounds) for f in (
        "expected", "stored", "lost", "duplicated", "infra_errors", "leaked_containers",
        "leaked_processes", "leaked_bwrap")))
    print(f"soak: {time.monotonic() - began:.0f} s, {len(rounds)} rounds, {restarts} dockerd "
          f"restarts (down {downtime:.1f} s in all), {kills} collector kills, "
          f"{failed_rounds} collector failures; logs in {root}")
    print(total.line(), flush=True)


if __name__ == "__main__":
    main()
