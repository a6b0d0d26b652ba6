"""The episode loop: incremental tokens, tool calls, version tags, deadlines, retries."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

import corral as cr
from corral.errors import AgentError, PolicyError
from corral.runner import (AssemblyConfig, EpisodeLimits, Runner, SandboxPool, ScriptedPolicy,
                           Status)
from corral.runner.policy import Generation, GenerationRequest
from corral.runner.policy.scripted import ScriptedCall, render_chatml
from corral.runner.trajectory import ENV_VERSION, Trajectory

from runner_helpers import DirOpener, FileEnv, file_solver, tool_call


def segments(traj: Trajectory) -> list[tuple[int, list[int], list[int]]]:
    """(loss flag, token ids, versions) runs of a trajectory."""
    out: list[tuple[int, list[int], list[int]]] = []
    for tok, mask, version in zip(traj.token_ids, traj.loss_mask, traj.versions):
        if not out or out[-1][0] != mask:
            out.append((mask, [], []))
        out[-1][1].append(tok)
        out[-1][2].append(version)
    return out


def never_right(call: ScriptedCall) -> str:
    return "-5"  # outside every guess-number range: the game never ends early


async def test_multi_turn_tokens_are_built_incrementally_and_match_the_template() -> None:
    policy = ScriptedPolicy(never_right)
    async with Runner(["corral/guess-number-v0"], policy, limits=EpisodeLimits(max_turns=3),
                      seed=3) as runner:
        [traj] = await runner.collect(1)
    assert traj.status is Status.TRUNCATED and traj.turns == 3
    assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.logprobs) == len(traj.versions)
    # the ids appended turn by turn are exactly the chat template over the final transcript
    # (the env's reply to the last turn is not tokenized: the episode is over)
    assert traj.messages[-1] == {"role": "user", "content": "higher"}
    text = policy.tokenizer.decode(traj.token_ids)
    assert text + "\n" == render_chatml(traj.messages[:-1])
    runs = segments(traj)
    generated = [r for r in runs if r[0] == 1]
    assert [policy.tokenizer.decode(r[1]) for r in generated] == ["-5<|im_end|>"] * 3
    assert all(v == ENV_VERSION for r in runs if r[0] == 0 for v in r[2])
    assert all(lp < 0 for lp, m in zip(traj.logprobs, traj.loss_mask) if m)
    phases = traj.phase_seconds()
    assert {"setup", "queue", "decode", "env", "verify"} <= set(phases)
    [verify] = [s for s in traj.spans if s.phase == "verify"]
    assert all(s.end <= verify.start for s in traj.spans if s.phase == "env")  # no double count


async def test_tool_calls_run_in_the_sandbox_and_errors_come_back_as_observations(
        opener: DirOpener) -> None:
    script = ["<tool_call>{not json</tool_call>", tool_call("cat README; ls nothere"),
              tool_call("echo 'hello 0' > f0.txt; echo 'hello 1' > f1.txt; "
                        "echo 'hello 2' > f2.txt; echo 'hello 3' > f3.txt; "
                        "echo 'hello 4' > f4.txt; echo 'hello 5' > f5.txt"), "done"]
    policy = ScriptedPolicy(script)
    pool = SandboxPool(2, opener=opener)
    async with Runner([FileEnv], policy, pool=pool, sandbox_capacity=2) as runner:
        [traj] = await runner.collect(1)
    await pool.close()
    assert traj.status is Status.COMPLETE and traj.reward == 1.0 and traj.turns == 4
    tools = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert tools[0].startswith("Error: Could not parse tool call")
    assert "task files live here" in tools[1] and "No such file" in tools[1]
    env_text = "".join(policy.tokenizer.decode(r[1]) for r in segments(traj) if r[0] == 0)
    assert "Could not parse tool call" in env_text and "task files live here" in env_text
    assert "sandbox_wait" in traj.phase_seconds()


class ChatToolPolicy(ScriptedPolicy):
    """Returns the first turn's call as OpenAI `tool_calls` instead of text."""

    async def generate(self, request: GenerationRequest) -> Generation:
        gen = await super().generate(request)
        if "[exit" in self.tokenizer.decode(request.prompt_ids) or gen.text != "CALL":
            return gen
        fields = {f: getattr(gen, f) for f in Generation.__dataclass_fields__}
        call = {"id": "call_1", "type": "function", "function": {
            "name": "sh", "arguments": json.dumps({"command": "echo ok > proof.txt"})}}
        return Generation(**{**fields, "tool_calls": [call]})


async def test_openai_tool_calls_are_executed(opener: DirOpener) -> None:
    policy = ChatToolPolicy(["CALL", "done"])
    pool = SandboxPool(1, opener=opener)
    async with Runner([FileEnv], policy, pool=pool, sandbox_capacity=1) as runner:
        [traj] = await runner.collect(1)
    await pool.close()
    assert traj.turns == 2
    assistant = [m for m in traj.messages if m["role"] == "assistant"][0]
    assert assistant["tool_calls"] == [
        {"name": "sh", "arguments": {"command": "echo ok > proof.txt"}}]
    assert any(m["role"] == "tool" and m.get("tool_call_id") == "call_1" for m in traj.messages)


async def test_tokens_carry_the_version_that_generated_them() -> None:
    reached, go = asyncio.Event(), asyncio.Event()

    async def respond(call: ScriptedCall) -> str:
        if call.turn == 2:
            reached.set()
            await go.wait()
        return "-5"

    policy = ScriptedPolicy(respond)
    async with Runner(["corral/guess-number-v0"], policy,
                      limits=EpisodeLimits(max_turns=5)) as runner:
        pending = asyncio.ensure_future(runner.collect(1))
        await reached.wait()
        policy.set_version(1)            # weights replaced while turn 2 is being generated
        assert runner.on_policy_update(1) == 0  # default: in-flight work finishes
        go.set()
        [traj] = await pending
    versions = [set(r[2]) for r in segments(traj) if r[0] == 1]
    # turn 2 started before the update, so it keeps version 0, like a running decode batch
    assert versions == [{0}, {0}, {0}, {1}, {1}]
    assert traj.min_version() == 0


async def test_turn_deadline_truncates_and_still_verifies(opener: DirOpener) -> None:
    forever = asyncio.Event()

    async def respond(call: ScriptedCall) -> str:
        if call.turn == 0:
            return file_solver(call)
        await forever.wait()
        return "done"

    pool = SandboxPool(1, opener=opener)
    async with Runner([FileEnv], ScriptedPolicy(respond), pool=pool, sandbox_capacity=1,
                      limits=EpisodeLimits(turn_deadline=0.5), seed=2) as runner:
        trajs = await runner.collect(2, group=2)
    await pool.close()
    assert [t.status for t in trajs] == [Status.TRUNCATED] * 2
    assert all(t.metadata["truncated_by"] == "turn" for t in trajs)
    # the verifier ran although the episode was cut: the even seed wrote the right file
    assert sorted(t.reward for t in trajs) in ([0.0, 1.0], [1.0, 1.0], [0.0, 0.0])
    assert {t.reward for t in trajs if t.metadata["seed"] % 2 == 0} <= {1.0}
    assert all("verify" in t.phase_seconds() for t in trajs)


@pytest.mark.parametrize("field, value, message", [
    ("episode_deadline", -5, "episode_deadline must be a finite number of seconds above 0"),
    ("turn_deadline", float("nan"), "turn_deadline must be a finite number"),
    ("max_tokens", 0, "max_tokens must be an integer in"),
    ("temperature", -1, "temperature must be 0"),
    ("top_p", 2, "top_p must be in"),
    ("max_turns", 0, "max_turns must be at least 1"),
])
def test_limits_that_would_cut_every_episode_are_refused(field: str, value: Any,
                                                         message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EpisodeLimits(**{field: value})


@pytest.mark.parametrize("change, error, message", [
    ({"envs": "corral/arithmetic"}, TypeError, r"pass \['corral/arithmetic'\]"),
    ({"envs": []}, ValueError, "envs is empty"),
    ({"policy": None}, TypeError, "policy must be a Policy"),
    ({"limits": {"max_turns": 2}}, TypeError, r"EpisodeLimits\(\*\*limits\)"),
    ({"assembly": {"retries": 1}}, TypeError, "assembly must be an AssemblyConfig"),
    ({"seed": -1}, ValueError, "seed must be an int >= 0"),
    ({"env_weights": [0.0]}, ValueError, "not all 0"),
    ({"env_weights": [float("nan")]}, ValueError, "env_weights must be finite"),
])
def test_runner_arguments_that_would_fail_every_episode_are_refused(
        change: dict[str, Any], error: type[Exception], message: str) -> None:
    args: dict[str, Any] = {"envs": ["corral/arithmetic"], "policy": ScriptedPolicy(["4"]),
                            **change}
    with pytest.raises(error, match=message):
        Runner(args.pop("envs"), args.pop("policy"), **args)


class _MalformedPolicy(ScriptedPolicy):
    """Returns what a hand-written policy might by mistake, in place of a Generation."""

    def __init__(self, answer: Any) -> None:
        super().__init__(["4"])
        self.answer = answer

    async def generate(self, request: GenerationRequest) -> Any:
        gen = await super().generate(request)
        return self.answer(gen)


@pytest.mark.parametrize("answer, message", [
    (lambda gen: None, "returned NoneType, not a Generation"),
    (lambda gen: {"text": gen.text}, "returned dict, not a Generation"),
    (lambda gen: Generation([str(t) for t in gen.token_ids], gen.logprobs, gen.text, 0),
     "token_ids that are not a list of ints"),
    (lambda gen: Generation(gen.token_ids, gen.logprobs[:-1], gen.text, 0),
     "but .* logprobs"),
])
async def test_a_malformed_generation_is_named_with_its_policy(answer: Any, message: str) -> None:
    async with Runner(["corral/arithmetic"], _MalformedPolicy(answer),
                      assembly=AssemblyConfig(retries=0)) as runner:
        trajs = await runner.collect(1)
    assert trajs[0].status is Status.INFRA_ERROR
    assert trajs[0].error.startswith("TypeError: _MalformedPolicy.generate")
    assert re.search(message, trajs[0].error)


async def test_infra_failures_are_retried_with_a_fresh_sandbox(opener: DirOpener) -> None:
    def respond(call: ScriptedCall) -> str:
        if call.request.session_id.endswith("#a1") and call.turn == 0:
            return tool_call("crash-sandbox")  # the sandbox dies mid-episode
        return file_solver(call)

    pool = SandboxPool(2, opener=opener)
    async with Runner([FileEnv], ScriptedPolicy(respond), pool=pool, sandbox_capacity=2,
                      assembly=AssemblyConfig(retries=2)) as runner:
        trajs = await runner.collect(3)
    await pool.close()
    for traj in trajs:
        assert traj.status is Status.COMPLETE and traj.attempts == 2
        assert len(traj.metadata["infra_causes"]) == 1
        assert "SandboxDied" in traj.metadata["infra_causes"][0]
    killed = [s for s in opener.opened if s.killed]
    assert len(killed) == 3 and all(s.closed for s in killed)
    assert len(opener.opened) >= 4  # the retries ran in other sandboxes


DOOMED = ("g000001", "g000004")


async def test_setup_and_policy_failures_are_retried_then_recorded(opener: DirOpener) -> None:
    FileEnv.fail_setup = {f"f{i}.txt": 1 for i in range(6)}  # every setup fails once

    def respond(call: ScriptedCall) -> str:
        if call.request.session_id.startswith(DOOMED):
            raise PolicyError("replica answered HTTP 503")  # these samples always fail
        return file_solver(call)

    pool = SandboxPool(2, opener=opener)
    async with Runner([FileEnv], ScriptedPolicy(respond), pool=pool, sandbox_capacity=2,
                      assembly=AssemblyConfig(retries=1), seed=5) as runner:
        trajs = await runner.collect(8)
    await pool.close()
    doomed = [t for t in trajs if t.id.startswith(DOOMED)]
    fine = [t for t in trajs if not t.id.startswith(DOOMED)]
    assert len(doomed) == 2 and len(fine) == 6
    for traj in doomed:  # infra errors after retries are recorded with their cause
        assert traj.status is Status.INFRA_ERROR and traj.attempts == 2
        assert "PolicyError" in traj.error and not traj.trainable
    first_try_setup = [t for t in fine if any("lost its sandbox" in c
                                              for c in t.metadata.get("infra_causes", []))]
    assert first_try_setup and all(t.status is Status.COMPLETE for t in fine)


class Strict(cr.TextEnv):
    """Ends the episode with an AgentError when the agent says 'boom'."""

    env_id = "test/strict-v0"
    tasks = cr.Dataset.from_list([{"prompt": "Say something."}])
    max_turns = 3

    async def respond(self, task: cr.Task, completion: str, state: dict[str, Any]) -> str | None:
        if "boom" in completion:
            raise AgentError("the agent blew up the game")
        return "go on"


async def test_agent_errors_are_recorded_not_retried() -> None:
    policy = ScriptedPolicy(["fine", "boom"])
    async with Runner([Strict], policy, assembly=AssemblyConfig(retries=3)) as runner:
        [traj] = await runner.collect(1)
    assert traj.status is Status.AGENT_ERROR and traj.attempts == 1
    assert "blew up" in traj.error and traj.trainable and traj.turns == 2
    assert policy.stats.requests == 2


async def test_max_staleness_cuts_and_restarts_old_episodes() -> None:
    started: set[str] = set()
    gate, both_running = asyncio.Event(), asyncio.Event()

    async def respond(call: ScriptedCall) -> str:
        started.add(call.request.session_id or "")
        if len(started) == 2:
            both_running.set()
        if call.version == 0:
            await gate.wait()  # old-version episodes are still decoding when the update lands
        return "-5"

    policy = ScriptedPolicy(respond)
    async with Runner(["corral/guess-number-v0"], policy, limits=EpisodeLimits(max_turns=2),
                      assembly=AssemblyConfig(max_staleness=0)) as runner:
        pending = asyncio.ensure_future(runner.collect(2))
        await both_running.wait()
        policy.set_version(1)
        assert runner.on_policy_update(1) == 2 and runner.counts["cut"] == 2
        trajs = await pending
        gate.set()
    assert all(t.min_version() == 1 and t.turns == 2 for t in trajs)
    assert {s.split("#")[1] for s in started} == {"a1", "r1"}


async def test_first_turn_decodes_while_the_episode_waits_for_a_sandbox(
        opener: DirOpener) -> None:
    """With one sandbox slot, the second episode's first turn is generated while the first
    episode still holds the slot: the first episode's next turn waits for it, so without the
    early first turn this would only end by the timeout."""
    first_turns: set[str] = set()
    both_started = asyncio.Event()
    timed_out: list[str] = []

    async def respond(call: ScriptedCall) -> str:
        session = call.request.session_id or ""
        if call.turn == 0:
            first_turns.add(session.split("#")[0])
            if len(first_turns) == 2:
                both_started.set()
        else:
            try:
                await asyncio.wait_for(both_started.wait(), 30)
            except TimeoutError:
                timed_out.append(session)
        return file_solver(call)

    pool = SandboxPool(1, opener=opener)
    async with Runner([FileEnv], ScriptedPolicy(respond), pool=pool, sandbox_capacity=1) as runner:
        trajs = await runner.collect(2, group=2)
    await pool.close()
    assert not timed_out and [t.status for t in trajs] == [Status.COMPLETE] * 2
    later = max(trajs, key=lambda t: next(s.end for s in t.spans if s.phase == "sandbox_wait"))
    waited = next(s for s in later.spans if s.phase == "sandbox_wait")
    first_decode = next(s for s in later.spans if s.phase == "decode")
    assert waited.end - waited.start > 0 and first_decode.end <= waited.end


class OneShotFileEnv(FileEnv):
    """FileEnv whose sandboxes are not reused: each episode needs a freshly started one."""

    env_id = "test/file-oneshot-v0"
    reusable_sandbox = False


async def test_an_episode_on_deck_finds_its_sandbox_started_when_its_slot_comes() -> None:
    """One slot, one on deck, starts that take 0.4 s, episodes that hold the slot for 1 s:
    the sandbox of an episode that goes on deck starts then, so it is warm when the slot
    frees. (Started only at the pool's next acquire or release, it began when the slot freed,
    and the episode waited 0.4 s for it inside the slot.)"""
    opener = DirOpener(delay=0.4)
    pool = SandboxPool(2, opener=opener)
    policy = ScriptedPolicy(file_solver, latency=lambda call: 1.0 if call.turn else 0.0)
    async with Runner([OneShotFileEnv], policy, pool=pool, sandbox_capacity=1,
                      warm_spares=1) as runner:
        trajs = await runner.collect(4, group=2)
    await pool.close()
    assert [t.status for t in trajs] == [Status.COMPLETE] * 4
    waits = pool.stats.wait_seconds  # in acquire order; the first ones met the cold start
    assert len(waits) == 4 and max(waits[2:]) < 0.2, waits
