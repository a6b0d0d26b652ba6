"""An environment written only from the docs alone: class form and function form."""

from __future__ import annotations

import pytest
from gymnasium.utils.env_checker import check_env

import corral as cr


class CounterTask(cr.Task):
    target: int


@cr.environment("test/counter-v1", tasks=[{"target": 3}, {"target": 5}], max_turns=10,
                tags=["test", "tools"])
class Counter(cr.TextEnv):
    """Increment a counter up to a target, then say done."""

    def instruction(self, task: CounterTask) -> str:
        return f"Call `inc` until the counter reaches {task.target}, then reply 'done'."

    async def setup(self, sandbox, task) -> None:
        self.count = 0

    @cr.tool
    async def inc(self, by: int = 1) -> str:
        """Increment the counter.

        Args:
            by: how much to add (1 to 3).
        """
        if not 1 <= by <= 3:
            raise ValueError("by must be between 1 and 3")
        self.count += by
        return f"counter={self.count}"

    @cr.tool
    def peek(self, state: dict) -> str:
        """Show the counter without changing it."""
        state["peeks"] = state.get("peeks", 0) + 1
        return f"counter={self.count}"

    @cr.reward(weight=1.0)
    async def reached(self, task) -> float:
        return float(self.count == task.target)

    @cr.reward(weight=0.5, per_step=True)
    def step_penalty(self) -> float:
        return -0.01

    def solution(self, task) -> list[cr.ToolCall]:
        return [cr.ToolCall.of("inc", by=1) for _ in range(task.target)] + ["done"]


@cr.environment("test/add-v0", tasks=[{"a": 1, "b": 2}, {"a": 30, "b": 12}])
def add(task):
    """Add two numbers."""
    return f"What is {task.a} + {task.b}? Reply with the number only."


@add.reward
def correct(task, completion):
    return completion.strip() == str(task.a + task.b)


@add.solution
def add_solution(task):
    return str(task.a + task.b)


def test_class_form_registers_and_lists() -> None:
    ids = [s.id for s in cr.registry.list("test/*")]
    assert "test/counter-v1" in ids and "test/add-v0" in ids
    assert cr.spec("test/counter").id == "test/counter-v1"
    assert cr.spec("test/counter-v1").tags == ["test", "tools"]


def test_tool_schema_from_signature_and_docstring() -> None:
    env = cr.make("test/counter-v1")
    schemas = {s["function"]["name"]: s for s in env.tool_schemas()}
    assert set(schemas) == {"inc", "peek"}
    inc = schemas["inc"]["function"]
    assert inc["description"] == "Increment the counter."
    assert inc["parameters"]["properties"]["by"] == {
        "type": "integer", "default": 1, "description": "how much to add (1 to 3)."}
    # injected parameters never reach the schema
    assert schemas["peek"]["function"]["parameters"]["properties"] == {}


def test_sync_episode_with_tools_and_rewards() -> None:
    env = cr.make("test/counter-v1")
    obs, info = env.reset(options={"task_index": 0})
    assert "reaches 3" in obs and info["task_id"] == env.episode.task.id
    total = 0.0
    for action in env.solution(env.episode.task):
        obs, reward, terminated, truncated, info = env.step(action)
        total += reward
    assert terminated and not truncated
    assert info["rewards"]["reached"] == 1.0
    assert total == pytest.approx(1.0 + 0.5 * -0.01 * 4)
    roles = [m["role"] for m in env.episode.messages]
    assert roles == ["user"] + ["assistant", "tool"] * 3 + ["assistant"]


async def test_async_twins_and_text_tool_calls() -> None:
    env = cr.make("test/counter-v1")
    await env.areset(options={"task_index": 1})
    obs, *_ = await env.astep('<tool_call>{"name": "inc", "arguments": {"by": 3}}</tool_call>')
    assert obs == "counter=3"
    obs, *_ = await env.astep(cr.ToolCall.of("inc", by=2))
    assert obs == "counter=5"
    obs, reward, terminated, _, info = await env.astep("done")
    assert terminated and info["rewards"]["reached"] == 1.0
    await env.aclose()


async def test_agent_mistakes_become_observations() -> None:
    env = cr.make("test/counter-v1")
    await env.areset(options={"task_index": 0})
    obs, *_ = await env.astep(cr.ToolCall.of("incc"))
    assert "Unknown tool 'incc'" in obs and "Did you mean 'inc'" in obs
    obs, *_ = await env.astep(cr.ToolCall.of("inc", by="lots"))
    assert "Invalid arguments for tool 'inc'" in obs and "'by'" in obs
    obs, *_ = await env.astep(cr.ToolCall.of("inc", by=1, extra=True))
    assert "'extra'" in obs
    obs, *_ = await env.astep(cr.ToolCall.of("inc", by=9))
    assert obs == "Error: tool 'inc' failed: ValueError: by must be between 1 and 3"
    obs, *_ = await env.astep("<tool_call>{not json}</tool_call>")
    assert obs.startswith("Error: Could not parse tool call (invalid JSON")
    assert env.episode.turn == 5 and not env.episode.done


async def test_max_turns_truncates_and_still_scores() -> None:
    env = cr.make("test/counter-v1", max_turns=2)
    await env.areset(options={"task_index": 0})
    await env.astep(cr.ToolCall.of("inc"))
    _, _, terminated, truncated, info = await env.astep(cr.ToolCall.of("peek"))
    assert truncated and not terminated
    assert info["rewards"]["reached"] == 0.0


async def test_raising_reward_marks_episode_errored() -> None:
    @cr.environment("test/broken-reward-v0", tasks=[{"x": 1}], register=False)
    def broken(task):
        """A prompt."""
        return "say anything"

    @broken.reward
    def explodes(task, completion):
        raise RuntimeError("verifier bug")

    @broken.reward(weight=2.0)
    def fine(completion):
        return 1.0

    env = broken()
    await env.areset(seed=0)
    _, reward, terminated, _, info = await env.astep("hello")
    assert terminated and info["errored"]
    assert info["errors"] == ["reward 'explodes' raised RuntimeError: verifier bug"]
    assert reward == 2.0


def test_function_form_and_check_env() -> None:
    env = cr.make("test/add-v0")
    obs, _ = env.reset(seed=3)
    task = env.episode.task
    assert obs == f"What is {task.a} + {task.b}? Reply with the number only."
    _, reward, terminated, _, _ = env.step(env.solution(task))
    assert terminated and reward == 1.0
    env.reset(seed=3)
    assert env.step("nope")[1] == 0.0
    check_env(cr.make("test/add-v0"))
    check_env(cr.make("test/counter-v1"))


def test_reset_seed_is_deterministic() -> None:
    env = cr.make("corral/arithmetic-v0")
    first = [env.reset(seed=s)[0] for s in range(5)]
    again = [env.reset(seed=s)[0] for s in range(5)]
    assert first == again and len(set(first)) > 1


def test_reset_task_index_is_a_task_of_the_env() -> None:
    """`options={"task_index": i}` picks task i; -1 is refused (it read the last task, while
    the env server refuses it), as are indices past the end and values that are not ints."""
    env = cr.make("corral/arithmetic-v0")
    size = len(env.tasks)
    assert env.reset(options={"task_index": 3})[1]["task_id"] == env.tasks[3].id
    for bad in (-1, size, "1", True, 1.0):
        with pytest.raises(cr.errors.DatasetError, match=f"from 0 to {size - 1}"):
            env.reset(options={"task_index": bad})


def test_authoring_errors_are_clear() -> None:
    with pytest.raises(cr.errors.AuthoringError, match="needs a docstring"):
        @cr.tool
        def nodoc(x: int) -> str:
            return ""
    with pytest.raises(cr.errors.AuthoringError, match="'x' needs a type hint"):
        @cr.tool
        def untyped(x) -> str:
            """Doc."""
    with pytest.raises(cr.errors.AuthoringError, match="must subclass"):
        @cr.environment("test/not-env-v0")
        class NotEnv:
            pass
    with pytest.raises(cr.errors.InvalidEnvId, match="needs a version suffix"):
        cr.environment("test/noversion")


def test_step_before_reset_and_after_end() -> None:
    env = cr.make("test/add-v0")
    with pytest.raises(cr.errors.AgentError, match="reset"):
        env.step("1")
    env.reset(seed=0)
    env.step("1")
    with pytest.raises(cr.errors.AgentError, match="episode is over"):
        env.step("1")


class Opaque:
    """A class pydantic cannot describe (a tool argument type with no JSON schema)."""


def test_declaration_values_are_checked_when_the_env_is_declared() -> None:
    """Values that would break every episode are refused at the decorator, naming the env,
    tool or reward: max_turns below 1 (each episode ended truncated after one step), a reward
    weight that is not a number, a tool argument type with no JSON schema (pydantic's error
    of several paragraphs); `tags="math"` is one tag (it was the letters m, a, t, h)."""
    for bad in (0, -3, 2.5):
        with pytest.raises(cr.errors.AuthoringError, match=r"test/turns-v0: max_turns must be"):
            cr.environment("test/turns-v0", tasks=[{"a": 1}], max_turns=bad, register=False)
    with pytest.raises(cr.errors.AuthoringError, match="max_turns must be a whole number >= 1"):
        cr.make("test/add-v0", max_turns=0)
    env = cr.environment("test/tags-v0", tasks=[{"a": 1}], tags="math",
                         register=False)(lambda task: "hi")
    assert env.tags == ("math",)

    def blank(task):
        return "hi"

    blank.__doc__ = "   \n    "
    cr.environment("test/blank-doc-v0", tasks=[{"a": 1}])(blank)
    assert cr.spec("test/blank-doc-v0").description == ""  # was "    " (or an IndexError)
    for weight in ("heavy", float("nan"), None):
        with pytest.raises(cr.errors.AuthoringError, match="weight must be a finite number"):
            cr.reward(weight=weight)(lambda task: 1.0)
    with pytest.raises(cr.errors.AuthoringError,
                       match=r"argument 'x' has a type with no JSON schema") as info:
        @cr.tool
        def use(x: Opaque) -> str:
            """Use it."""
            return ""
    assert "\n" not in str(info.value) and "arbitrary_types_allowed" not in str(info.value)


async def test_tests_script_of_the_wrong_shape_is_a_clear_verifier_error() -> None:
    """docs/terminal.md: tests_script returns a bash script, a dict of files with `test.sh`,
    or a Verifier. Anything else says so before a sandbox is touched (it was "TypeError: 'int'
    object is not iterable", or bash's "/tests/test.sh: No such file" from the sandbox)."""

    class Numbers(cr.TerminalEnv):
        def tests_script(self, task):
            return 42

    class NoTestSh(cr.TerminalEnv):
        def tests_script(self, task):
            return {"helper.py": "print(1)"}

    task = cr.Task(a=1)
    with pytest.raises(cr.errors.VerifierError, match=r"returned 42; return a bash script"):
        await Numbers(tasks=[{"a": 1}]).tests(sandbox=None, task=task, state={})
    with pytest.raises(cr.errors.VerifierError, match=r"gave files \['helper.py'\] without "
                                                      r"'test.sh'"):
        await NoTestSh(tasks=[{"a": 1}]).tests(sandbox=None, task=task, state={})


async def test_openai_tool_calls_entries_are_actions() -> None:
    """docs/authoring.md: agents call tools "with an OpenAI `tool_calls` entry" too. One entry,
    or a message's list of them, runs the tools (`env.step(entry)` raised KeyError 'name');
    a malformed entry is an error observation, as a malformed `<tool_call>` is."""
    env = cr.make("test/counter-v1")
    await env.areset(options={"task_index": 0})
    entry = {"id": "call_1", "type": "function",
             "function": {"name": "inc", "arguments": '{"by": 2}'}}
    observation, *_ = await env.astep(entry)
    assert observation == "counter=2"
    assert env.episode.messages[-1]["tool_call_id"] == "call_1"
    observation, *_ = await env.astep([{"function": {"name": "peek", "arguments": ""}},
                                       {"name": "inc", "arguments": {"by": 1}}])
    assert observation == "counter=2\ncounter=3"
    observation, _, terminated, *_ = await env.astep({"arguments": {"by": 1}})
    assert observation.startswith("Error: Could not parse tool call (missing 'name')")
    assert not terminated
