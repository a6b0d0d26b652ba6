"""Registered Corral envs as what TRL's `GRPOTrainer` takes (TRL 1.x, `pip install 'corral[trl]'`).

    from trl import GRPOConfig, GRPOTrainer
    from corral.integrations import trl as ctrl

    # single-turn envs: the env's verifiers are TRL reward functions
    ids = ["corral/arithmetic-v0"]
    GRPOTrainer(model, reward_funcs=ctrl.reward_funcs(ids), train_dataset=ctrl.env_dataset(ids),
                args=GRPOConfig(...))

    # multi-turn envs: one env instance (and sandbox) per rollout; its tools are TRL tools and
    # its verifiers score the rollout (`get_reward`)
    GRPOTrainer(model, environment_factory=ctrl.environment_factory("corral/term-files-v0"),
                train_dataset=ctrl.env_dataset(["corral/term-files-v0"]), args=GRPOConfig(...))

`env_dataset` rows are `prompt` (the env's first messages), `environment` (the env id) and
`task_index` (the task in the env's dataset; training rows never hold a task of the env's
eval split). Rewards are the env's own: the episode runs in the env (its sandbox, its
`max_turns`), and a rollout whose verifier broke or whose sandbox died scores None, which TRL
leaves out of the reward (as Corral's runner masks it from training).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
import re
from typing import Any, Callable, ClassVar, Sequence

from corral import splits
from corral.sync import run_sync
from corral.errors import AgentError, AuthoringError, DatasetError, InfraError
from corral.registry import make
from corral.types import ToolCall

# JSON schema types -> the Python hints transformers turns back into the same schema
_JSON_TYPES: dict[str, type] = {"string": str, "number": float, "integer": int,
                                "boolean": bool, "array": list, "object": dict}
_RESERVED = ("reset", "get_reward")  # TRL's own names on an environment class


# --- data ----------------------------------------------------------------------------------------
def env_dataset(env_ids: Sequence[str], size: int = 64, *, split: str = "train",
                seed: int = 0) -> Any:
    """A `datasets.Dataset` of `size` tasks of each env (drawn with `seed`; repeated when the
    split holds fewer): `prompt` (chat messages), `environment`, `task_index`. `split`:
    "train" skips the env's eval tasks, "eval" takes only those, "all" any task."""
    from datasets import Dataset

    if split not in splits.SPLIT_NAMES:
        raise DatasetError(f"unknown split {split!r}; choose one of "
                           f"{', '.join(splits.SPLIT_NAMES)}")
    rows: dict[str, list[Any]] = {"prompt": [], "environment": [], "task_index": []}
    for env_id in env_ids:
        env = make(env_id)
        try:
            for index in _task_indices(env.tasks, size, split, seed, env_id):
                rows["prompt"].append(_first_messages(env, index))
                rows["environment"].append(env_id)
                rows["task_index"].append(index)
        finally:
            env.close()
    return Dataset.from_dict(rows)


def _task_indices(tasks: Any, size: int, split: str, seed: int, env_id: str) -> list[int]:
    rule = splits.rule_of(tasks)
    order = random.Random(seed).sample(range(len(tasks)), len(tasks))
    chosen: list[int] = []
    for index in order:
        if len(chosen) >= size:
            break
        if split == "all" or rule is None or rule.is_eval(tasks[index]) == (split == "eval"):
            chosen.append(index)
    if not chosen:
        raise DatasetError(f"the {split} split of {env_id} has no task"
                           + (" (it declares no eval split)" if rule is None else ""))
    return [chosen[i % len(chosen)] for i in range(size)]


def _first_messages(env: Any, index: int) -> list[dict[str, str]]:
    """The messages the agent sees before its first turn (built without a sandbox when the
    first user message is the instruction alone)."""
    if env.instruction_is_first_message:
        messages = [{"role": "system", "content": env.system_prompt}] if env.system_prompt else []
        return [*messages, {"role": "user", "content": env.instruction(env.tasks[index])}]
    env.reset(options={"task_index": index})
    return [{"role": m["role"], "content": str(m.get("content") or "")}
            for m in env.episode.messages]


def _completion_text(completion: Any) -> str:
    """A TRL completion (text, or conversational messages) as the text the env steps with."""
    if isinstance(completion, str):
        return completion
    texts = [str(m.get("content") or "") for m in completion if m.get("role") == "assistant"]
    return texts[-1] if texts else ""


def _episode_reward(env: Any) -> float | None:
    """The finished episode's reward; None when its verifier broke or its sandbox died."""
    episode = env.episode
    if episode is None or episode.verifier_error or episode.infra_error:
        return None
    return float(episode.reward)


# --- single-turn: reward functions ---------------------------------------------------------------
class EnvReward:
    """A TRL reward function that scores each completion with an env's own verifiers: the
    row's task is reset, the completion is the agent's one turn, the episode's reward is the
    score. Rows of other envs get None. Episodes run `concurrency` at a time; `overrides` go
    to `corral.make` (e.g. `backend="bwrap"`)."""

    def __init__(self, env_id: str, concurrency: int = 8, **overrides: Any) -> None:
        make(env_id, **overrides).close()  # an unknown id fails here, with "Did you mean"
        self.env_id, self.overrides = env_id, overrides
        self.__name__ = env_id  # TRL logs rewards under the function's name
        self.concurrency = concurrency
        self.last: list[float | None] = []  # the latest call's scores (for inspection)

    def __call__(self, prompts: list[Any], completions: list[Any], *,
                 environment: list[str] | None = None, task_index: list[int] | None = None,
                 **kwargs: Any) -> list[float | None]:
        if task_index is None:
            raise DatasetError("the train dataset has no task_index column: build it with "
                               "corral.integrations.trl.env_dataset")
        envs = environment or [self.env_id] * len(completions)
        self.last = run_sync(self._score_all([
            (int(index), _completion_text(c)) if env_id == self.env_id else None
            for c, env_id, index in zip(completions, envs, task_index)]))
        return list(self.last)

    async def _score_all(self, jobs: list[tuple[int, str] | None]) -> list[float | None]:
        gate = asyncio.Semaphore(self.concurrency)

        async def score(job: tuple[int, str] | None) -> float | None:
            if job is None:
                return None
            async with gate:
                return await self._score(*job)

        return list(await asyncio.gather(*(score(job) for job in jobs)))

    async def _score(self, index: int, text: str) -> float | None:
        env = await asyncio.to_thread(make, self.env_id, **self.overrides)
        try:
            await env.areset(options={"task_index": index})
            await env.astep(text)
            if not env.episode.done:  # a multi-turn env scored on one turn: that was the answer
                await env.afinish(truncated=False)
            return _episode_reward(env)
        except InfraError:
            return None  # the sandbox died: masked, as the runner masks infra errors
        finally:
            await env.aclose()


def reward_funcs(env_ids: Sequence[str], concurrency: int = 8,
                 **overrides: Any) -> list[EnvReward]:
    """One `EnvReward` per env id, for `GRPOTrainer(reward_funcs=...)`."""
    return [EnvReward(env_id, concurrency, **overrides) for env_id in env_ids]


# --- multi-turn: tool environments ---------------------------------------------------------------
class CorralEnvironment:
    """Base of the classes `environment_factory` makes: one Corral env instance per rollout.

    TRL calls `reset(**row)` before a rollout, the public methods as tools (each one turn of
    the env: the tool runs in the env's sandbox), and `get_reward()` once the model stops
    calling tools (the env's final verifiers; the sandbox is released then)."""

    env_id: ClassVar[str]
    make_kwargs: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        self._env = make(self.env_id, **self.make_kwargs)
        self._train = splits.train_view(self._env.tasks)  # data-free rows draw from these
        self._rng = random.Random()

    def reset(self, **row: Any) -> str | None:
        """Start an episode on the row's task (`task_index`, else a random training task);
        returns the first user message unless the row's prompt already carries it."""
        index = row.get("task_index")
        if index is not None:
            options: dict[str, Any] = {"task_index": int(index)}
        else:
            options = {"task": self._train[self._rng.randrange(len(self._train))]}
        observation, _ = self._env.reset(options=options)
        prompt = row.get("prompt")
        has_prompt = bool(prompt) and any(str(m.get("content") or "").strip()
                                          for m in prompt if isinstance(m, dict))
        return None if has_prompt else observation

    def get_reward(self) -> float | None:
        """The env's reward for this rollout (None: its verifier broke or its sandbox died)."""
        env = self._env
        try:
            if env.episode is not None and not env.episode.done:
                run_sync(env.afinish(truncated=False))  # the model stopped: that was its answer
            return _episode_reward(env)
        except InfraError:
            return None
        finally:
            env.close()  # the sandbox goes now, not at the next reset

    def _act(self, action: str | ToolCall) -> str:
        episode = self._env.episode
        if episode is None or episode.done:
            raise AgentError("the episode is over; stop calling tools")
        try:
            observation, *_ = self._env.step(action)
        except InfraError as exc:
            raise AgentError(f"the environment failed: {exc}") from None
        return observation


def environment_factory(env_ids: str | Sequence[str], **overrides: Any) -> Any:
    """For `GRPOTrainer(environment_factory=...)`: the class of one env id (calling it makes an
    instance), or `{env id: class}` for several (rows pick theirs by `environment`).
    `overrides` go to `corral.make` (e.g. `backend="bwrap"`).

    The env's tools become methods with the same names, arguments and descriptions; an env
    without tools (a text game) gets one tool, `reply(message)`, that sends a message."""
    if isinstance(env_ids, str):
        return environment_class(env_ids, **overrides)
    return {env_id: environment_class(env_id, **overrides) for env_id in env_ids}


def environment_class(env_id: str, **overrides: Any) -> type[CorralEnvironment]:
    """A `CorralEnvironment` subclass for `env_id`, with one method per tool of the env."""
    probe = make(env_id, **overrides)
    try:
        schemas = probe.tool_schemas()
    finally:
        probe.close()
    methods: dict[str, Any] = {}
    for schema in schemas:
        method = _tool_method(env_id, schema)
        methods[method.__name__] = method
    if not methods:
        methods["reply"] = _reply
    name = "".join(part.title() for part in re.split(r"[^A-Za-z0-9]+", env_id.split("/")[-1]))
    return type(name or "Env", (CorralEnvironment,), {
        "env_id": env_id, "make_kwargs": dict(overrides), **methods,
        "__doc__": f"TRL environment of {env_id} (class name: its reward's name in TRL logs)"})


def _reply(self, message: str) -> str:  # `self` unannotated: transformers skips it
    """Send a message to the environment and get its answer.

    Args:
        message: what you say (your answer or your next move).
    """
    return self._act(message)


_reply.__name__ = _reply.__qualname__ = "reply"  # the tool's name as TRL shows it


def _tool_method(env_id: str, schema: dict[str, Any]) -> Callable[..., str]:
    """A method that runs the env's tool `schema` as one turn, with a signature and a
    Google-style docstring from which transformers rebuilds the same JSON schema."""
    function = schema.get("function", schema)
    name = str(function["name"])
    if not name.isidentifier() or name.startswith("_") or name in _RESERVED:
        raise AuthoringError(f"tool {name!r} of {env_id} cannot be a TRL tool method (the name "
                             "must be an identifier, not private, not reset/get_reward)")
    params = function.get("parameters") or {}
    required = set(params.get("required", ()))
    signature = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    hints: dict[str, Any] = {"return": str}
    doc_args = []
    for arg, prop in (params.get("properties") or {}).items():
        if not arg.isidentifier():
            raise AuthoringError(f"argument {arg!r} of tool {name!r} ({env_id}) is not an "
                                 "identifier; TRL tools take keyword arguments")
        kind = prop.get("type")
        hint: Any = _JSON_TYPES.get(kind, str) if isinstance(kind, str) else str
        default = inspect.Parameter.empty if arg in required else prop.get("default")
        if arg not in required and default is None:
            hint = hint | None
        hints[arg] = hint
        signature.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY,
                                           default=default, annotation=hint))
        text = " ".join(str(prop.get("description") or f"the {arg}").split())
        if "enum" in prop:
            text += f" (choices: {json.dumps(prop['enum'])})"
        doc_args.append(f"    {arg}: {text}")
    description = " ".join(str(function.get("description") or name).split())

    def method(self: CorralEnvironment, **arguments: Any) -> str:
        return self._act(ToolCall(name=name, arguments=arguments))

    method.__name__ = method.__qualname__ = name
    method.__doc__ = description + ("\n\nArgs:\n" + "\n".join(doc_args) if doc_args else "")
    method.__signature__ = inspect.Signature(signature)  # type: ignore[attr-defined]
    method.__annotations__ = hints
    return method


def hermes_tool_parsing(tokenizer: Any) -> Any:
    """Tell TRL how to read tool calls from a ChatML template with Hermes-style
    `<tool_call>{"name": ..., "arguments": ...}</tool_call>` blocks (Corral's tiny model, and
    Qwen-style templates TRL does not recognise by their exact text). TRL sets this itself for
    the templates it knows; returns `tokenizer`."""
    from trl import chat_template_utils as templates

    if getattr(templates, "_SUPPORTS_RESPONSE_TEMPLATE", False):
        tokenizer.response_template = templates.qwen3_template
    else:
        tokenizer.response_schema = templates.qwen3_schema
    return tokenizer


__all__ = ["CorralEnvironment", "EnvReward", "env_dataset", "environment_class",
           "environment_factory", "hermes_tool_parsing", "reward_funcs"]
