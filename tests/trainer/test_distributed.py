"""Data-parallel training (`corral train --nproc`, torchrun): two gloo ranks with FSDP2 on CPU.
A real `--nproc 2` run has rank 1 killed mid-run (the run stops with a clear error, no hang)
and is resumed (the step log continues), then resumed by one process and again by two; its
stored batches are then replayed through one `Trainer` and through two torchrun ranks (the same
loss curve), a resume from the ranks' sharded checkpoint continues bitwise, and a checkpoint
resumed with the other number of processes continues that number's curve.

Real processes throughout: the CLI's own launcher, torchrun, torch.distributed over gloo.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from corral.errors import CorralError
from corral.trainer import checkpoint as ckpt

HERE = Path(__file__).parent
ENVS_FILE = str(HERE.parent / "support" / "train_envs.py")
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
    with pytest.raises(CorralError, match="shards/"):  # not the one-process layout
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


def test_cli_resumes_with_another_nproc(killed_and_resumed, tmp_path):
    """A copy of the `--nproc 2` run resumed by `corral train --resume` in one process, then
    that one-process checkpoint by `--nproc 2`: each continues the step log and writes its own
    kind of checkpoint."""
    run = tmp_path / "run"
    shutil.copytree(killed_and_resumed["run"], run)
    command = [*CLI, "--run-dir", str(run), "--checkpoint-every", "1", "--resume"]
    target = killed_and_resumed["target"]
    temp = tmp_path / "temp"
    temp.mkdir()
    for steps, nproc, world in ((target + 1, 1, None), (target + 2, 2, 2)):
        done = subprocess.run([*command, "--steps", str(steps), "--nproc", str(nproc)],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "TMPDIR": str(temp)})
        assert done.returncode == 0, done.stderr[-3000:]
        assert list(temp.iterdir()) == []  # the launcher's rank folders went with it
        assert [r["step"] for r in records(run)] == list(range(steps))
        state = ckpt.read_json_state(run / "checkpoint")
        assert state["step"] == steps and state.get("world_size") == world
        assert (run / "checkpoint" / ("shards" if world else "optimizer.pt")).exists()


def test_a_lora_checkpoint_is_not_resumed_by_ranks(tmp_path):
    """The one combination that cannot resume with several ranks (they do not train LoRA): a
    one-process LoRA run's checkpoint, refused in one line naming --nproc and its world size."""
    from corral.trainer.distributed import DistContext, DistributedTrainer

    ckpt.write_state(tmp_path, {"step": 3, "version": 3, "config": {}})
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "adapter_config.json").write_text("{}")
    ctx = DistContext(rank=0, world_size=2, device=torch.device("cpu"), control=None,
                      timeout_s=1.0)
    with pytest.raises(CorralError, match=r"LoRA adapter .*world_size 1.* --nproc 2 .*without "
                       r"--nproc$"):
        DistributedTrainer.resume(tmp_path, torch.nn.Linear(2, 2), ctx=ctx)


@pytest.fixture(scope="module")
def replays(killed_and_resumed, tmp_path_factory) -> dict[str, Any]:
    """The run's first 4 stored batches replayed uninterrupted in one process (`one`) and as
    two torchrun ranks (`two`), each checkpointed at step 2 (`ck1`, `ck2`); `ck2` resumed by
    two ranks (`two_from_two`) and by one process (`one_from_two`, and `one_fresh_from_two`
    with the optimizer state dropped: a control), `ck1` by two ranks (`two_from_one`). Each
    result: the OUT.json of dp_replay and its final weights."""
    import dp_replay  # beside this file (pytest puts the folder on sys.path)

    source = str(killed_and_resumed["run"])
    assert len(dp_replay.batches(Path(source), 2)) >= 4, "the run should yield 4 batches"
    tmp = tmp_path_factory.mktemp("replay")
    ck1, ck2 = tmp / "ck1", tmp / "ck2"
    plan = [("one", False, ["--save-at", "2", "--checkpoint", str(ck1)]),
            ("two", True, ["--save-at", "2", "--checkpoint", str(ck2)]),
            ("two_from_two", True, ["--resume", str(ck2)]),
            ("one_from_two", False, ["--resume", str(ck2)]),
            ("one_fresh_from_two", False, ["--resume", str(ck2), "--reset-optimizer"]),
            ("two_from_one", True, ["--resume", str(ck1)])]
    results: dict[str, Any] = {"ck1": ck1, "ck2": ck2}
    for name, ranks, extra in plan:
        args = [source, str(tmp / f"{name}.json"), "--steps", "4",
                "--weights", str(tmp / f"{name}.safetensors"), *extra]
        if ranks:
            done = subprocess.run([*TORCHRUN, REPLAY, *args], capture_output=True, text=True,
                                  timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]
        else:
            dp_replay.main(args)
        results[name] = {**json.loads((tmp / f"{name}.json").read_text()),
                         "tensors": load_file(str(tmp / f"{name}.safetensors"))}
    return results


def test_same_batches_same_curve_and_bitwise_resume(replays):
    """The run's stored batches through a `Trainer` and through two torchrun ranks: the same
    loss curve; a resume from the ranks' sharded checkpoint gives bitwise the same steps and
    final weights as the uninterrupted ranks."""
    one, two, resumed, ck = (replays[k] for k in ("one", "two", "two_from_two", "ck2"))
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


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """The same tensors up to float rounding (see `close`)."""
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6)
                                        for k in a)


@pytest.mark.parametrize("resumed, uninterrupted", [("one_from_two", "one"),
                                                    ("two_from_one", "two")])
def test_resume_with_another_nproc_continues_that_curve(replays, resumed, uninterrupted):
    """A 2-rank checkpoint resumed by one process, a one-process checkpoint by 2 ranks: steps
    2-3 and the final weights are the uninterrupted run's at the new N up to float rounding,
    which needs the optimizer state too (a fresh AdamW moves every weight by about lr)."""
    got, want = replays[resumed], replays[uninterrupted]
    assert [r["step"] for r in got["records"]] == [2, 3]
    assert all(r["applied"] for r in got["records"])
    for a, b in zip(got["records"], want["records"][2:], strict=True):
        assert close(a["loss"], b["loss"]) and close(a["grad_norm"], b["grad_norm"]), (a, b)
    assert same_weights(got["tensors"], want["tensors"])
    # the tolerance sees a lost optimizer state: the same resume with it dropped differs
    assert not same_weights(replays["one_fresh_from_two"]["tensors"], replays["one"]["tensors"])


LOSE_RANK_0 = """
import os
import torch.distributed as dist
from corral.trainer import distributed
ctx = distributed.init()
# both ranks fully connected first: a peer that vanishes while gloo is still connecting the
# mesh aborts the other process inside gloo (std::terminate), which is not what this tests
dist.barrier(group=ctx.control)
if ctx.rank == 0:
    os._exit(0)  # gone without a word, as a killed process
try:
    distributed.follow(ctx, None)
except Exception as exc:
    print(type(exc).__name__, exc, flush=True)
    # os._exit: the interpreter's teardown would join gloo's threads, still tied to the dead
    # peer, and sometimes abort in C++ (std::terminate, exit -6) after the error was reported
    os._exit(3)
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
