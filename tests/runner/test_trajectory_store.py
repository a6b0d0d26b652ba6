"""The trajectory store: crash safety (SIGKILL mid-run, then resume), torn lines, cursors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corral.runner import AssemblyConfig, Runner, ScriptedPolicy, Trajectory, TrajectoryStore
from corral.runner.store import StoreMismatch, load_run

from runner_helpers import arithmetic_solver

HERE = Path(__file__).parent
WORKER = HERE / "collect_worker.py"


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True) if path.exists() else []


def _worker(run_dir: Path, n: int, group: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, str(WORKER), str(run_dir), str(n), str(group)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_sigkilled_collector_resumes_without_loss_or_duplicates(tmp_path: Path) -> None:
    run_dir, n, group = tmp_path / "run", 40, 2
    store = run_dir / "trajectories.jsonl"
    proc = _worker(run_dir, n, group)
    deadline = time.monotonic() + 120
    while sum(line.endswith(b"\n") for line in _lines(store)) < 8:  # wait until mid-run
        assert proc.poll() is None, proc.stdout.read().decode()  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the collector stored nothing in 120 s"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = b"".join(line for line in _lines(store) if line.endswith(b"\n"))
    stored_before = len(before.splitlines())
    assert 8 <= stored_before < n, "the kill must land mid-run"

    resumed = _worker(run_dir, n, group)
    out, _ = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, out.decode()

    after = store.read_bytes()
    assert after.startswith(before)  # what was stored is kept as it was
    ids = [json.loads(line)["id"] for line in after.splitlines()]
    expected = {f"g{g:06d}-s{s:03d}" for g in range(n // group) for s in range(group)}
    assert len(ids) == len(set(ids)) == n and set(ids) == expected
    manifest, trajectories = load_run(run_dir)
    assert manifest["resumes"] == 1 and len(trajectories) == n


def test_torn_last_line_is_cut_and_writing_continues(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    store.open({"seed": 1})
    store.append_sync([Trajectory(id="a", env_id="e", task_id="t", group_id="g")])
    store.close()
    with open(tmp_path / "trajectories.jsonl", "ab") as fh:
        fh.write(b'{"id": "b", "env_id": "e", "tas')  # a crash in the middle of a write
    again = TrajectoryStore(tmp_path)
    assert [t.id for t in again.open({"seed": 1})] == ["a"]
    assert again.append_sync([Trajectory(id="b", env_id="e", task_id="t", group_id="g"),
                              Trajectory(id="a", env_id="e", task_id="t", group_id="g")]) == 1
    again.close()
    assert [t.id for t in load_run(tmp_path)[1]] == ["a", "b"]
    with pytest.raises(StoreMismatch, match="seed=1"):
        TrajectoryStore(tmp_path).open({"seed": 2})


def test_a_recorded_group_size_must_match_on_resume(tmp_path: Path) -> None:
    """`record(group=...)` keeps the size a collection used; a resume that reopens the store
    keeps it, and another size is a `StoreMismatch` that writes nothing."""
    store = TrajectoryStore(tmp_path)
    store.open({"seed": 0})
    store.record(group=4)
    store.close()
    again = TrajectoryStore(tmp_path)
    again.open({"seed": 0})  # the runner's config has no group: the recorded one stays
    again.record(group=4)  # the same size again is fine
    before = (tmp_path / "manifest.json").read_text()
    with pytest.raises(StoreMismatch, match="group=4, not 2") as err:
        again.record(group=2)
    assert (err.value.key, err.value.recorded, err.value.given) == ("group", 4, 2)
    assert (tmp_path / "manifest.json").read_text() == before
    assert json.loads(before)["config"]["group"] == 4
    again.close()


async def test_a_runner_resumed_with_another_group_size_is_refused(tmp_path: Path) -> None:
    """`corral train` and the Python API resume through the Runner: its `batches` records the
    group size and a resume's `collect` with another one is refused before launching work."""
    async with Runner(["corral/arithmetic-v0"], ScriptedPolicy(arithmetic_solver),
                      run_dir=tmp_path, assembly=AssemblyConfig(filter_zero_variance=False)) as r:
        [batch] = [b async for b in r.batches(size=4, group=2, max_batches=1)]
    assert json.loads((tmp_path / "manifest.json").read_text())["config"]["group"] == 2
    async with Runner(["corral/arithmetic-v0"], ScriptedPolicy(arithmetic_solver),
                      run_dir=tmp_path) as resumed:
        with pytest.raises(StoreMismatch, match="group=2, not 3"):
            await resumed.collect(3, group=3)
        assert resumed.counts["launched"] == 0


async def test_resumed_batches_skip_consumed_groups_and_reuse_stored_work(tmp_path: Path) -> None:
    first_policy = ScriptedPolicy(arithmetic_solver)
    async with Runner(["corral/arithmetic-v0"], first_policy, run_dir=tmp_path, seed=3,
                      assembly=AssemblyConfig(filter_zero_variance=False)) as runner:
        first = [b async for b in runner.batches(size=4, group=2, max_batches=2)]
        launched = runner.counts["launched"]
    consumed = {t.group_id for b in first for t in b.trajectories}
    stored = {t.id for t in load_run(tmp_path)[1]}
    assert len(consumed) == 4 and len(stored) >= 8

    second_policy = ScriptedPolicy(arithmetic_solver)
    async with Runner(["corral/arithmetic-v0"], second_policy, run_dir=tmp_path, seed=3,
                      assembly=AssemblyConfig(filter_zero_variance=False)) as runner:
        [batch] = [b async for b in runner.batches(size=4, group=2, max_batches=1)]
        resumed = runner.counts["resumed"]
    assert not consumed & {t.group_id for t in batch.trajectories}
    assert batch.stats["index"] == 2
    # work stored but not yet consumed is reused, not generated again
    assert resumed == len(stored) - 8 and resumed <= launched
    regenerated = {s.split("#")[0] for s in second_policy.stats.sessions}
    assert not regenerated & stored


async def test_stored_infra_errors_run_again_on_resume_and_load_once(tmp_path: Path) -> None:
    from corral.errors import PolicyError
    from corral.runner import Status

    doomed = ("g000001-s000", "g000002-s001")

    def flaky(call):  # the first run's server fails these samples on every attempt
        if call.request.session_id.startswith(doomed):
            raise PolicyError("replica answered HTTP 503")
        return arithmetic_solver(call)

    quick = AssemblyConfig(retries=1, retry_backoff=0.01, retry_backoff_max=0.01)
    async with Runner(["corral/arithmetic-v0"], ScriptedPolicy(flaky), run_dir=tmp_path,
                      seed=4, assembly=quick) as runner:
        first = await runner.collect(8, group=2)
    assert sorted(t.id for t in first if t.status is Status.INFRA_ERROR) == list(doomed)
    assert all(t.attempts == 2 for t in first if t.id in doomed)

    healed = ScriptedPolicy(arithmetic_solver)
    async with Runner(["corral/arithmetic-v0"], healed, run_dir=tmp_path, seed=4,
                      assembly=quick) as runner:
        second = await runner.collect(8, group=2)
        assert runner.counts["resumed"] == 6  # only the infra errors ran again
    assert {s.split("#")[0] for s in healed.stats.sessions} == set(doomed)
    assert all(t.status is not Status.INFRA_ERROR for t in second)
    lines = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_bytes()
             .splitlines()]
    assert len(lines) == 10  # the infra errors are kept on disk, as history
    _, loaded = load_run(tmp_path)
    assert len(loaded) == len({t.id for t in loaded}) == 8
    assert all(t.status is not Status.INFRA_ERROR for t in loaded)
