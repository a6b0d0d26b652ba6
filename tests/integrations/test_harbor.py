"""Harbor import: a task directory written from the public format imports and validates; bad
input fails naming the file and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

import corral as cr
from corral.errors import DatasetError, ImageBuildError, ImageNotFound
from corral.registry.validate import validate

from harbor_tasks import answer_task, count_words_task


@pytest.fixture(scope="module")
def harbor_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("harbor") / "mini-bench"
    count_words_task(root / "count-words")
    answer_task(root / "answer")
    return root


def test_load_reads_the_public_format(harbor_dir: Path) -> None:
    envs = cr.load_harbor(harbor_dir, namespace="hbtest")
    assert set(envs) == {"hbtest/count-words-v0", "hbtest/answer-v0", "hbtest/mini-bench-v0"}
    assert len(cr.make("hbtest/mini-bench-v0").tasks) == 2  # the family holds every task
    env = cr.make("hbtest/count-words-v0")
    task = env.tasks[0]
    assert env.instruction(task).startswith("Count the words in /app/data/words.txt")
    spec = env.sandbox_for(task)
    assert spec.dockerfile.endswith("count-words/environment/Dockerfile")
    assert (spec.workdir, spec.memory, spec.cpus, spec.network) == ("/app", "768m", 1.0, False)
    assert env.time_limit(task) == 120.0
    ht = env.harbor_task(task)
    assert ht.config.verifier.timeout_sec == 45.0 and ht.config.metadata["difficulty"] == "easy"
    assert cr.spec("hbtest/count-words-v0").tags == ["terminal", "harbor", "wc", "files"]
    answer = cr.make("hbtest/answer-v0")
    assert answer.sandbox_for(answer.tasks[0]).image == "corral/base:bookworm"
    assert [c.arguments["command"] for c in answer.solution(answer.tasks[0])][1] == \
        "bash /solution/solve.sh"


async def test_harbor_family_validates_on_docker(harbor_dir: Path, sandboxes: str) -> None:
    cr.load_harbor(harbor_dir, namespace="hbtest")
    report = await validate("hbtest/mini-bench-v0", backend="docker", run_id=sandboxes)
    assert report.ok, [(t.summary, t.problem) for t in report.failures]
    assert report.tasks_checked == 2 and report.oracle_pass_rate == 1.0
    assert report.noop_pass_rate == 0.0
    assert {t.oracle.rewards["tests"] for t in report.tasks} == {1.0}


async def test_harbor_task_validates_on_bwrap(harbor_dir: Path, sandboxes: str) -> None:
    cr.load_harbor(harbor_dir, namespace="hbtest")
    report = await validate("hbtest/answer-v0", backend="bwrap", run_id=sandboxes)
    assert report.ok and report.backend == "bwrap", [t.problem for t in report.failures]


# --- bad input ------------------------------------------------------------------------------------
def test_task_toml_with_a_wrong_type(tmp_path: Path) -> None:
    from harbor_tasks import COUNT_TOML

    task = count_words_task(tmp_path / "t", **{
        "task.toml": COUNT_TOML.replace("timeout_sec = 45.0", 'timeout_sec = "fast"')})
    with pytest.raises(DatasetError) as err:
        cr.load_harbor(task, register=False)
    message = str(err.value)
    assert str(task / "task.toml") in message and "[verifier] timeout_sec" in message
    assert "'fast'" in message


def test_missing_tests_folder(tmp_path: Path) -> None:
    task = answer_task(tmp_path / "t")
    for path in sorted((task / "tests").iterdir()):
        path.unlink()
    (task / "tests").rmdir()
    with pytest.raises(DatasetError, match=r"/t/tests: missing folder"):
        cr.load_harbor(task, register=False)


@pytest.mark.parametrize("where", ["tests/evil", "solution/evil", "instruction.md",
                                   "environment/Dockerfile", "tests/dir"])
def test_a_link_out_of_the_task_folder_is_refused(tmp_path: Path, where: str) -> None:
    """A task's files are read on the host: a link out of its folder would carry a host file
    (here this test's own secret) into the sandbox's tests, the oracle or the instruction."""
    secret = tmp_path / "secret"
    secret.write_text("FROM host-secret\n")
    task = count_words_task(tmp_path / "t")
    link = task / where
    link.unlink(missing_ok=True)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(tmp_path if where == "tests/dir" else secret)
    with pytest.raises(DatasetError) as err:
        cr.load_harbor(task, register=False)
    assert f"{link}: a link to {link.resolve()}, outside the task folder" in str(err.value)
    (task / "tests" / "loop").symlink_to("loop")
    link.unlink()
    if where == "instruction.md":
        link.write_text("Count the words.\n")
    if where == "environment/Dockerfile":
        link.symlink_to(task / "environment" / "Dockerfile.real")
        (task / "environment" / "Dockerfile.real").write_text("FROM corral/base:bookworm\n")
    with pytest.raises(DatasetError, match="loop: a link that leads to itself"):
        cr.load_harbor(task, register=False)
    (task / "tests" / "loop").unlink()
    (task / "tests" / "inside").symlink_to("test.sh")  # a link within the folder is fine
    env = cr.load_harbor(task, register=False)["harbor/t-v0"]
    assert "inside" in env.harbor_tasks["t"].tests


def test_broken_dockerfile_is_named_at_import(tmp_path: Path) -> None:
    task = count_words_task(tmp_path / "t", **{
        "environment/Dockerfile": "FROM corral/base:bookworm\nRUN true\nCOPPY a b\n"})
    with pytest.raises(DatasetError) as err:
        cr.load_harbor(task, register=False)
    assert f"{task / 'environment' / 'Dockerfile'}:3: unknown instruction 'COPPY'" in str(err.value)


async def test_failing_build_and_missing_images(tmp_path: Path, sandboxes: str) -> None:
    broken = count_words_task(tmp_path / "broken-build", **{
        "environment/Dockerfile": "FROM corral/base:bookworm\nRUN echo building && exit 7\n"})
    remote = count_words_task(tmp_path / "remote-base", **{
        "environment/Dockerfile": "FROM ubuntu:24.04\nWORKDIR /app\n"})
    missing = answer_task(tmp_path / "missing-image", **{
        "task.toml": '[environment]\ndocker_image = "corral/not-built:1"\n'})
    for path in (broken, remote, missing):
        cr.load_harbor(path, namespace="hbbad")

    env = cr.make("hbbad/broken-build-v0", run_id=sandboxes)
    with pytest.raises(ImageBuildError) as err:
        await env.areset()
    assert str(broken / "environment" / "Dockerfile") in str(err.value)
    assert "build failed" in str(err.value) and "exit 7" in str(err.value)

    env = cr.make("hbbad/remote-base-v0", run_id=sandboxes)
    with pytest.raises(ImageBuildError, match=r"FROM ubuntu:24.04 is not present locally"):
        await env.areset()

    env = cr.make("hbbad/missing-image-v0", run_id=sandboxes)
    with pytest.raises(ImageNotFound, match=r"docker build -t corral/not-built:1 \."):
        await env.areset()
    report = await validate("hbbad/missing-image-v0", run_id=sandboxes)  # recorded, not raised
    assert not report.ok and report.infra_errors == 2
    assert "ImageNotFound" in report.tasks[0].problem
