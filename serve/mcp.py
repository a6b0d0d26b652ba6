"""`corral serve-env ID --mcp stdio`: one env session as an MCP server (extra `[mcp]`).

An MCP client (an agent host, `mcp.Client`) that starts `corral serve-env ID --mcp stdio`
gets one env instance, whose sandbox lives as long as the connection: when the client goes
away (stdin closes) the env and its sandbox are closed. What the client sees:

Tools
    `corral_reset(task_index?, seed?)`  start an episode (a fresh sandbox, the task's setup)
        and return the task's instruction; call it first, and again for another episode.
    every tool of the env (`env.tool_schemas()`, e.g. `bash`, `write_file`)  one step of the
        episode each: the result is the tool's output, an error result for the agent's mistakes
        (unknown tool, bad arguments, a call before `corral_reset`).
    `corral_submit(answer="")`  the agent's final message (what single-turn envs grade); the
        episode ends and its rewards run, and the result is the reward (text, and
        `structuredContent` with `reward`, `rewards`, `done`, ...). A multi-turn env that
        answers instead returns its reply and the episode goes on.

Resources
    `corral://episode`  the episode as JSON: task id, turn, done, reward, per-function
        rewards, errors (the reward is final once `done` is true).
    `corral://env`  the env's description (tasks, turn limit, tool schemas).

A step that ends the episode (the turn limit) also reports the reward in its result.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

import mcp_types as types
from mcp import MCPError
from mcp.server import Server
from mcp.server.stdio import stdio_server
from pydantic import ValidationError

from corral.errors import AgentError, AuthoringError, CorralError, InfraError, UnknownTool
from corral.serve import ops
from corral.serve.protocol import ProtocolError, ResetRequest
from corral.suggest import closest
from corral.types import ToolCall

__all__ = ["EpisodeTools", "build_mcp_server", "serve_stdio"]

log = logging.getLogger(__name__)

RESET, SUBMIT = "corral_reset", "corral_submit"
EPISODE_URI, ENV_URI = "corral://episode", "corral://env"

_RESET_SCHEMA = {
    "type": "object",
    "properties": {
        "task_index": {"type": "integer", "minimum": 0,
                       "description": "the task to start (default: one drawn from seed)"},
        "seed": {"type": "integer", "description": "seed for drawing the task"},
    },
}
_SUBMIT_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "default": "",
                              "description": "the final answer (empty: nothing to add)"}},
}


class EpisodeTools:
    """The MCP face of one env instance: its tools plus reset and submit, its episode as a
    resource. Transport-free (the MCP server's handlers call it), one call at a time."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self._lock = asyncio.Lock()
        own = {schema["function"]["name"] for schema in env.tool_schemas()}
        taken = own & {RESET, SUBMIT}
        if taken:
            raise AuthoringError(f"{env.env_id} has a tool named {sorted(taken)[0]!r}, which "
                                 "`serve-env --mcp` uses for the episode itself")

    def tools(self) -> list[dict[str, Any]]:
        """Every tool as `{name, description, inputSchema}`."""
        listed = [{"name": RESET, "inputSchema": _RESET_SCHEMA,
                   "description": "Start an episode of this environment and return the task's "
                                  "instruction. Call this first."},
                  {"name": SUBMIT, "inputSchema": _SUBMIT_SCHEMA,
                   "description": "End the episode with your final answer; returns the reward."}]
        for schema in self.env.tool_schemas():
            fn = schema["function"]
            listed.append({"name": fn["name"], "description": fn.get("description") or "",
                           "inputSchema": fn.get("parameters") or {"type": "object"}})
        return listed

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]
                                                                      | None, bool]:
        """Run one tool: (text, structured result or None, is_error)."""
        async with self._lock:
            try:
                if name == RESET:
                    return await self._reset(arguments)
                if name == SUBMIT:
                    return await self._step(str(arguments.get("answer") or ""))
                names = [schema["name"] for schema in self.tools()]
                if name not in names:  # not a step: the client asked for a tool it never saw
                    raise UnknownTool(f"Unknown tool '{name}'.{closest(name, names)} "
                                      f"Available tools: {', '.join(names)}.")
                return await self._step(ToolCall(name=name, arguments=arguments))
            except (AgentError, AuthoringError) as exc:
                return f"Error: {_agent_message(exc)}", None, True
            except ValidationError as exc:  # corral_reset's arguments
                problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                     for e in exc.errors())
                return f"Error: invalid arguments for {name}: {problems}", None, True
            except ProtocolError as exc:  # corral_reset's task_index out of range
                return f"Error: invalid arguments for {name}: {exc}", None, True
            except InfraError as exc:  # the sandbox or a tool server failed: not the agent's
                return f"Error (infrastructure, not your fault): {exc}", None, True

    async def _reset(self, arguments: dict[str, Any]) -> tuple[str, dict[str, Any], bool]:
        request = ResetRequest(task_index=arguments.get("task_index"),
                               seed=arguments.get("seed"))
        result = await ops.reset(self.env, request)
        return result.observation, {"task_id": result.episode.task_id,
                                    "instruction": result.observation,
                                    "max_turns": int(self.env.max_turns)}, False

    async def _step(self, action: Any) -> tuple[str, dict[str, Any] | None, bool]:
        if self.env.episode is None:
            raise AgentError(f"no episode yet: call {RESET} first")
        observation, _, _, _, _ = await self.env.astep(action)
        state = ops.episode_state(self.env).model_dump()
        # a tool's failure reaches the agent as an "Error: ..." observation (env semantics)
        failed = isinstance(action, ToolCall) and observation.startswith("Error: ")
        if not state["done"]:
            return observation, ({"done": False, "turn": state["turn"]}
                                 if not isinstance(action, ToolCall) else None), failed
        rewards = ", ".join(f"{k}: {v:g}" for k, v in state["rewards"].items())
        summary = (f"[episode over{' (turn limit)' if state['truncated'] else ''}: reward "
                   f"{state['reward']:g}{f' ({rewards})' if rewards else ''}]")
        text = f"{observation}\n{summary}" if observation else summary
        return text, state, failed

    def resources(self) -> list[dict[str, str]]:
        """The readable resources as `{uri, name, description}`."""
        return [{"uri": EPISODE_URI, "name": "episode",
                 "description": "The current episode as JSON: task, turn, done, reward."},
                {"uri": ENV_URI, "name": "env",
                 "description": "The environment: tasks, turn limit, tools."}]

    def read(self, uri: str) -> str:
        """A resource's JSON text; AgentError for a URI that is not one."""
        if uri == EPISODE_URI:
            if self.env.episode is None:
                return json.dumps({"episode": None, "hint": f"call {RESET} first"})
            return ops.episode_state(self.env).model_dump_json()
        if uri == ENV_URI:
            return ops.env_info(self.env).model_dump_json()
        raise AgentError(f"no resource {uri!r}; resources: {EPISODE_URI}, {ENV_URI}")


def _agent_message(exc: BaseException) -> str:
    text = str(exc)
    if "call reset() before" in text:  # the env's wording names its Python API
        return f"no episode yet: call {RESET} first"
    if "call reset() to start another" in text:
        return f"the episode is over; call {RESET} to start another"
    return text


def build_mcp_server(tools: EpisodeTools) -> Any:
    """A low-level `mcp` Server whose handlers call `tools`."""
    async def list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=[
            types.Tool(name=t["name"], description=t["description"], input_schema=t["inputSchema"])
            for t in tools.tools()])

    async def call_tool(ctx: Any, params: Any) -> Any:
        text, structured, is_error = await tools.call(params.name, dict(params.arguments or {}))
        return types.CallToolResult(content=[types.TextContent(text=text)],
                                    structured_content=structured, is_error=is_error)

    async def list_resources(ctx: Any, params: Any) -> Any:
        return types.ListResourcesResult(resources=[
            types.Resource(uri=r["uri"], name=r["name"], description=r["description"],
                           mime_type="application/json") for r in tools.resources()])

    async def read_resource(ctx: Any, params: Any) -> Any:
        try:
            text = tools.read(str(params.uri))
        except AgentError as exc:
            raise MCPError(types.INVALID_PARAMS, str(exc)) from None
        return types.ReadResourceResult(contents=[types.TextResourceContents(
            uri=str(params.uri), mime_type="application/json", text=text)])

    env = tools.env
    return Server(f"corral:{env.env_id}", version="1",
                  instructions=f"A Corral environment ({env.env_id}). Call {RESET} to start "
                               f"an episode, use the tools, then {SUBMIT}; the reward is in "
                               f"{SUBMIT}'s result and in the resource {EPISODE_URI}.",
                  on_list_tools=list_tools, on_call_tool=call_tool,
                  on_list_resources=list_resources, on_read_resource=read_resource)


async def serve_stdio(env_id: str, *, backend: str | None = None) -> None:
    """Serve one session of `env_id` over stdin/stdout until the client closes stdin; the
    env and its sandbox are closed then (sandboxes labelled `serve-env-mcp-<pid>`)."""
    from corral.registry import make

    config: dict[str, Any] = {"run_id": f"serve-env-mcp-{os.getpid()}"}
    if backend:
        config["backend"] = backend
    env = await asyncio.to_thread(make, env_id, **config)
    try:
        server = build_mcp_server(EpisodeTools(env))
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        try:
            await env.aclose()
        except CorralError as exc:
            log.warning("closing %s: %s", env_id, exc)
