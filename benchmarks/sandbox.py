"""Sandbox speed, side by side in one run: raw Docker vs Corral's docker backend vs bwrap.

    .venv/bin/python benchmarks/sandbox.py -n 20

Prints a table of medians (ms) and ratio lines such as `corral_docker_cold_start_vs_raw=1.03`.
Targets (issue 3): persistent-shell round trip <= 5 ms; bwrap start <= 20 ms; Corral docker cold
start <= 1.2x raw create+start.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
from typing import Awaitable, Callable

from corral.sandbox import open_sandbox
from corral.sandbox.baseimage import ensure_base_image
from corral.sandbox.daemon import docker_client
from corral.sandbox.reaper import gc
from corral.sandbox.spec import Terminal

RUN = "bench-sandbox"


def timed(fn: Callable[[], object], n: int) -> float:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1000


async def atimed(fn: Callable[[], Awaitable[object]], n: int) -> float:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1000


def raw_docker(image: str, n: int) -> dict[str, float]:
    client = docker_client()
    kw = dict(command=["sleep", "infinity"], detach=True, network_mode="none",
              labels={"corral.managed": "1", "corral.run": RUN})
    made = []

    def create_start() -> None:
        c = client.containers.create(image, **kw)
        c.start()
        made.append(c)

    res = {"raw docker SDK create+start": timed(create_start, n)}

    def first_command() -> None:  # what a harness does before the agent's first command
        create_start()
        made[-1].exec_run(["true"])

    res["raw docker SDK create+start+exec_run('true')"] = timed(first_command, n)
    c = made[0]
    res["raw docker SDK exec_run('true')"] = timed(lambda: c.exec_run(["true"]), n)
    res["raw CLI docker exec true"] = timed(
        lambda: subprocess.run(["docker", "exec", c.id, "true"], check=True), n)
    res["raw CLI docker run --rm true"] = timed(
        lambda: subprocess.run(["docker", "run", "--rm", "--network", "none", image, "true"],
                               check=True), max(3, n // 2))
    for c in made:
        c.remove(force=True)
    return res


async def corral(backend: str, image: str, n: int) -> dict[str, float]:
    spec = Terminal(image=image)
    made = []

    async def start() -> None:
        made.append(await open_sandbox(spec, backend, run_id=RUN, image=image))

    res = {f"corral {backend} cold start": await atimed(start, n)}

    async def first_command() -> None:  # start, then the first command in the agent's shell
        await start()
        await (await made[-1].shell()).run("true")

    res[f"corral {backend} start + first shell command"] = await atimed(first_command, n)
    sb = made[0]
    sh = await sb.shell()
    await sh.run("true")
    res[f"corral {backend} exec('true')"] = await atimed(lambda: sb.exec(["true"]), n)
    res[f"corral {backend} shell round trip 'true'"] = await atimed(lambda: sh.run("true"), n * 5)
    res[f"corral {backend} shell round trip 'echo hi'"] = await atimed(
        lambda: sh.run("echo hi"), n * 5)
    res[f"corral {backend} shell round trip '/bin/true'"] = await atimed(
        lambda: sh.run("/bin/true"), n * 5)
    # host-side file operations (the env's setup files, the agent's write_file/read_file tools)
    payload = b"x" * 4096
    res[f"corral {backend} write_file 4 KiB"] = await atimed(
        lambda: sb.write_file("/tmp/bench/deep/file.txt", payload), n * 5)
    res[f"corral {backend} read_file 4 KiB"] = await atimed(
        lambda: sb.read_file("/tmp/bench/deep/file.txt"), n * 5)
    t = time.perf_counter()
    for s in made:
        await s.close()
    res[f"corral {backend} close (mean)"] = (time.perf_counter() - t) * 1000 / len(made)
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="samples per figure (median)")
    parser.add_argument("--only", choices=["bwrap"], default=None,
                        help="measure only this backend (no ratios)")
    args = parser.parse_args()
    image = ensure_base_image()
    try:
        if args.only:
            res = asyncio.run(corral(args.only, image, args.n))
        else:
            res = raw_docker(image, args.n)
            res.update(asyncio.run(corral("docker", image, args.n)))
            res.update(asyncio.run(corral("bwrap", image, args.n)))
    finally:
        gc(RUN)
    width = max(map(len, res))
    print(f"{'figure (median ms, n=' + str(args.n) + ')':<{width}}  value")
    for name, ms in res.items():
        print(f"{name:<{width}}  {ms:8.2f}")
    if args.only:
        return
    raw_start = res["raw docker SDK create+start"]
    d_rt = res["corral docker shell round trip 'true'"]
    b_rt = res["corral bwrap shell round trip 'true'"]
    ratios = {
        "corral_docker_cold_start_vs_raw": res["corral docker cold start"] / raw_start,
        "corral_docker_shell_rt_vs_raw_cli_exec": d_rt / res["raw CLI docker exec true"],
        "corral_docker_exec_vs_raw_exec_run":
            res["corral docker exec('true')"] / res["raw docker SDK exec_run('true')"],
        "bwrap_cold_start_vs_raw_docker_start": res["corral bwrap cold start"] / raw_start,
        "corral_docker_first_command_vs_raw": res["corral docker start + first shell command"]
        / res["raw docker SDK create+start+exec_run('true')"],
    }
    for name, value in ratios.items():
        print(f"{name}={value:.3f}")
    print(f"targets: shell round trip <= 5 ms (docker {d_rt:.2f}, bwrap {b_rt:.2f}); "
          f"bwrap start <= 20 ms ({res['corral bwrap cold start']:.1f}); docker cold start "
          f"<= 1.2x raw ({ratios['corral_docker_cold_start_vs_raw']:.2f})")

if __name__ == "__main__":
    main()
