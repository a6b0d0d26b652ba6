"""External agents playing envs through the Runner and `evaluate`: a plain openai-SDK program,
a Python agent, mini-swe-agent from PyPI, an agent killed by a signal, hung agents (on the
host, in the sandbox) cut at their deadline; the verifier's reward on the trajectory and the
recorded tokens exactly the engine's."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

import corral as cr
from corral.runner import EpisodeLimits, Runner, ScriptedPolicy, Status
from corral.runner.agents import AgentContext, ExternalAgent, kill_tree
from corral.runner.agents.external import MARKER_ENV

from agent_helpers import Recorded, generated

AGENT = str(Path(__file__).with_name("openai_agent.py"))


class Touch(cr.TerminalEnv):
    """Put a word into /tmp/word.txt."""

    env_id = "test/agent-touch-v0"
    tasks = cr.Dataset.from_list([{"word": w} for w in ("alpha", "beta")])
    max_turns = 6

    def instruction(self, task: cr.Task) -> str:
        return f"Write the word {task.word} into /tmp/word.txt."

    @cr.reward
    async def written(self, sandbox: cr.sandbox.Sandbox, task: cr.Task) -> float:
        result = await sandbox.exec("cat /tmp/word.txt")
        return float(result.stdout.strip() == task.word)


def _call(command: str) -> str:
    return "<tool_call>" + json.dumps({"name": "bash", "arguments": {"command": command}}) + \
        "</tool_call>"


def solver(call) -> str:
    """Solves the task on turn 0 (Touch's word, or the Harbor answer task's 42), submits
    (mini-swe-agent's marker) on turn 1, then stops."""
    if call.turn == 0:
        if "ultimate question" in call.prompt:
            return _call("echo 42 > /root/answer.txt")
        word = call.prompt.split("Write the word ")[1].split()[0]
        return _call(f"echo {word} > /tmp/word.txt")
    if call.turn == 1:
        return _call("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
    return "done"


@pytest.mark.bwrap
async def test_openai_sdk_command_agent_solves_terminal_task() -> None:
    engine = Recorded(ScriptedPolicy(solver))
    agent = ExternalAgent(command=[sys.executable, AGENT])
    async with Runner([Touch], engine, agent=agent, sandbox_backend="bwrap",
                      sandbox_capacity=1, seed=3) as runner:
        trajs = await runner.collect(1)
    assert [t.status for t in trajs] == [Status.COMPLETE], [t.error for t in trajs]
    assert [t.reward for t in trajs] == [1.0]
    sampled = [i for t in trajs for i in generated(t)]
    assert sorted(sampled) == sorted(i for _, g in engine.calls for i in g.token_ids)
    for t in trajs:
        assert t.metadata["agent"]["exit_code"] == 0 and "turns" in \
            t.metadata["agent"]["log_tail"]
        assert len(t.metadata["segments"]) == 1 and t.turns >= 2
        assert any(m["role"] == "tool" for m in t.messages)
        assert {"setup", "agent", "decode", "verify"} <= set(t.phase_seconds())


def _arithmetic(call) -> str:
    """The right answer to corral/arithmetic-v0's task in the prompt."""
    expression = re.search(r"Compute (.+?)\. Reply", call.prompt)[1]
    return str(eval(expression, {"__builtins__": {}}))  # the env's own arithmetic


def _ask_once(ctx: AgentContext) -> str:
    """A Python agent: one chat call (the openai SDK) with the task's messages; the reply."""
    import openai

    client = openai.OpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0)
    reply = client.chat.completions.create(model=ctx.model, messages=ctx.messages)
    return reply.choices[0].message.content


async def test_evaluate_with_a_python_agent(tmp_path: Path) -> None:
    """`aevaluate(..., agent=...)` end to end on a built-in env: a Python agent answers each
    task through the proxy; the verifier scores its reply (pass@1), every trajectory holds
    exactly the tokens the engine sampled for it, and the plan names the agent."""
    from corral.runner.eval.evaluation import aevaluate

    engine, seen = Recorded(ScriptedPolicy(_arithmetic)), []
    result = await aevaluate(["corral/arithmetic-v0"], engine, tasks=3, run_dir=tmp_path,
                             agent=ExternalAgent(python=_ask_once), listener=seen.append,
                             report=False)
    assert result.summary["envs"]["corral/arithmetic-v0"]["pass"]["1"] == 1.0
    assert len(seen) == len(engine.calls) == 3
    assert [t.reward for t in seen] == [1.0] * 3 and {t.turns for t in seen} == {1}
    by_prompt = {tuple(prompt): gen for prompt, gen in engine.calls}
    for t in seen:
        prompt = t.token_ids[:t.loss_mask.index(1)]
        gen = by_prompt[tuple(prompt)]  # the prompt the engine was sent is the trajectory's
        assert generated(t) == gen.token_ids and t.logprobs[len(prompt):] == gen.logprobs
        assert t.metadata["agent"]["result"] == gen.text == t.messages[-1]["content"]
    plan = json.loads((tmp_path / "eval_plan.json").read_text())
    assert plan["agent"] == "_ask_once"


def _leaving(pids: Path, last: str) -> list[str]:
    """A `bash -c` agent that starts two background `sleep 300`s, one of them out of its
    session (setsid), writes their pids to `pids`, then runs `last`."""
    return ["bash", "-c", f"sleep 300 & echo $! >> {pids}; "
            f"(setsid sleep 300 & echo $! >> {pids}); {last}"]


def _assert_gone(pids: Path) -> None:
    """Both processes `_leaving` started are gone (or zombies awaiting their reaper)."""
    left = [int(p) for p in pids.read_text().split()]
    assert len(left) == 2
    for pid in left:  # both background children, the one that left the session too
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


@pytest.mark.bwrap
async def test_hung_agent_is_killed_at_the_deadline(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    agent = ExternalAgent(command=_leaving(pids, "sleep 300"))
    limits = EpisodeLimits(episode_deadline=1.5)
    async with Runner([Touch], ScriptedPolicy(["x"]), agent=agent, limits=limits,
                      sandbox_backend="bwrap", sandbox_capacity=1) as runner:
        (traj,) = await runner.collect(1)
    assert traj.status is Status.TRUNCATED and traj.metadata["truncated_by"] == "episode"
    assert traj.reward == 0.0 and "verify" in traj.phase_seconds()
    _assert_gone(pids)


@pytest.mark.bwrap
async def test_agent_killed_by_a_signal_ends_its_episode_with_nothing_left(
        tmp_path: Path) -> None:
    """An agent that dies of SIGKILL (here by its own hand) ends the episode at once as
    AGENT_ERROR naming the signal, still scored by the verifier; the children it left
    running, the detached one too, are killed with it."""
    pids = tmp_path / "pids"
    agent = ExternalAgent(command=_leaving(pids, "kill -KILL $$"))
    async with Runner([Touch], ScriptedPolicy(["x"]), agent=agent, sandbox_backend="bwrap",
                      sandbox_capacity=1) as runner:
        (traj,) = await runner.collect(1)
    assert traj.status is Status.AGENT_ERROR, traj.error
    assert traj.error == "the agent was killed by signal SIGKILL"
    assert traj.metadata["agent"]["exit_code"] == -9 and traj.trainable
    assert traj.reward == 0.0 and "verify" in traj.phase_seconds()
    assert traj.phase_seconds()["agent"] < 30  # not held to the deadline (600 s)
    _assert_gone(pids)


class HungInside(Touch):
    """Touch scored by what still runs in its sandbox when the verifier does: 1.0 when no
    process of the agent's is left (each has `sleep 301` in its command line)."""

    env_id = "test/agent-inside-hung-v0"

    @cr.reward
    async def written(self, sandbox: cr.sandbox.Sandbox, task: cr.Task) -> float:
        result = await sandbox.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
        return float(result.exit_code == 0 and "sleep 3" + "01" not in result.stdout)


@pytest.mark.parametrize("backend", [pytest.param("bwrap", marks=pytest.mark.bwrap),
                                     pytest.param("docker", marks=pytest.mark.docker)])
async def test_hung_agent_inside_the_sandbox_is_killed_at_the_deadline(
        backend: str, request: pytest.FixtureRequest) -> None:
    """An in-sandbox agent that never exits (its children, one out of its session, neither)
    is cut at the episode deadline: TRUNCATED, and when the verifier runs nothing of it is
    left in the sandbox."""
    if backend == "docker":
        request.getfixturevalue("base_image")  # the env's image, built once per machine
    script = "sleep 301 & (setsid sleep 301 &); sleep 301"
    agent = ExternalAgent(command=["bash", "-c", script], inside=True)
    async with Runner([HungInside], ScriptedPolicy(["x"]), agent=agent,
                      limits=EpisodeLimits(episode_deadline=4), sandbox_backend=backend,
                      sandbox_capacity=1) as runner:
        (traj,) = await runner.collect(1)
    assert traj.status is Status.TRUNCATED, (traj.error, traj.metadata["agent"])
    assert traj.metadata["truncated_by"] == "episode"
    assert traj.metadata["agent"]["transport"] == "socket"
    assert traj.reward == 1.0  # the verifier found no `sleep 301` in the sandbox


def test_kill_tree_reaches_detached_children(tmp_path: Path) -> None:
    import subprocess
    import time

    marker = tmp_path / "pid"
    proc = subprocess.Popen(["bash", "-c", f"(setsid sleep 300 & echo $! > {marker}); sleep 300"],
                            start_new_session=True, env={**os.environ, MARKER_ENV: "t1"})
    deadline = time.monotonic() + 10
    while not marker.exists() or not marker.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    child = int(marker.read_text())
    kill_tree(proc.pid, "t1")
    proc.wait(10)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and \
            Path(f"/proc/{child}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, "the detached child survived"
        time.sleep(0.02)


def test_agent_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="exactly one of"):
        ExternalAgent()
    with pytest.raises(ValueError, match="list of strings"):
        ExternalAgent(command="python agent.py")
    with pytest.raises(cr.errors.CorralError, match="not an executable"):
        ExternalAgent(command=["no-such-agent-binary"])
    with pytest.raises(cr.errors.CorralError, match="Did you mean 'mini-swe-agent'"):
        ExternalAgent.named("mini-swe-agnet")


def test_train_config_builds_the_agent_the_command_line_does() -> None:
    """`TrainConfig`'s agent fields make the `ExternalAgent` the flags make (one builder):
    an in-sandbox command (not looked up on the host's PATH) with its variables."""
    from corral.runner.agents import agent_from_options
    from corral.trainer.config import TrainConfig

    argv = "python3 /opt/agent.py --turns 2"
    config = TrainConfig(envs=["corral/arithmetic-v0"], agent_command=argv, agent_inside=True,
                         agent_env={"MY_FLAG": "1"})
    agent = config.external_agent()
    assert agent == agent_from_options(None, argv, inside=True, env={"MY_FLAG": "1"})
    assert (list(agent.command), agent.inside, dict(agent.env)) == \
        (["python3", "/opt/agent.py", "--turns", "2"], True, {"MY_FLAG": "1"})
    with pytest.raises(ValueError, match="agent_command 'no-such-agent-binary' "
                       r"\(--agent-command\): agent command 'no-such-agent-binary' is not"):
        TrainConfig(envs=["corral/arithmetic-v0"], agent_command="no-such-agent-binary")


@pytest.mark.bwrap
async def test_mini_swe_agent_from_pypi_solves_and_trains(policy, tiny_path, tmp_path: Path,
                                                          one_torch_thread) -> None:
    """mini-swe-agent (the PyPI package) through the proxy: with a scripted engine it solves
    an imported Harbor task (the verifier's reward on the trajectory); with the tiny model's
    random replies on a built-in terminal env and on the Harbor task its episodes end, every
    recorded id is the engine's, and a training step runs on them."""
    from harbor_tasks import answer_task

    (harbor,) = cr.load_harbor(answer_task(tmp_path / "answer"), register=False).values()
    scripted = Recorded(ScriptedPolicy(solver))
    async with Runner([harbor], scripted, agent=ExternalAgent.named("mini-swe-agent"),
                      sandbox_backend="bwrap", sandbox_capacity=1, seed=5) as runner:
        (solved,) = await runner.collect(1)
    assert solved.status is Status.COMPLETE and solved.reward == 1.0, solved.error
    assert solved.metadata["agent"]["result"]["exit_status"] == "Submitted"
    assert solved.messages[0]["role"] == "system"  # mini-swe-agent's own prompt
    assert generated(solved) == [i for _, g in scripted.calls for i in g.token_ids]

    engine = Recorded(policy)
    limits = EpisodeLimits(max_tokens=16, max_turns=3, episode_deadline=60)
    agent = ExternalAgent.named("mini-swe-agent", step_limit=3)
    async with Runner(["corral/term-files-v0"], engine, agent=agent, limits=limits,
                      sandbox_backend="bwrap", sandbox_capacity=2, seed=1) as runner:
        trajs = await runner.collect(2, group=2)
    assert all(t.trainable for t in trajs), [t.error for t in trajs]
    assert sorted(i for t in trajs for i in generated(t)) == \
        sorted(i for _, g in engine.calls for i in g.token_ids)
    # the imported Harbor task with the tiny model: attempted, scored by its own tests
    await _attempts_harbor(harbor, Recorded(policy), agent, limits)
    from corral.runner.policy import load_model
    from corral.trainer.config import StepConfig
    from corral.trainer.trainer import Trainer

    trajs[0].reward = 1.0  # a group with signal (the random model solves nothing)
    model, _ = load_model(tiny_path)  # a copy: the session's policy keeps its weights
    result = Trainer(model, None, StepConfig(dtype="float32")).step([trajs])
    assert result.applied and result.metrics["samples"] >= 2


@pytest.mark.bwrap
async def test_mini_swe_agent_against_vllm_records_the_engines_tokens(engine,
                                                                      tmp_path: Path) -> None:
    """mini-swe-agent through the proxy against the real vLLM (CPU; the session's engine):
    its episodes end at the run's max_turns (below its own step limit: it stops there itself,
    not retrying the refused call until the deadline); a reply cut at max_tokens is replaced
    in its history by a note of its own, which starts a new segment; in every segment the
    sampled ids, log-probabilities and policy version are exactly what vLLM answered. It
    attempts the imported Harbor task too, scored by the task's own tests."""
    policy = Recorded(engine.policy())
    # the engine's context is 2048 tokens; mini.yaml's prompts are 3300 of the tiny model's
    limits = EpisodeLimits(max_tokens=16, max_turns=2, max_context=2048, episode_deadline=90)
    agent = ExternalAgent.named("mini-swe-agent", step_limit=5,
                                system_template="You are a shell agent: use the bash tool.",
                                instance_template="{{task}}")
    from harbor_tasks import answer_task

    (harbor,) = cr.load_harbor(answer_task(tmp_path / "answer"), register=False).values()
    try:
        async with Runner(["corral/term-files-v0"], policy, agent=agent, limits=limits,
                          sandbox_backend="bwrap", sandbox_capacity=2, seed=2) as runner:
            trajs = await runner.collect(2, group=2)
        await _attempts_harbor(harbor, Recorded(policy.inner), agent, limits)
    finally:
        await policy.inner.close()
    assert [t.status for t in trajs] == [Status.COMPLETE] * 2, [t.error for t in trajs]
    assert [t.metadata["agent"]["result"]["exit_status"] for t in trajs] == \
        ["LimitsExceeded"] * 2
    assert [t.turns for t in trajs] == [2, 2] and len(policy.calls) == 4
    by_prompt: dict[tuple[int, ...], list] = {}  # a group's episodes share their prompts
    for prompt, gen in policy.calls:
        by_prompt.setdefault(tuple(prompt), []).append(gen)
    for t in trajs:
        segments = t.metadata["segments"]
        assert segments[0]["reason"] is None and all(
            s["reason"] == "the reply to request 0 was replaced" for s in segments[1:])
        found = [turn for s in segments for turn in _turns(t, s, by_prompt)]
        assert len(found) == t.turns
        for start, gen in found:
            end = start + len(gen.token_ids)
            assert t.token_ids[start:end] == gen.token_ids and set(t.loss_mask[start:end]) == {1}
            assert t.logprobs[start:end] == pytest.approx(gen.logprobs)
            assert set(t.versions[start:end]) == {gen.version}


async def _attempts_harbor(harbor, engine: Recorded, agent: ExternalAgent,
                           limits: EpisodeLimits) -> None:
    """mini-swe-agent attempts the imported Harbor task with `engine` (a real model): its
    episode ends trainable, the task's own tests scored it (a reward of theirs is on the
    trajectory: 1 only where the answer file holds 42), and every id it generated is one the
    engine sampled."""
    async with Runner([harbor], engine, agent=agent, limits=limits, sandbox_backend="bwrap",
                      sandbox_capacity=1, seed=3) as runner:
        (traj,) = await runner.collect(1)
    assert traj.trainable, traj.error
    assert traj.rewards and traj.reward in (0.0, 1.0)
    assert generated(traj) == [i for _, g in engine.calls for i in g.token_ids] != []


def _turns(traj, segment, by_prompt):
    """(offset in traj.token_ids, the engine's generation) of each model call in `segment`:
    the call whose prompt is the segment's ids before that offset."""
    ids, found = traj.token_ids[segment["start"]:segment["end"]], []
    for end in range(len(ids)):
        for gen in by_prompt.get(tuple(ids[:end]), ()):
            if ids[end:end + len(gen.token_ids)] == gen.token_ids:
                found.append((segment["start"] + end, gen))
                break
    return found


@pytest.mark.parametrize("argv, message", [
    (["collect", "corral/arithmetic-v0", "--run-dir", "R", "--agent", "mini-swe-agnet"],
     "--agent mini-swe-agnet: unknown agent 'mini-swe-agnet'. Did you mean 'mini-swe-agent'?"),
    (["eval", "corral/arithmetic-v0", "--agent-command", "no-such-agent-binary x"],
     "--agent-command no-such-agent-binary x: agent command 'no-such-agent-binary' is not"),
    (["collect", "corral/arithmetic-v0", "--run-dir", "R", "--agent", "mini-swe-agent",
      "--agent-command", "python a.py"], "--agent and --agent-command: give one of them"),
    (["collect", "corral/arithmetic-v0", "--run-dir", "R", "--agent-inside"],
     "--agent-inside: inside applies to an agent command only"),
    (["eval", "corral/arithmetic-v0", "--agent", "mini-swe-agent", "--agent-env", "A=1"],
     "--agent mini-swe-agent: env applies to an agent command only"),
    (["eval", "corral/arithmetic-v0", "--agent-command", "bash", "--agent-env", "A"],
     "--agent-env 'A': write KEY=VALUE"),
    (["run", "corral/arithmetic-v0", "--agent-inside"],
     "--agent oracle: --agent-inside and --agent-env apply to --agent-command"),
])
def test_cli_agent_flags_are_usage_errors(argv: list[str], message: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from corral.cli import app

    argv = [str(tmp_path / a) if a == "R" else a for a in argv]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


@pytest.fixture(scope="session")
def sdk_image(base_image: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The base image with the real openai SDK and `openai_agent.py` (/opt/agent.py) in it
    (tests/support/openai_image.py: built once per machine)."""
    from openai_image import openai_sdk_image

    return openai_sdk_image(tmp_path_factory.mktemp("openai-sdk"), base_image, Path(AGENT))


def _inside_env(image: str, *, relay: bool) -> type[cr.TerminalEnv]:
    """Touch in the SDK image; `relay`: the sandbox's root is not reachable from the host
    (as for a container on another Docker host), so the agent's way in is the stdio relay."""

    class InsideTouch(Touch):
        env_id = "test/agent-inside-relay-v0" if relay else "test/agent-inside-v0"
        sandbox_spec = cr.Terminal(image=image)

        async def setup(self, sandbox: cr.sandbox.Sandbox, task: cr.Task) -> None:
            if relay:
                sandbox._root = None

    return InsideTouch


@pytest.mark.bwrap
@pytest.mark.docker
@pytest.mark.parametrize("backend,transport", [("bwrap", "socket"), ("docker", "socket"),
                                               ("docker", "relay")])
async def test_openai_sdk_agent_inside_the_sandbox_reaches_only_the_proxy(
        backend: str, transport: str, sdk_image: str) -> None:
    """A plain openai-SDK tool-calling loop runs in the sandbox (network off): the proxy
    answers it over the socket Corral binds there (the SDK's own client with a unix-socket
    transport) and over the loopback port forwarded to it; a server on the host's loopback
    and any other address do not answer; the tokens recorded are exactly the engine's."""
    import http.server
    import threading

    host = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    engine = Recorded(ScriptedPolicy(solver))
    probes = [f"http://127.0.0.1:{host.server_port}/", "http://192.0.2.1/"]
    argv = ["python3", "/opt/agent.py", "--local", "--uds"]
    agent = ExternalAgent(command=[*argv, *(a for u in probes for a in ("--probe", u))],
                          inside=True)
    try:
        async with Runner([_inside_env(sdk_image, relay=transport == "relay")], engine,
                          sandbox_backend=backend, sandbox_capacity=1, agent=agent) as runner:
            (traj,) = await runner.collect(1)
    finally:
        host.shutdown()
    log = traj.metadata["agent"]["log_tail"]
    assert traj.status is Status.COMPLETE and traj.reward == 1.0, (traj.error, log)
    assert traj.metadata["agent"]["transport"] == transport
    assert log.count("PROBE failed") == 2 and "PROBE reached" not in log, log
    assert "MODELS corral-policy" in log
    assert len(traj.metadata["segments"]) == 1 and traj.turns == len(engine.calls) >= 2
    assert generated(traj) == [i for _, g in engine.calls for i in g.token_ids]
