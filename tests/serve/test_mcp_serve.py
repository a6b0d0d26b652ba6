"""`corral serve-env ID --mcp stdio` driven by the mcp SDK's real client over stdio: tools
listed and called, the episode's reward read back; the sandbox gone when the client goes."""

from __future__ import annotations

import json
import sys

from mcp import Client, StdioServerParameters

from corral.sandbox.bwrap import sandboxes_dir

from .mcp_envs import HERE

CLI = [sys.executable, "-m", "corral.cli"]


def serve_env(*args: str) -> StdioServerParameters:
    return StdioServerParameters(command=CLI[0], args=[*CLI[1:], *args])


def text(result: object) -> str:
    return "\n".join(block.text for block in result.content)  # type: ignore[attr-defined]


async def test_an_mcp_client_plays_an_episode_and_reads_its_reward() -> None:
    params = serve_env("-i", str(HERE / "mcp_calc_env.py"), "serve-env", "test/mcp-calc-v0",
                       "--mcp", "stdio")
    async with Client(params) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(tools) == {"corral_reset", "corral_submit", "add"}
        assert tools["add"].input_schema["required"] == ["a", "b"]
        resources = {r.uri for r in (await client.list_resources()).resources}
        assert resources == {"corral://episode", "corral://env"}

        early = await client.call_tool("add", {"a": 1, "b": 2})
        assert early.is_error and "call corral_reset first" in text(early)

        # bad arguments, as on HTTP (400): named, with the valid range
        for index in (7, -1):
            bad_index = await client.call_tool("corral_reset", {"task_index": index})
            assert bad_index.is_error, text(bad_index)
            assert f"invalid arguments for corral_reset: task_index {index} is out of range" \
                in text(bad_index) and "task_index must be 0 to 1" in text(bad_index)
        started = await client.call_tool("corral_reset", {"task_index": 0})
        assert not started.is_error and "What is 17 + 25?" in text(started)
        assert started.structured_content["max_turns"] == 4

        summed = await client.call_tool("add", {"a": 17, "b": 25})
        assert not summed.is_error and text(summed) == "42"
        bad = await client.call_tool("add", {"a": "seventeen"})
        assert bad.is_error and "Invalid arguments for tool 'add'" in text(bad)
        typo = await client.call_tool("ad", {"a": 1})
        assert typo.is_error and "Did you mean 'add'" in text(typo)

        state = json.loads((await client.read_resource("corral://episode")).contents[0].text)
        assert state["turn"] == 2 and not state["done"]

        submitted = await client.call_tool("corral_submit", {"answer": "42"})
        assert not submitted.is_error and "reward 1" in text(submitted)
        assert submitted.structured_content["reward"] == 1.0
        assert submitted.structured_content["rewards"] == {"correct": 1.0}
        state = json.loads((await client.read_resource("corral://episode")).contents[0].text)
        assert state["done"] and state["reward"] == 1.0

        after = await client.call_tool("add", {"a": 1, "b": 1})
        assert after.is_error and "the episode is over; call corral_reset" in text(after)
        # another episode on the same connection, answered wrong
        await client.call_tool("corral_reset", {"task_index": 1})
        wrong = await client.call_tool("corral_submit", {"answer": "6"})
        assert wrong.structured_content["reward"] == 0.0


async def test_a_terminal_env_over_mcp_closes_its_sandbox_with_the_client(base_image: str
                                                                          ) -> None:
    def ours() -> set[str]:
        root = sandboxes_dir()
        return {p.name for p in root.glob("serve-env-mcp-*")} if root.exists() else set()

    before = ours()
    params = serve_env("serve-env", "corral/term-files-v0", "--mcp", "stdio",
                       "--backend", "bwrap")
    async with Client(params) as client:
        assert {"bash", "write_file"} <= {t.name for t in (await client.list_tools()).tools}
        await client.call_tool("corral_reset", {"task_index": 0})
        assert len(ours() - before) == 1, "the episode's sandbox is not there"
        shell = await client.call_tool("bash", {"command": "echo hello from $HOSTNAME"})
        assert "hello from sandbox" in text(shell) and "[exit code 0]" in text(shell)
    assert ours() == before, "the sandbox outlived its MCP client"


def test_bad_mcp_options_fail_in_one_line() -> None:
    from typer.testing import CliRunner

    from corral.cli import app

    for args, code, expected in (  # usage errors exit 2, an unknown backend name too
            (["--mcp", "stdi"], 2, "--mcp stdi: unknown transport. Did you mean 'stdio'?"),
            (["corral/guess-number-v0", "--mcp", "stdio"], 2, "--mcp stdio serves one env; got 2"),
            (["--backend", "bwrp"], 2, "no sandbox backend is named 'bwrp'"),  # before listening
            (["--backend", "bwrp", "--mcp", "stdio"], 2, "Did you mean 'bwrap'?"),
    ):
        run = CliRunner().invoke(app, ["serve-env", "corral/arithmetic-v0", *args])
        assert run.exit_code == code, run.output
        assert expected in " ".join(run.output.split())
