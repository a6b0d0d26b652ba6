"""CPU, GPU and sandbox utilisation of a training run, sampled cheaply while it runs.

`UsageSampler(run_dir, probe).run()` appends one JSON line to `RUN_DIR/usage.jsonl` every
`interval` seconds until cancelled. A sample costs a few system calls: process CPU time
(`os.times`, all threads: rollouts and trainer share the process), the 1-minute load average,
resident memory (`/proc/self/statm` where it exists), CUDA memory and, where NVML answers,
GPU utilisation (`torch.cuda.utilization`), and the runner's sandbox occupancy from `probe()`.
The training report draws them; a field a machine cannot give is absent, and the report says
why (no CUDA device, no NVML).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

__all__ = ["Probe", "USAGE_LOG", "UsageSampler", "gpu_absent_reason", "gpu_sample",
           "sandbox_sample"]

log = logging.getLogger(__name__)

USAGE_LOG = "usage.jsonl"
Probe = Callable[[], dict[str, Any]]


def gpu_sample() -> dict[str, float]:
    """CUDA memory (MB) of this process and device utilisation (%) where NVML answers; empty
    without a CUDA device."""
    import torch

    if not torch.cuda.is_available():
        return {}
    out = {"gpu_mem_mb": torch.cuda.memory_allocated() / 2**20,
           "gpu_reserved_mb": torch.cuda.memory_reserved() / 2**20}
    with contextlib.suppress(Exception):  # noqa: BLE001  (pynvml missing or NVML unusable: memory only)
        out["gpu_util_pct"] = float(torch.cuda.utilization())
    return out


def gpu_absent_reason() -> str:
    """Why a run has no GPU samples (for the report's empty GPU section)."""
    import torch

    if not torch.cuda.is_available():
        return ("no CUDA device: torch.cuda.is_available() is False (a CPU run: see the CPU "
                "chart)")
    return "the run ended before its first sample"


def _rss_mb() -> float | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None


def sandbox_sample(stats: dict[str, Any]) -> dict[str, float]:
    """Occupancy from a runner's `stats()`: rollouts in flight and the sandbox pool's use."""
    out = {"inflight": float(stats.get("counts", {}).get("inflight", 0))}
    pool = (stats.get("executor") or {}).get("pool") or {}
    for key in ("in_use", "live", "capacity"):
        if isinstance(pool.get(key), (int, float)):
            out[f"sandbox_{key}"] = float(pool[key])
    return out


class UsageSampler:
    """Samples utilisation into `RUN_DIR/usage.jsonl` (see the module docstring)."""

    def __init__(self, run_dir: Path, probe: Probe | None = None, interval: float = 2.0) -> None:
        self.path = Path(run_dir) / USAGE_LOG
        self.probe = probe
        self.interval = interval
        self._cpu = sum(os.times()[:2])
        self._wall = time.monotonic()
        self.cores = os.cpu_count() or 1

    def sample(self) -> dict[str, Any]:
        """One sample; CPU is the share of one core used since the previous sample."""
        cpu, wall = sum(os.times()[:2]), time.monotonic()
        record: dict[str, Any] = {"t": time.time(),
                                  "cpu_process_pct": 100 * (cpu - self._cpu)
                                  / max(wall - self._wall, 1e-6),
                                  "load_pct": 100 * os.getloadavg()[0] / self.cores,
                                  "cores": self.cores}
        self._cpu, self._wall = cpu, wall
        rss = _rss_mb()
        if rss is not None:
            record["rss_mb"] = rss
        gpu = gpu_sample()
        if gpu:
            record.update(gpu)
        else:  # said once per sample: the report shows why its GPU chart is empty
            record["gpu_absent"] = gpu_absent_reason()
        if self.probe is not None:
            try:
                record.update(sandbox_sample(self.probe()))
            except Exception as exc:  # noqa: BLE001  (a stats bug must not stop training)
                log.debug("usage: runner stats failed: %s", exc)
        return record

    def write(self) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(self.sample()) + "\n")

    async def run(self) -> None:
        """Sample every `interval` seconds until cancelled (a sample is appended first)."""
        while True:
            await asyncio.to_thread(self.write)
            await asyncio.sleep(self.interval)
