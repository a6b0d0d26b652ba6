"""Data-parallel training (`corral train --nproc`, torchrun): two gloo ranks with FSDP2 on CPU.
A real `--nproc 2` run has rank 1 killed mid-run (the run stops with a clear error, no hang)
and is resumed (the step log continues); its stored batches are then replayed through one
`Trainer` and through two torchrun ranks (the same loss curve), and a resume from the ranks'
sharded checkpoint continues bitwise.

Real processes throughout: the CLI's own launcher, torchrun, torch.distributed over gloo.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from corral.errors import CorralError
from corral.trainer import checkpoint as ckpt

HERE = Path(__file__).parent
ENVS_FILE = str(HERE / "train_envs.py")
REPLAY = str(HERE / "dp_replay.py")
CLI = [sys.executable, "-m", "corral.cli", "-i", ENVS_FILE, "train", "-e", "traintest/digits-v0",
       "--batch", "8", "--group", "4", "--lr", "1e-3", "--max-tokens", "8", "--async-level", "0"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", "2"]


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "train.jsonl").read_text().splitlines()]


def close(a: float, b: float) -> bool:
    """Equal up to float rounding (summation order across ranks, sharded norms)."""
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-7)


def _child_with_rank(parent: int, rank: int, timeout: float = 180) -> int:
    """The pid of the launcher's child process that runs `rank` (from its environment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                env = (entry / "environ").read_bytes().split(b"\0") if ppid == parent else []
            except (OSError, ValueError, IndexError):
                continue
            if f"RANK={rank}".encode() in env:
                return int(entry.name)
        time.sleep(0.2)
    raise AssertionError(f"no rank {rank} under pid {parent}")


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory) -> dict[str, Any]:
    """`corral train --nproc 2`, rank 1 SIGKILLed after the first checkpoint, then `--resume`
    (the run directory and what each part returned)."""
    run = tmp_path_factory.mktemp("dp") / "run"
    command = [*CLI, "--nproc", "2", "--run-dir", str(run), "--checkpoint-every", "1"]
    proc = subprocess.Popen([*command, "--steps", "40"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    state = run / "checkpoint" / "trainer_state.json"
    try:
        rank1 = _child_with_rank(proc.pid, 1)
        while not state.exists():  # wait on the run's own progress: a checkpoint exists
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            time.sleep(0.2)
        os.kill(rank1, signal.SIGKILL)
        killed_at = time.monotonic()
        stderr = proc.communicate(timeout=120)[1]  # the ranks stop: no hang
        stop_s = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    saved = ckpt.read_json_state(run / "checkpoint")
    target = saved["step"] + 3
    resumed = subprocess.run([*command, "--steps", str(target), "--resume"],
                             capture_output=True, text=True, timeout=400)
    return {"run": run, "code": proc.returncode, "stderr": stderr, "stop_s": stop_s,
            "saved": saved, "target": target, "resumed": resumed}


def test_killed_rank_stops_the_run_and_resume_continues(killed_and_resumed):
    """SIGKILL on rank 1 stops rank 0 too, within seconds, with a one-line error naming the
    rank; `--resume` continues from the sharded checkpoint; rank 0 alone writes the log."""
    k = killed_and_resumed
    assert k["code"] != 0 and k["stop_s"] < 60
    assert any("rank 1" in line and "SIGKILL" in line and "--resume" in line
               for line in k["stderr"].splitlines()), k["stderr"][-3000:]
    saved, run = k["saved"], k["run"]
    assert saved["world_size"] == 2 and saved["step"] >= 1
    with pytest.raises(CorralError, match="--nproc N --resume"):  # one process cannot
        ckpt.read_state(run / "checkpoint")
    assert k["resumed"].returncode == 0, k["resumed"].stderr[-3000:]
    steps = [r["step"] for r in records(run)]
    assert steps == list(range(k["target"])), steps  # no gap, no duplicate: rank 0 alone logs
    versions = [r["version"] for r in records(run)]
    assert versions == sorted(versions) and versions[-1] > saved["version"]
    assert ckpt.read_json_state(run / "checkpoint")["step"] == k["target"]
    # rank 0's gathered full weights load into a one-process model: the trained ones
    from corral.runner import load_model

    model, _ = load_model("tiny")
    before = {name: value.clone() for name, value in model.state_dict().items()}
    ckpt.load_weights_into(model, run / "checkpoint")
    after = model.state_dict()
    assert any(not torch.equal(before[name], after[name]) for name in before)
    assert all(torch.isfinite(value).all() for value in after.values())


def test_same_batches_same_curve_and_bitwise_resume(killed_and_resumed, tmp_path):
    """The run's stored batches through a `Trainer` and through two torchrun ranks: the same
    loss curve; a resume from the ranks' sharded checkpoint gives bitwise the same steps and
    final weights as the uninterrupted ranks."""
    import dp_replay  # tests/train is on sys.path (conftest)

    source = killed_and_resumed["run"]
    assert len(dp_replay.batches(source, 2)) >= 4, "the run should yield 4 batches"
    out1, out2, out3 = (tmp_path / f"r{i}.json" for i in (1, 2, 3))
    ck = tmp_path / "ck"
    dp_replay.main([str(source), str(out1), "--steps", "4"])  # one process: a Trainer
    for command in ([*TORCHRUN, REPLAY, str(source), str(out2), "--steps", "4", "--save-at",
                     "2", "--checkpoint", str(ck)],
                    [*TORCHRUN, REPLAY, str(source), str(out3), "--steps", "4", "--resume",
                     str(ck)]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    one, two, resumed = (json.loads(p.read_text()) for p in (out1, out2, out3))
    assert [r["step"] for r in two["records"]] == [0, 1, 2, 3]
    assert all(r["applied"] for r in one["records"] + two["records"])
    for a, b in zip(one["records"], two["records"], strict=True):
        assert close(a["loss"], b["loss"]) and close(a["grad_norm"], b["grad_norm"]), (a, b)
    assert len({r["grad_norm"] for r in one["records"]}) == 4  # a curve, not a constant
    # the checkpoint: sharded states of both ranks, full weights from rank 0
    assert sorted(p.name for p in (ck / "shards").glob("*.distcp")) == ["__0_0.distcp",
                                                                       "__1_0.distcp"]
    assert sorted(p.name for p in (ck / "rng").iterdir()) == ["rank0.pt", "rank1.pt"]
    assert ckpt.read_json_state(ck)["world_size"] == 2
    assert resumed["records"] == two["records"][2:]  # bitwise: == on floats
    assert resumed["weights"] == two["weights"]


LOSE_RANK_0 = """
import os, sys
from corral.trainer import distributed
ctx = distributed.init()
if ctx.rank == 0:
    os._exit(0)  # gone without a word, as a killed process
try:
    distributed.follow(ctx, None)
except Exception as exc:
    print(type(exc).__name__, exc)
    sys.exit(3)
"""


def test_a_rank_that_loses_rank_0_stops_with_a_clear_error(unused_tcp_port):
    """Without a launcher to stop it (other nodes' ranks), a follower whose rank 0 vanished
    fails its next collective at once with one line, instead of hanging."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(unused_tcp_port),
           "WORLD_SIZE": "2", "CORRAL_DIST_TIMEOUT": "60"}
    started = time.monotonic()
    ranks = [subprocess.Popen([sys.executable, "-c", LOSE_RANK_0], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    assert ranks[0].returncode == 0, outputs[0][1][-2000:]
    assert ranks[1].returncode == 3, outputs[1][1][-2000:]
    assert "CorralError rank 1: lost contact with the other ranks" in outputs[1][0]
    assert "--resume" in outputs[1][0]
    assert time.monotonic() - started < 60  # not the collective timeout
