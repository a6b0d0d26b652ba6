"""Verifier integrity on the real envs: every built-in terminal env and a Harbor
import pass `validate --adversarial` on both backends; Harbor tasks score only what their
verifier writes, strictly parsed."""

from __future__ import annotations

from pathlib import Path

import pytest

import corral as cr
from corral.agents import Agent, play
from corral.errors import AuthoringError, VerifierError
from corral.registry.validate import validate
from corral.terminal import bash, parse_reward_file
from corral.verify import clean_exec

from harbor_tasks import answer_task, count_words_task

BUILTIN = ["corral/term-files-v0", "corral/term-text-v0", "corral/term-git-v0",
           "corral/term-python-v0", "corral/term-procs-v0", "corral/term-data-v0"]
backends = pytest.mark.parametrize("backend", ["docker", "bwrap"])

PY_TEST_SH = """#!/bin/bash
python3 - <<'PY'
import json, os
ok = os.path.exists('/root/answer.txt') and open('/root/answer.txt').read().strip() == '42'
json.dump({'reward': 1.0 if ok else 0.0}, open('/logs/verifier/reward.json', 'w'))
PY
"""
NO_ELSE_TEST_SH = ("#!/bin/bash\nif cmp -s /root/answer.txt /tests/expected.txt; then "
                   "echo 1 > /logs/verifier/reward.txt; fi\n")


class Scripted(Agent):
    """Runs fixed bash commands, then says it is done."""

    def __init__(self, name: str, *commands: str) -> None:
        self.name, self._commands = name, list(commands)

    def act(self, env, observation):
        return bash(self._commands.pop(0)) if self._commands else "done"


@backends
@pytest.mark.parametrize("env_id", BUILTIN)
async def test_builtin_env_survives_every_hack(env_id: str, backend: str, sandboxes: str) -> None:
    report = await validate(env_id, backend=backend, limit=1, run_id=sandboxes,
                            adversarial=True)
    assert report.ok and report.hackable == 0 and len(report.hacks) >= 12, \
        [t.problem for t in report.failures]


@backends
async def test_harbor_import_survives_every_hack(backend: str, sandboxes: str,
                                                 tmp_path: Path) -> None:
    envs = cr.load_harbor(count_words_task(tmp_path / "count-words"), namespace="integrity",
                          register=False)
    report = await validate(envs["integrity/count-words-v0"], backend=backend,
                            run_id=sandboxes, adversarial=True)
    assert report.ok and report.hackable == 0, [t.problem for t in report.failures]


@backends
async def test_harbor_verifier_keeps_its_word(backend: str, sandboxes: str,
                                              tmp_path: Path) -> None:
    """Before the verify phase both hacks scored 1.0 (the exit code stood in for the missing
    reward file): now a missing reward file is a verifier error and a replaced python3 is
    tampering."""
    no_else = cr.load_harbor(answer_task(tmp_path / "no-else", **{"tests/test.sh":
                                                                   NO_ELSE_TEST_SH}),
                             namespace="integrity", register=False)["integrity/no-else-v0"]
    prewrite = await play(no_else(backend=backend, run_id=sandboxes), Scripted(
        "prewrite", "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt"))
    assert prewrite.reward == 0.0 and not prewrite.passed
    assert "wrote no /logs/verifier/reward.txt" in prewrite.verifier_error
    py = cr.load_harbor(answer_task(tmp_path / "py-json", **{"tests/test.sh": PY_TEST_SH}),
                        namespace="integrity", register=False)["integrity/py-json-v0"]
    env = py(backend=backend, run_id=sandboxes)
    exit0 = await play(env, Scripted("exit0", "printf '#!/bin/sh\\nexit 0\\n' > "
                                     "/usr/local/bin/python3 && chmod +x /usr/local/bin/python3"))
    assert exit0.reward == 0.0 and not exit0.passed
    assert "/usr/local/bin/python3" in env.episode.state["verifier"]["tampered"]
    assert (await play(py(backend=backend, run_id=sandboxes), "oracle")).passed


# a replaced program that the verify phase's own reset runs (`mkdir`) starts, after the kill,
# a loop that rewrites the reward once the verifier has written it
REWRITING_MKDIR = (
    "f=$(readlink -f $(command -v mkdir)) && cp -p $f /usr/local/lib/.mkdir && printf "
    "'#!/bin/sh\\n(while :; do echo 1 > /logs/verifier/reward.txt; sleep 0.05; done) "
    ">/dev/null 2>&1 &\\nexec /usr/local/lib/.mkdir \"$@\"\\n' > $f")


@backends
async def test_a_replaced_reset_tool_is_tampering(backend: str, sandboxes: str,
                                                  tmp_path: Path) -> None:
    """A replaced tool of the reset (`verify.RESET_TOOLS`) is tampering. Before it was, and
    before the reset ran from the host, this scored 1.0: the reset ran the agent's `mkdir` as
    root after every agent process was killed (it still runs inside where the backend has no
    host-side root)."""
    task = cr.load_harbor(answer_task(tmp_path / "reset"), namespace="integrity",
                          register=False)["integrity/reset-v0"]
    env = task(backend=backend, run_id=sandboxes)
    hacked = await play(env, Scripted("rewriting-mkdir", REWRITING_MKDIR))
    assert hacked.reward == 0.0 and not hacked.passed
    assert "/usr/bin/mkdir" in env.episode.state["verifier"]["tampered"]


@pytest.mark.parametrize("text,name", [("nan", "reward.txt"), ("inf", "reward.txt"),
                                       ("", "reward.txt"), ("1 garbage", "reward.txt"),
                                       ('{"reward": "1"}', "reward.json"), ("[1]", "reward.json"),
                                       ('{"reward": NaN}', "reward.json")])
def test_reward_files_parse_strictly(text: str, name: str) -> None:
    with pytest.raises(VerifierError):
        parse_reward_file(text, name)
    assert parse_reward_file(" 0.5\n", "reward.txt") == 0.5
    assert parse_reward_file('{"a": 1, "b": 0}', "reward.json") == 0.5


@cr.environment("tests/term-out-of-range-v0", tasks=[{"n": 1}], max_turns=2)
class OutOfRange(cr.TerminalEnv):
    """A reward outside the declared 0–1 range: the env's bug, never a number."""

    pass_threshold = 0.5

    def instruction(self, task):
        return "Write a score between 0.5 and 1 into /root/score."

    @cr.reward
    async def score(self, sandbox, task) -> float:
        r = await sandbox.exec("cat /root/score 2>/dev/null || echo 2")
        return float(r.stdout)

    def solution(self, task):
        return [bash("echo 0.6 > /root/score")]


async def test_out_of_range_is_a_verifier_error_and_threshold_counts(sandboxes: str) -> None:
    env = OutOfRange(backend="bwrap", run_id=sandboxes)
    broken = await play(env, "noop")
    assert broken.reward == 0.0 and "outside the declared range" in broken.verifier_error
    partial = await play(env, "oracle")  # 0.6 >= the env's threshold 0.5: solved
    assert partial.passed and partial.reward == pytest.approx(0.6)


# --- verify_in="fresh" ------------------------------------------------------------------------
WORK = "/root/work"
PY_OUT_CHECK = (f"python3 -c \"import sys; sys.exit(open('{WORK}/out.txt').read().strip() != "
                "'hello')\"")


@cr.environment("tests/term-fresh-same-v0", tasks=[{"n": 1}], max_turns=5)
class PoisonableSame(cr.TerminalEnv):
    """Agents may install anything (nothing protected), verified where they worked: a poisoned
    interpreter decides the reward."""

    protected_paths = ()

    def instruction(self, task):
        return f"Write hello into {WORK}/out.txt."

    async def setup(self, sandbox, task):
        assert (await sandbox.exec(f"mkdir -p {WORK}")).ok

    @cr.reward
    async def out(self, sandbox, task) -> float:
        return float((await clean_exec(sandbox, PY_OUT_CHECK, timeout=30)).ok)

    def solution(self, task):
        return [bash(f"echo hello > {WORK}/out.txt")]


@cr.environment("tests/term-fresh-v0", tasks=[{"n": 1}], max_turns=5)
class PoisonableFresh(PoisonableSame):
    """The same task verified in a fresh sandbox that receives only the work folder."""

    verify_in = "fresh"

    def verify_outputs(self, task):
        return [WORK, "/root/never-written.txt"]


@backends
async def test_only_fresh_verification_defeats_a_poisoned_sandbox(backend: str,
                                                                  sandboxes: str) -> None:
    poisons = ["replace-interpreter", "sitecustomize", "pth-file", "preload-library"]
    same = await validate(PoisonableSame, backend=backend, run_id=sandboxes, hacks=poisons,
                          adversarial=True)
    assert {h.agent for h in same.tasks[0].hacked_by} == {f"hack:{p}" for p in poisons}
    fresh = await validate(PoisonableFresh, backend=backend, run_id=sandboxes, hacks=poisons,
                           adversarial=True)
    assert fresh.ok and fresh.hackable == 0 and fresh.hacks_skipped == 0, \
        [t.problem for t in fresh.failures]


class FreshProbe(PoisonableFresh):
    """PoisonableFresh with a zero-weight reward recording what the verifier's sandbox holds."""

    env_id = "tests/term-fresh-probe-v0"
    seen: dict[str, str] = {}

    @cr.reward(weight=0.0)
    async def listing(self, sandbox, task) -> float:
        result = await clean_exec(sandbox, f"ls -A {WORK}; cat /root/stray.txt; "
                                           "head -c 4 /usr/bin/python3 | od -c", timeout=30)
        self.seen["out"] = result.stdout
        return 0.0


@backends
async def test_fresh_sandbox_receives_only_declared_outputs(backend: str,
                                                            sandboxes: str) -> None:
    """A legitimate solution that also replaces python3 (allowed here) passes: the verifier
    runs the fresh sandbox's python3 on the transferred folder, and nothing else crosses."""
    env = FreshProbe(backend=backend, run_id=sandboxes)
    result = await play(env, Scripted(
        "solve-and-poison", f"echo hello > {WORK}/out.txt && mkdir -p {WORK}/sub && "
        f"echo x > {WORK}/sub/deep.txt && echo stray > /root/stray.txt",
        "printf '#!/bin/sh\\nexit 0\\n' > /usr/bin/python3.11"))
    assert result.passed and result.reward == 1.0, result
    assert env.seen["out"].split()[:2] == ["out.txt", "sub"]  # the folder, subfolders included
    assert "stray" not in env.seen["out"] and "E   L   F" in env.seen["out"]  # real python3
    assert env.episode.state["outputs_missing"] == ["/root/never-written.txt"]


def test_an_unknown_verify_in_is_an_authoring_error_when_defined() -> None:
    with pytest.raises(AuthoringError, match="verify_in must be one of .*'fres'"):
        class Typo(cr.TerminalEnv):  # noqa: F841 (defining it is the test)
            verify_in = "fres"
