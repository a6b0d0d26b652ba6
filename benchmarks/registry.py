"""Registry benchmarks: catalog `make`/`list` speed (issue 2), release publish/pull (issue 5),
hostile uploads and resolve cost (issue 14).

    .venv/bin/python benchmarks/registry.py [--repeat N] [--tasks 10000] [--release-repeat 3]
                                            [--only catalog|release|hostile]

Each measurement is a function returning a dict of figures; `main()` runs them all and prints
them, one `name=value` line each, so results can be pasted into docs/benchmarks.md.

Release figures (targets ≤ 3 s each for an env of 10,000 tasks): publish = load the env and its
dataset, hash every task (dataset hash, card), pack, verify and commit; pull = resolve, download,
verify every file hash and commit into a clean local store. Each publish starts from a fresh
copy of the env folder (nothing cached in the process), as `corral publish` in a new process
would; `*_cli_s` figures are whole `corral` processes, Python start-up included. The HTTP
figures run against `corral registry serve` in its own process on 127.0.0.1.

Hostile figures (issue 14): for each crafted archive of `tests/faults/hostile_archives.py`, the
time `corral registry serve` takes to refuse its upload and how far the server's peak memory
(VmHWM, reset through /proc/PID/clear_refs) rises above its size before the upload; then the
median resolve time of an env whose releases carry a description of `--description-bytes`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import httpx

import corral as cr
from corral.registry import Catalog
from corral.registry.store import LocalStore
from corral.registry.transfer import publish, pull

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "faults"))
from hostile_archives import write_all  # noqa: E402  (the crafted archives of the fault tests)

TOKEN = "bench-token-0001"
ENV_PY = """from pathlib import Path

import corral as cr


TASKS = cr.Dataset.from_jsonl(Path(__file__).with_name("tasks.jsonl"))


@cr.environment("bench/big-v1", tasks=TASKS, tags=["text", "bench"])
class Big(cr.TextEnv):
    \"\"\"A text env with many tasks, for the release benchmarks.\"\"\"

    def instruction(self, task):
        return task.prompt

    @cr.reward
    def correct(self, task, completion):
        return float(completion.strip() == task.answer)

    def solution(self, task):
        return task.answer
"""


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def bench_make(repeat: int = 200) -> dict[str, float]:
    """`cr.make` of an already-imported built-in env (the target: ≤ 2 ms median)."""
    cr.make("corral/arithmetic-v0")  # first make imports the module; measure the steady state
    return {"make_imported_env_median_ms": _median_ms(lambda: cr.make("corral/arithmetic-v0"),
                                                      repeat)}


def bench_list(repeat: int = 50, specs: int = 1000) -> dict[str, float]:
    """`list` over 1,000 registered specs, with and without a pattern (target: ≤ 50 ms)."""
    catalog = Catalog(entry_points=False)
    for i in range(specs):
        catalog.register(f"ns{i % 10}/env{i}-v{i % 3}", "corral.envs.text.arithmetic:Arithmetic",
                         tags=["bench"])
    return {"list_1000_specs_median_ms": _median_ms(catalog.list, repeat),
            "list_1000_specs_pattern_median_ms": _median_ms(lambda: catalog.list("ns3/*"), repeat)}


def write_big_env(folder: Path, tasks: int) -> Path:
    """An env folder with `tasks` JSONL tasks (~200-byte prompts), a Dockerfile and a manifest."""
    folder.mkdir(parents=True)
    (folder / "corral.toml").write_text('[[env]]\nid = "bench/big-v1"\nentry_point = "env:Big"\n'
                                        'kind = "text"\nlicense = "CC0-1.0"\n')
    (folder / "env.py").write_text(ENV_PY)
    (folder / "Dockerfile").write_text("FROM corral/base:bookworm\n")
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
             for _ in range(5000)]
    with open(folder / "tasks.jsonl", "w") as fh:
        for i in range(tasks):  # ~250-byte prompts of varied words: not trivially compressible
            items = " ".join(rng.choice(words) for _ in range(12))
            prompt = (f"Task {i}: the inventory of warehouse {rng.randint(1, 999)} lists {items}. "
                      f"How many crates remain after {rng.randint(1, 20)} shipments leave? "
                      "Answer with the number only.")
            fh.write(json.dumps({"prompt": prompt, "answer": str(rng.randint(0, 999))}) + "\n")
    return folder


def _fresh_copy(template: Path, work: Path) -> Path:
    target = Path(tempfile.mkdtemp(dir=work, prefix="env-")) / "big"
    shutil.copytree(template, target)
    return target


def bench_publish_pull_local(work: Path, template: Path, repeat: int) -> dict[str, float]:
    """Publish into a local store and pull into a clean one, in-process. The `_cpu_s` figures
    are this process's CPU time: what the wall time would be on an idle machine."""
    publish_s, pull_s, publish_cpu, pull_cpu = [], [], [], []
    for i in range(repeat):
        folder = _fresh_copy(template, work)
        source = LocalStore(work / f"local-src-{i}")
        start, cpu = time.perf_counter(), time.process_time()
        record = publish(folder, registry=source, version=f"1.0.{i}").record
        publish_s.append(time.perf_counter() - start)
        publish_cpu.append(time.process_time() - cpu)
        start, cpu = time.perf_counter(), time.process_time()
        pulled = pull(f"bench/big-v1@1.0.{i}", source=source, dest=LocalStore(work / f"dst-{i}"))
        pull_s.append(time.perf_counter() - start)
        pull_cpu.append(time.process_time() - cpu)
        assert pulled.sha256 == record.sha256
    return {"release_archive_mib": record.size / (1 << 20),
            "publish_10k_local_median_s": statistics.median(publish_s),
            "publish_10k_local_cpu_s": statistics.median(publish_cpu),
            "pull_10k_local_median_s": statistics.median(pull_s),
            "pull_10k_local_cpu_s": statistics.median(pull_cpu)}


def _corral(*args: str, home: Path) -> float:
    env = {**os.environ, "CORRAL_HOME": str(home)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "corral.cli", *args], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def bench_publish_pull_http(work: Path, template: Path, repeat: int) -> dict[str, float]:
    """Publish to and pull from `corral registry serve` over loopback HTTP: in-process client
    calls and whole `corral publish` / `corral pull` processes."""
    with _server(work / "server") as (url, _):
        publish_s, pull_s, cli_publish_s, cli_pull_s = [], [], [], []
        for i in range(repeat):
            start = time.perf_counter()
            publish(_fresh_copy(template, work), registry=url, token=TOKEN, version=f"2.0.{i}")
            publish_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            pull(f"bench/big-v1@2.0.{i}", source=url, dest=LocalStore(work / f"http-dst-{i}"))
            pull_s.append(time.perf_counter() - start)
            home = work / f"cli-home-{i}"
            cli_publish_s.append(_corral("publish", str(_fresh_copy(template, work)), "--version",
                                         f"3.0.{i}", "--registry", url, "--token", TOKEN,
                                         home=home))
            cli_pull_s.append(_corral("pull", f"bench/big-v1@3.0.{i}", "--registry", url,
                                      home=home))
    return {"publish_10k_http_median_s": statistics.median(publish_s),
            "pull_10k_http_median_s": statistics.median(pull_s),
            "publish_10k_http_cli_s": statistics.median(cli_publish_s),
            "pull_10k_http_cli_s": statistics.median(cli_pull_s)}


@contextlib.contextmanager
def _server(home: Path) -> Iterator[tuple[str, int]]:
    """`corral registry serve` over `home` in its own process: (url, pid)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "corral.cli", "registry", "serve",
                               "--registry", str(home), "--port", str(port),
                               "--token", f"bench:{TOKEN}", "--token", f"acme:{TOKEN}"],
                              stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not _healthy(url):
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the registry server did not start")
            time.sleep(0.05)
        yield url, server.pid
    finally:
        server.terminate()
        server.wait(30)


def _kib(pid: int, field: str) -> int:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines()
                if x.startswith(field + ":"))
    return int(line.split()[1])


def bench_hostile_uploads(work: Path, template: Path, repeat: int) -> dict[str, float]:
    """Time to refuse each crafted archive and the server's peak memory growth meanwhile."""
    figures: dict[str, float] = {}
    with _server(work / "hostile-server") as (url, pid):
        for case, archive in write_all(work / "hostile").items():
            data = archive.read_bytes()
            before = _kib(pid, "VmRSS")
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset the peak (VmHWM)
            start = time.perf_counter()
            status = httpx.put(f"{url}/api/releases", content=data, timeout=600,
                               headers={"Authorization": f"Bearer {TOKEN}"}).status_code
            case = case.replace("-", "_")
            figures[f"hostile_{case}_upload_kib"] = len(data) / 1024
            figures[f"hostile_{case}_refuse_s"] = time.perf_counter() - start
            figures[f"hostile_{case}_server_peak_mib"] = (_kib(pid, "VmHWM") - before) / 1024
            figures[f"hostile_{case}_status"] = status
    return figures


def bench_resolve(work: Path, template: Path, repeat: int, *, versions: int = 5,
                  description_bytes: int = 64 << 10) -> dict[str, float]:
    """Median `resolve` of an env with `versions` releases, each with a description of
    `description_bytes` (64 KiB, the cap, by default), from a local store."""
    store = LocalStore(work / "resolve-store")
    folder = write_big_env(work / "resolve-env", 100)
    with open(folder / "corral.toml", "a") as fh:  # [[env]] is the file's last table
        fh.write(f'description = "{"d" * description_bytes}"\n')
    for i in range(versions):
        publish(folder, registry=store, version=f"1.0.{i}")
    return {f"resolve_{versions}_versions_{description_bytes >> 10}kib_description_median_ms":
            _median_ms(lambda: store.resolve("bench/big-v1"), max(repeat, 50))}


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


BENCHMARKS: list[Callable[..., dict[str, float]]] = [bench_make, bench_list]
RELEASE_BENCHMARKS: list[Callable[..., dict[str, float]]] = [bench_publish_pull_local,
                                                             bench_publish_pull_http]
HOSTILE_BENCHMARKS: list[Callable[..., dict[str, float]]] = [bench_hostile_uploads, bench_resolve]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200, help="samples per catalog timing")
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks of the released env")
    parser.add_argument("--release-repeat", type=int, default=3,
                        help="samples per publish/pull timing")
    parser.add_argument("--only", choices=["catalog", "release", "hostile"],
                        help="run one group of benchmarks")
    args = parser.parse_args()
    for bench in BENCHMARKS if args.only in (None, "catalog") else []:
        for name, value in bench(repeat=args.repeat).items():
            print(f"{name}={value:.3f}")
    groups = {"release": RELEASE_BENCHMARKS, "hostile": HOSTILE_BENCHMARKS}
    chosen = [b for group, benches in groups.items() if args.only in (None, group)
              for b in benches]
    if not chosen:
        return
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        work = Path(tmp)
        # The hostile group needs no big env: a placeholder folder stands for the template.
        template = write_big_env(work / "template", args.tasks) if args.only != "hostile" \
            else work
        os.environ["CORRAL_HOME"] = str(work / "home")  # never touch the user's store
        for bench in chosen:
            for name, value in bench(work, template, args.release_repeat).items():
                print(f"{name}={value:.3f}", flush=True)


if __name__ == "__main__":
    main()
