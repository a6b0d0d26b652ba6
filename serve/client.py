"""`cr.remote(URL, ID)`: an env served by `corral serve-env`, with the API of `cr.make(ID)`.

    env = cr.remote("http://10.0.0.5:8010", "corral/term-files-v0", token="...")
    obs, info = env.reset(seed=0)                  # gymnasium API (and areset/astep/aclose)
    env.step('<tool_call>{"name": "bash", ...}</tool_call>')

A `RemoteEnv` mirrors the server's episode (`env.episode.messages`, rewards, turn, done), so
the runner's episode loop, `validate` and `play` drive it as they drive a local env. Its
server session (an env instance and its sandbox over there) opens at the first reset and
closes with `aclose()`. Calling a `RemoteEnv` makes another one of the same env, so it is
the `EnvFactory` that `Runner(envs=[...])` and `validate(...)` take. With several servers
(`Runner(env_servers=[...])`) each session goes to the server with most free capacity, and
a server that died is avoided by the retried episode (`corral.serve.pool`).
The oracle stays on the server: ask for it with `oracle=True` (validation does). With
`split="train"` (or "eval") the task index a reset draws is read in that split of the
server's dataset, so a trainer's rollouts never get a task of the env's eval split.
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

from corral.dataset import Dataset
from corral.env import Action, Env, Episode
from corral.errors import AgentError, AuthoringError
from corral.serve.connection import Connection, get_json
from corral.serve.pool import ServerPool
from corral.serve.protocol import EnvInfo, EpisodeState, ProtocolError
from corral.types import Task, ToolCall


class RemoteEnv(Env):
    """An env instance living on an env server (see module docstring)."""

    kind = "remote"
    sandbox_spec = None  # the server owns the sandboxes; the runner pools none for it

    def __init__(self, servers: ServerPool, info: EnvInfo, *, oracle: bool = False,
                 timeout: float = 600.0, split: str | None = None, **config: Any) -> None:
        ids = info.task_ids or [f"#{i}" for i in range(info.num_tasks)]  # see ops.env_info
        super().__init__(tasks=Dataset(lambda i: {"id": ids[i]}, info.num_tasks),
                         max_turns=info.max_turns)
        self.servers, self.info = servers, info
        self.env_id = info.env_id  # type: ignore[misc]
        self.kind = info.kind  # type: ignore[misc]
        self.system_prompt = info.system_prompt  # type: ignore[misc]
        self.pass_threshold = info.pass_threshold  # type: ignore[misc]
        self.reward_bounds = info.reward_bounds  # type: ignore[misc]
        self.tags = tuple(info.tags)  # type: ignore[misc]
        # the first user message is only known after the server's reset: no early generation
        self.instruction_is_first_message = False  # type: ignore[misc]
        self.oracle, self.timeout, self.split = oracle, timeout, split
        self.config = config
        self._conn: Connection | None = None
        self._solution: list[Any] | None = None

    def __call__(self, **config: Any) -> "RemoteEnv":
        """Another instance of this env (another server session): an `EnvFactory`."""
        return RemoteEnv(self.servers, self.info, oracle=self.oracle, timeout=self.timeout,
                         split=self.split)

    @property
    def server_url(self) -> str | None:
        """The server this instance's session is on (None before the first reset)."""
        return self._conn.url if self._conn is not None else None

    async def session_slots(self) -> int | None:
        """How many instances of this env can hold a server session at once now: the free
        slots of its servers (`--max-sessions` less the sessions open), None when no server
        answers. `validate` runs no more episodes at once, which a full server would refuse."""
        return await self.servers.free_slots()

    # --- session -------------------------------------------------------------------------------
    async def _session(self) -> Connection:
        if self._conn is None:
            self._conn = await self.servers.open_session(self.env_id, self.timeout)
        return self._conn

    async def _request(self, op: str, **fields: Any) -> Any:
        conn = await self._session()
        try:
            return await conn.request(op, **fields)
        except Exception as exc:
            # the session may be gone: open anew next time (not after the agent's mistake or a
            # request the server refused as malformed, which leave it as it was)
            if not isinstance(exc, (AgentError, ProtocolError)):
                await self._drop()
            raise

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self.servers.released(conn.url)
            await conn.close()

    def _mirror(self, state: dict[str, Any]) -> None:
        s = EpisodeState.model_validate(state)
        episode = self.episode
        assert episode is not None
        episode.turn, episode.done, episode.truncated = s.turn, s.done, s.truncated
        episode.reward, episode.rewards = s.reward, dict(s.rewards)
        episode.errors = list(s.errors)
        episode.infra_error, episode.verifier_error = s.infra_error, s.verifier_error
        episode.verify_span = s.verify_span

    # --- the Env API ---------------------------------------------------------------------------
    def instruction(self, task: Task) -> str:
        episode = self.episode
        if episode is not None and episode.task.id == task.id:
            for message in episode.messages:
                if message["role"] == "user":
                    return str(message.get("content") or "")
        return ""

    async def areset(self, *, seed: int | None = None,
                     options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode on the server (the task is picked here, as `make`'s env picks it)."""
        import gymnasium

        gymnasium.Env.reset(self, seed=seed)
        options = options or {}
        if "task" in options:
            raise AgentError("a remote env runs the server's tasks: pick one by task_index")
        index = options.get("task_index")
        if index is None:  # as Env.pick_task draws it
            index = int(self.np_random.integers(len(self.tasks)))
        result = await self._request("reset", seed=seed, task_index=int(index),
                                     with_solution=self.oracle, max_turns=self.max_turns,
                                     **({"split": self.split} if self.split else {}))
        task = Task(id=result["episode"]["task_id"])  # the server's id (large datasets)
        self.episode = Episode(task=task, messages=list(result["messages"]))
        self._mirror(result["episode"])
        self._solution = result.get("solution")
        return result["observation"], result["info"]

    async def astep(self, action: Action) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One action, run by the server's env; the reply updates the mirrored episode."""
        if self.episode is None:
            raise AgentError("call reset() before step()")
        result = await self._request("step", action=_wire_action(action))
        self.episode.messages.extend(result["messages"])
        self._mirror(result["episode"])
        return (result["observation"], result["reward"], result["terminated"],
                result["truncated"], result["info"])

    async def afinish(self, *, truncated: bool = True) -> dict[str, Any]:
        if self.episode is None:
            raise AgentError("call reset() before finish()")
        result = await self._request("finish", truncated=truncated)
        self._mirror(result["episode"])
        return result["info"]

    async def aclose(self) -> None:
        """Close the server session (its env and sandbox) and the connection."""
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(Exception):  # a dead server has nothing left to close
                await conn.request("close")
            await self._drop()

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> str:
        result = await self._request("tool", name=name, arguments=arguments or {})
        return str(result["output"])

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [dict(schema) for schema in self.info.tools]

    @property
    def tool_names(self) -> list[str]:
        return [s.get("function", s).get("name", "") for s in self.info.tools]

    def solution(self, task: Task) -> list[Any]:
        """The oracle's actions, sent by the server at reset when `oracle=True`."""
        if self._solution is None:
            raise AuthoringError(f"the oracle of {self.env_id} stays on the server; use "
                                 "cr.remote(url, id, oracle=True) to fetch it at reset")
        return [ToolCall(**a) if isinstance(a, dict) else a for a in self._solution]

    def random_action(self, task: Task, rng: Any) -> Action:
        names = self.tool_names
        if names and rng.random() < 0.5:
            return ToolCall(name=rng.choice(sorted(names)), arguments={})
        return "".join(rng.choice("0123456789 abcdefghij") for _ in range(rng.randint(1, 8)))


def _wire_action(action: Action) -> Any:
    if isinstance(action, str):
        return action
    if isinstance(action, ToolCall):
        return action.model_dump()
    if isinstance(action, dict):
        return {"name": action["name"], "arguments": action.get("arguments", {})}
    return [a.model_dump() if isinstance(a, ToolCall) else a for a in action]


def remote(url: str | list[str], env_id: str, *, token: str | None = None,
           oracle: bool = False, timeout: float = 600.0, wait: float = 0.0) -> RemoteEnv:
    """The env `env_id` served at `url` (or spread over several servers' URLs), with the API
    of `cr.make(env_id)`. Unknown ids fail here with the server's "Did you mean". `wait`:
    seconds a reset may wait for a session slot on full servers (0: `EnvServerBusy` at once);
    `timeout`: seconds one operation (a step) may take."""
    servers = ServerPool([url] if isinstance(url, str) else list(url), token=token, wait=wait)
    info = servers.describe(env_id)
    return RemoteEnv(servers, info, oracle=oracle, timeout=timeout)


def remote_entries(entries: Sequence[Any], servers: Sequence[str] | ServerPool | None,
                   token: str | None = None, **options: Any) -> list[Any]:
    """`Runner` env entries with every env id replaced by a `RemoteEnv` over `servers` (a
    list of URLs or a `ServerPool`; factories pass through); the entries unchanged when there
    are no servers. `options` go to each `RemoteEnv` (`split`, `oracle`)."""
    if not servers:
        return list(entries)
    pool = servers if isinstance(servers, ServerPool) else ServerPool(
        list(servers), token=token, wait=600.0)  # wait as for sandbox admission
    out: list[Any] = []
    for entry in entries:
        if isinstance(entry, str):
            out.append(RemoteEnv(pool, pool.describe(entry), **options))
        else:
            out.append(entry)
    return out


__all__ = ["RemoteEnv", "remote", "remote_entries", "get_json"]
