"""What a session can do to its env, transport-free: HTTP routes and WebSocket messages both
call these, so the two protocols cannot drift apart."""

from __future__ import annotations

import math
from typing import Any

from corral import splits
from corral.dataset import ExplicitEval
from corral.errors import AgentError, DatasetError
from corral.serve.protocol import (
    EnvInfo,
    EpisodeState,
    FinishRequest,
    ProtocolError,
    ResetRequest,
    ResetResult,
    StepRequest,
    StepReply,
    ToolRequest,
)
from corral.types import ToolCall

__all__ = ["TASK_IDS_INLINE", "call_tool", "env_info", "episode_state", "finish", "reset",
           "split_task", "state", "step"]


# Task ids are listed for datasets up to this size; beyond it building them would read the
# whole dataset (100k generated tasks: seconds), so clients learn each id at reset instead.
TASK_IDS_INLINE = 2000


def env_info(env: Any) -> EnvInfo:
    """The description a client needs to stand in for `make(env_id)` (one per env id)."""
    size = len(env.tasks)
    ids = [env.tasks[i].id for i in range(size)] if size <= TASK_IDS_INLINE else []
    return EnvInfo(env_id=str(env.env_id), kind=str(getattr(env, "kind", "base")),
                   num_tasks=size, task_ids=ids,
                   max_turns=int(env.max_turns), system_prompt=env.system_prompt,
                   tools=env.tool_schemas(),
                   instruction_is_first_message=bool(env.instruction_is_first_message),
                   pass_threshold=float(env.pass_threshold), reward_bounds=env.reward_bounds,
                   tags=list(env.tags))


def episode_state(env: Any) -> EpisodeState:
    episode = env.episode
    if episode is None:
        raise AgentError("no episode: send reset first")
    return EpisodeState(task_id=episode.task.id, turn=episode.turn, done=episode.done,
                        truncated=episode.truncated, reward=_finite(episode.reward),
                        rewards={k: _finite(v) for k, v in episode.rewards.items()},
                        errors=list(episode.errors), infra_error=episode.infra_error,
                        verifier_error=episode.verifier_error, verify_span=episode.verify_span)


def _finite(value: float) -> float:
    value = float(value)
    return value if math.isfinite(value) else 0.0


def _solution(env: Any) -> list[Any]:
    """The oracle's actions for the current task, as JSON (tool calls as dicts)."""
    actions = env.solution(env.episode.task)
    if isinstance(actions, str):
        actions = [actions]
    return [a.model_dump() if isinstance(a, ToolCall) else a for a in actions]


async def reset(env: Any, request: ResetRequest) -> ResetResult:
    """Start an episode; a `task_index` outside the env's tasks is a `ProtocolError`."""
    options = {"task_index": request.task_index} if request.task_index is not None else None
    size = len(env.tasks)
    if request.task_index is not None and not 0 <= request.task_index < size:
        # a malformed request (HTTP 400), not the agent's mistake
        raise ProtocolError(f"task_index {request.task_index} is out of range: {env.env_id} "
                            f"has {size} tasks, so task_index must be 0 to {size - 1}")
    if request.split is not None:
        options = {"task": split_task(env, request.split, request.task_index or 0)}
    if request.max_turns is not None:
        env.max_turns = request.max_turns
    observation, info = await env.areset(seed=request.seed, options=options)
    return ResetResult(observation=observation, info=info,
                       messages=[dict(m) for m in env.episode.messages],
                       episode=episode_state(env),
                       solution=_solution(env) if request.with_solution else None)


def split_task(env: Any, split: str, index: int) -> Any:
    """The first task of `split` ("train" or "eval") at or after `index` (wrapping), as
    `corral.splits.train_view` reads a dataset. An env that declares no eval split has every
    task in both (a trainer then holds out by seed, as it does in-process)."""
    tasks = env.tasks
    rule = splits.rule_of(tasks)
    if split == "train" or rule is None:
        return splits.train_view(tasks)[index]
    if isinstance(rule, ExplicitEval):
        return rule.tasks[index % len(rule.tasks)]
    for step in range(len(tasks)):
        task = tasks[(index + step) % len(tasks)]
        if rule.is_eval(task):
            return task
    raise DatasetError(f"the eval split of {env.env_id} has no task")


async def step(env: Any, request: StepRequest) -> StepReply:
    action = request.action
    if not isinstance(action, str):
        calls = action if isinstance(action, list) else [action]
        action = [ToolCall(**c.model_dump()) for c in calls]
    before = len(env.episode.messages) if env.episode is not None else 0
    observation, reward, terminated, truncated, info = await env.astep(action)
    return StepReply(observation=observation, reward=_finite(reward), terminated=terminated,
                      truncated=truncated, info=info,
                      messages=[dict(m) for m in env.episode.messages[before:]],
                      episode=episode_state(env))


async def call_tool(env: Any, request: ToolRequest) -> dict[str, Any]:
    return {"output": await env.call_tool(request.name, request.arguments)}


async def finish(env: Any, request: FinishRequest) -> dict[str, Any]:
    info = await env.afinish(truncated=request.truncated)
    return {"info": info, "episode": episode_state(env).model_dump()}


async def state(env: Any) -> dict[str, Any]:
    return {"episode": episode_state(env).model_dump(),
            "messages": [dict(m) for m in env.episode.messages]}
