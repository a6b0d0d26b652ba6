"""Run directories that are damaged or in the way (docs/runner.md, store and resume;
docs/evaluation.md, `corral export`): one clear error naming the file, nothing overwritten."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.errors import CorralError
from corral.runner import Trajectory, TrajectoryStore
from corral.runner.digest import StoreDigest, digest_line
from corral.runner.export import export_run, target_problem
from corral.runner.report import write_report
from corral.runner.store import load_run


def _traj(i: int, **extra: object) -> dict[str, object]:
    data = Trajectory(id=f"g{i:06d}-s000", env_id="corral/arithmetic-v0", task_id=f"t{i}",
                      group_id=f"g{i:06d}",
                      messages=[{"role": "user", "content": "1 + 1?"},
                                {"role": "assistant", "content": "2"}]).to_dict()
    data.update(extra)
    return data


def _run_dir(root: Path, *lines: object, manifest: object = None) -> Path:
    root.mkdir(parents=True)
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    (root / "trajectories.jsonl").write_text(text)
    if manifest is not None:
        (root / "manifest.json").write_text(manifest if isinstance(manifest, str)
                                            else json.dumps(manifest))
    return root


@pytest.mark.parametrize("manifest", ["{not json", "[1, 2]", '{"config": [1]}',
                                      '{"config": {}, "cursor": 5}',
                                      '{"cursor": {"consumed_groups": "g000001"}}'])
def test_a_broken_manifest_is_named_and_left_as_it_is(tmp_path: Path, manifest: str) -> None:
    run = _run_dir(tmp_path / "run", _traj(0), manifest=manifest)
    for attempt in (lambda: TrajectoryStore(run).open({"seed": 0}), lambda: load_run(run),
                    lambda: write_report(run)):
        with pytest.raises(CorralError, match="manifest.json: not a run manifest"):
            attempt()
    assert (run / "manifest.json").read_text() == manifest  # not overwritten on the way


def test_a_directory_in_place_of_a_run_file_is_named(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "manifest.json").mkdir(parents=True)
    with pytest.raises(CorralError, match="manifest.json: cannot read the run manifest"):
        load_run(run)
    other = tmp_path / "other"
    (other / "trajectories.jsonl").mkdir(parents=True)
    with pytest.raises(CorralError, match="trajectories.jsonl: cannot read the trajectory store"):
        load_run(other)
    with pytest.raises(CorralError, match=f"run directory {other}: cannot write"):
        TrajectoryStore(other).open({"seed": 0})


def test_lines_that_are_not_trajectories_are_skipped_and_kept(tmp_path: Path) -> None:
    """A JSON list, a record without its ids, bytes that are not UTF-8 and an export row written
    over the store were a TypeError or UnicodeDecodeError for collect, export and report."""
    run = _run_dir(tmp_path / "run", [1, 2], {"id": "g000009-s000"}, "not json",
                   _traj(0), _traj(1, status="no-such-status"),
                   {"messages": [], "tools": "", "id": "g000002-s000", "env_id": "e",
                    "task_id": "t"},
                   _traj(3, a_field_of_a_newer_version=1))
    with open(run / "trajectories.jsonl", "ab") as fh:
        fh.write(b"\xff\xfe\n")
    before = (run / "trajectories.jsonl").read_bytes()
    _, trajectories = load_run(run)
    assert [t.id for t in trajectories] == ["g000000-s000", "g000003-s000"]
    store = TrajectoryStore(run)
    assert {t.id for t in store.open({"seed": 0})} == {"g000000-s000", "g000003-s000"}
    store.close()
    assert (run / "trajectories.jsonl").read_bytes() == before  # skipped lines stay


def test_reports_skip_the_lines_the_store_skips(tmp_path: Path) -> None:
    """A JSON list or number in the store was a TypeError in `digest_line` (the report and the
    live training dashboard); it is skipped like a torn line, by the store's own rule."""
    for raw in (b"[1,2]", b"7", b'"text"', b"null", b'{"id": "g000009-s000"}', b"\xff\xfe"):
        assert digest_line(raw) is None, raw
    run = _run_dir(tmp_path / "run", [1, 2], 7, _traj(0), {"id": "g000009-s000"}, "not json",
                   _traj(1, status="no-such-status"), _traj(3))
    digest = StoreDigest(run)
    assert [t.id for t in digest.update()] == ["g000000-s000", "g000003-s000"]
    assert [t.id for t in load_run(run)[1]] == ["g000000-s000", "g000003-s000"]
    with open(run / "trajectories.jsonl", "a") as fh:  # appended while a dashboard follows it
        fh.write("[3]\n" + json.dumps(_traj(4)) + "\n")
    assert [t.id for t in digest.update()][-1] == "g000004-s000"
    assert "<td>trajectories</td><td>3</td>" in write_report(run).read_text()


def test_a_record_of_the_wrong_shape_is_named(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run", _traj(0, spans=[{"phase": "decode"}]))
    with pytest.raises(CorralError, match="trajectory g000000-s000 cannot be read"):
        load_run(run)
    with pytest.raises(CorralError, match="trajectories.jsonl: trajectory g000000-s000 cannot "
                       "be read"):
        write_report(run)


def test_report_names_a_broken_metrics_file(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run", _traj(0))
    (run / "metrics.json").write_text("[]")
    with pytest.raises(CorralError, match="metrics.json: not the runner's metrics"):
        write_report(run)


@pytest.mark.parametrize("name", ["trajectories.jsonl", "manifest.json", "metrics.json"])
def test_export_never_writes_over_the_runs_own_files(tmp_path: Path, name: str) -> None:
    """`corral export RUN -o RUN/trajectories.jsonl` replaced the run's store with the export."""
    run = _run_dir(tmp_path / "run", _traj(0), manifest={"config": {}})
    (run / "metrics.json").write_text("{}")
    before = (run / name).read_bytes()
    assert "run's own" in (target_problem(run, run / ".." / "run" / name, "jsonl") or "")
    with pytest.raises(CorralError, match="is the run's own"):
        export_run(run, run / name)
    assert (run / name).read_bytes() == before


def test_export_target_of_the_wrong_kind_is_named(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run", _traj(0))
    (tmp_path / "a-file").write_text("x")
    assert "is a directory" in (target_problem(run, tmp_path, "jsonl") or "")
    assert "is a file" in (target_problem(run, tmp_path / "a-file", "hf") or "")
    assert "not a directory" in (target_problem(run, tmp_path / "a-file" / "x.jsonl", "jsonl")
                                 or "")
    assert "run's own directory" in (target_problem(run, run, "hf") or "")
    assert target_problem(run, run / "export.jsonl", "jsonl") is None
    path, rows = export_run(run, tmp_path / "out" / "x.jsonl")
    assert rows == 1 and path.read_text().count("\n") == 1
    assert not list((tmp_path / "out").glob(".*partial"))  # the temporary file was renamed
