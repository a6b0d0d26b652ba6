"""Datasets: list, JSONL, generator, procedural, Hugging Face; typed tasks; stable splits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import corral as cr
from corral.errors import DatasetError


class Pair(cr.Task):
    a: int
    b: int


def test_task_ids_are_content_hashes() -> None:
    assert Pair(a=1, b=2).id == Pair(b=2, a=1).id
    assert Pair(a=1, b=2).id != Pair(a=1, b=3).id
    assert Pair(a=1, b=2, id="mine").id == "mine"
    task = cr.Task(prompt="x", extra=[1])
    assert task["prompt"] == "x" and task.get("missing", 7) == 7


def test_sources(tmp_path: Path) -> None:
    rows = [{"a": i, "b": i * 2} for i in range(5)]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    from_list = cr.Dataset.from_list(rows, Pair)
    from_jsonl = cr.Dataset.from_jsonl(path, Pair)
    from_gen = cr.Dataset.from_generator(lambda: iter(rows), task_type=Pair)
    assert [t.id for t in from_list] == [t.id for t in from_jsonl] == [t.id for t in from_gen]
    assert from_jsonl[4].b == 8 and len(from_gen) == 5
    assert cr.Dataset.from_generator((r for r in rows), limit=2, task_type=Pair)[-1].a == 1


def test_from_hf_split() -> None:
    import datasets
    hf = datasets.Dataset.from_dict({"a": [1, 2, 3], "b": [4, 5, 6]})
    ds = cr.Dataset.from_hf(hf, task_type=Pair)
    assert len(ds) == 3 and ds[2] == Pair(a=3, b=6)


def test_procedural_is_deterministic_and_lazy() -> None:
    calls = []

    def make(rng, i):
        calls.append(i)
        return {"a": rng.randint(0, 10**6), "b": i}

    ds = cr.Dataset.procedural(make, size=10**9, seed=7, task_type=Pair)
    assert len(ds) == 10**9 and calls == []
    first = ds[123_456_789]
    again = cr.Dataset.procedural(make, size=10**9, seed=7, task_type=Pair)[123_456_789]
    other_seed = cr.Dataset.procedural(make, size=10**9, seed=8, task_type=Pair)[123_456_789]
    assert first == again and first.a != other_seed.a


def test_splits_are_stable_and_disjoint() -> None:
    rows = [{"a": i, "b": 0} for i in range(400)]
    ds = cr.Dataset.from_list(rows, Pair)
    train, test = ds.split("train", 0.25), ds.split("test", 0.25)
    assert len(train) + len(test) == 400 and 60 < len(test) < 140
    test_ids = {t.id for t in test}
    assert not test_ids & {t.id for t in train}
    grown = cr.Dataset.from_list(rows + [{"a": -i, "b": 1} for i in range(1, 100)], Pair)
    assert test_ids <= {t.id for t in grown.split("test", 0.25)}
    assert ds.fingerprint() == cr.Dataset.from_list(list(rows), Pair).fingerprint()


def test_bad_input_names_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1, "b": 2}\n{"a": oops}\n')
    with pytest.raises(DatasetError, match=r"bad.jsonl:2: invalid JSON"):
        cr.Dataset.from_jsonl(path)
    with pytest.raises(DatasetError, match="no such tasks file"):
        cr.Dataset.from_jsonl(tmp_path / "missing.jsonl")
    with pytest.raises(DatasetError, match=r"task 0: field 'b': Input should be a valid integer"):
        cr.Dataset.from_list([{"a": 1, "b": "x"}], Pair)[0]
    with pytest.raises(DatasetError, match="unknown split 'dev'"):
        cr.Dataset.from_list([]).split("dev")


def test_a_tasks_file_that_is_not_json_objects_in_utf8_names_file_and_line(tmp_path: Path
                                                                          ) -> None:
    """A tasks file in another encoding, or a line that is a list or a string, is refused when
    the env is declared, naming the file (and line): it was a bare `UnicodeDecodeError`, or
    "task 1 is a list, expected a dict" at the first run, naming no file. A BOM is skipped."""
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(b'{"a": 1, "b": 2}\n{"a": "\xff"}\n')
    with pytest.raises(DatasetError, match=r"tasks.jsonl:2: not UTF-8 \(byte 0xff\)"):
        cr.Dataset.from_jsonl(path)
    path.write_text('{"a": 1, "b": 2}\n[1, 2]\n')
    with pytest.raises(DatasetError, match=r"tasks.jsonl:2: a task is a JSON object of fields, "
                                           r"got list \[1, 2\]"):
        cr.Dataset.from_jsonl(path)
    path.write_bytes(b'\xef\xbb\xbf{"a": 1, "b": 2}\n')
    assert cr.Dataset.from_jsonl(path, Pair)[0].a == 1
    with pytest.raises(DatasetError, match="not a file"):
        cr.Dataset.from_jsonl(tmp_path)
