"""OpenEnv's `MCPToolClient` (openenv-core from PyPI) lists and calls a Corral env's tools over
`serve-env`'s OpenEnv WebSocket and its MCP JSON-RPC endpoint (`/mcp`)."""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import pytest
from openenv.core.mcp_client import MCPToolClient

import corral as cr

from .servers import Served, served

CALC = "test/openenv-tools-v0"


@cr.environment(CALC, tasks=[{"a": 17, "b": 25}], max_turns=4, override=True)
class ToolEnv(cr.TextEnv):
    """Add two numbers with the `add` tool."""

    def instruction(self, task: Any) -> str:
        return f"What is {task.a} + {task.b}?"

    @cr.tool
    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: the first number.
            b: the second number.
        """
        return str(a + b)


@pytest.fixture(scope="module")
def calc_server() -> Iterator[Served]:
    with served([CALC], max_sessions=2) as server:
        yield server


async def test_mcp_tool_client_lists_and_calls_tools(calc_server: Served) -> None:
    async with MCPToolClient(base_url=f"{calc_server.url}/openenv/{CALC}") as client:
        tools = await client.list_tools()
        assert [t.name for t in tools] == ["add"]
        assert tools[0].description.startswith("Add two integers")
        assert set(tools[0].input_schema["properties"]) == {"a", "b"}
        assert await client.call_tool("add", a=17, b=25) == "42"
        with pytest.raises(RuntimeError, match="Unknown tool 'ad'.*tool_not_found"):
            await client.call_tool("ad", a=1, b=2)
        with pytest.raises(RuntimeError, match="invalid_args"):
            await client.call_tool("add", a="x")


def test_http_step_without_reset_and_a_bad_action_as_openenvs_server(calc_server: Served) -> None:
    """OpenEnv's stateless `/step` steps a fresh env (no `/reset` needed); an action it
    cannot read is a 422."""
    import httpx

    base = f"{calc_server.url}/openenv/{CALC}"
    step = httpx.post(f"{base}/step", json={"action": {"name": "add",
                                                       "arguments": {"a": 2, "b": 3}}})
    assert step.status_code == 200 and step.json()["observation"]["text"] == "5", step.text
    assert step.json()["done"] is False
    tools = httpx.post(f"{base}/step", json={"action": {"type": "list_tools"}}).json()
    assert [t["name"] for t in tools["observation"]["tools"]] == ["add"]
    assert httpx.post(f"{base}/step", json={"action": {"nope": 1}}).status_code == 422
    assert httpx.post(f"{base}/step", json={"action": "add"}).status_code == 422
    assert calc_server.manager.sessions == {}


async def test_mcp_json_rpc_endpoint_serves_openenvs_production_client(
        calc_server: Served) -> None:
    """`POST {base}/mcp`: OpenEnv's `MCPToolClient` in production mode opens a session with
    `openenv/session/create`, lists and calls tools by JSON-RPC, and closes it on close."""
    client = MCPToolClient(base_url=f"{calc_server.url}/openenv/{CALC}")
    client.use_production_mode = True  # openenv-core's switch to its HTTP /mcp path
    try:
        tools = await client.list_tools()
        assert [(t.name, sorted(t.input_schema["properties"])) for t in tools] == [
            ("add", ["a", "b"])]
        assert len(calc_server.manager.sessions) == 1  # the client's session lives on
        assert await client.call_tool("add", a=17, b=25) == "42"
        with pytest.raises(RuntimeError, match=r"Tool 'ad' failed: Unknown tool 'ad'"):
            await client.call_tool("ad", a=1)
    finally:
        await client.close()
    assert calc_server.manager.sessions == {}


def test_mcp_json_rpc_errors_and_stateless_calls(calc_server: Served) -> None:
    import httpx

    url = f"{calc_server.url}/openenv/{CALC}/mcp"

    def rpc(body: Any) -> dict[str, Any]:
        response = httpx.post(url, content=body if isinstance(body, bytes) else None,
                              json=None if isinstance(body, bytes) else body)
        assert response.status_code == 200, response.text
        return response.json()

    call = rpc({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "add", "arguments": {"a": 2, "b": 3}}})
    assert call == {"jsonrpc": "2.0", "id": 7, "result": "5"}  # a fresh env, closed after
    assert calc_server.manager.sessions == {}
    codes = {"parse": rpc(b"{nope")["error"]["code"],
             "request": rpc({"method": "tools/list"})["error"]["code"],
             "method": rpc({"jsonrpc": "2.0", "id": 1, "method": "tools/nope"})["error"]["code"],
             "session": rpc({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
                             "params": {"session_id": "gone"}})["error"]["code"],
             "args": rpc({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                          "params": {"name": "add", "arguments": {"a": "x"}}})["error"]["code"]}
    assert codes == {"parse": -32700, "request": -32600, "method": -32601, "session": -32602,
                     "args": -32602}


async def test_mcp_json_rpc_over_a_websocket_is_one_session(calc_server: Served) -> None:
    import json

    import websockets

    url = calc_server.url.replace("http://", "ws://") + f"/openenv/{CALC}/mcp"
    async with websockets.connect(url) as ws:
        async def rpc(method: str, **params: Any) -> dict[str, Any]:
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method,
                                      "params": params}))
            return json.loads(await ws.recv())

        own = (await rpc("openenv/session/create"))["result"]["session_id"]
        assert list(calc_server.manager.sessions) == [own]
        assert [t["name"] for t in (await rpc("tools/list"))["result"]["tools"]] == ["add"]
        assert (await rpc("tools/call", name="add", arguments={"a": 1, "b": 2}))["result"] == "3"
        assert (await rpc("openenv/session/close", session_id=own))["error"]["code"] == -32600
    for _ in range(100):  # the server closes the connection's session as it sees it go
        if not calc_server.manager.sessions:
            break
        await asyncio.sleep(0.05)
    assert calc_server.manager.sessions == {}
