"""OpenEnv's own client (openenv-core from PyPI) drives Corral envs through `serve-env`."""

from __future__ import annotations

import re

import httpx
from openenv.core import GenericEnvClient

from .servers import GAME, TEXT, Served, served, wait_until


async def test_openenv_client_plays_an_episode(text_server: Served) -> None:
    host = text_server.url.removeprefix("http://")
    # OpenEnv's client has no auth option: the token rides as the URL's Basic-auth password
    base = f"http://corral:sekret@{host}/openenv/{GAME}"
    async with GenericEnvClient(base_url=base) as client:
        first = await client.reset(seed=3, task_index=0)
        assert "Guess it" in first.observation["text"] and not first.done
        assert first.observation["tools"] == []
        low, high = map(int, re.search(r"between (\d+) and (\d+)",
                                       first.observation["text"]).groups())
        result = None
        for _ in range(8):  # play it properly: binary search on higher/lower
            guess = (low + high) // 2
            result = await client.step({"text": str(guess)})
            if result.done:
                break
            if result.observation["text"] == "higher":
                low = guess + 1
            else:
                high = guess - 1
        assert result is not None and result.done
        assert result.observation["info"]["rewards"]["solved"] == 1.0
        state = await client.state()
        assert state["env_id"] == GAME and state["step_count"] >= 1
        try:
            await client.step({"text": "3"})
        except RuntimeError as exc:  # OpenEnv's client raises its server's errors so
            assert "episode is over" in str(exc)
        else:
            raise AssertionError("a step after the end was accepted")
        try:
            await client.step({"txt": "3"})
        except RuntimeError as exc:
            assert "VALIDATION_ERROR" in str(exc)
    await wait_until(lambda: text_server.manager.sessions == {})


def test_openenv_sync_client_and_http_routes(text_server: Served) -> None:
    host = text_server.url.removeprefix("http://")
    with GenericEnvClient(base_url=f"http://:sekret@{host}/openenv/{TEXT}").sync() as client:
        result = client.reset(seed=1)
        assert "Reply with the number only" in result.observation["text"]
        assert client.step({"text": "-1"}).done
    auth = {"Authorization": "Bearer sekret"}
    base = f"{text_server.url}/openenv/{TEXT}"
    assert httpx.get(f"{base}/health", headers=auth).json() == {"status": "healthy"}
    schema = httpx.get(f"{base}/schema", headers=auth).json()
    assert set(schema["action"]["properties"]) >= {"text", "name", "arguments"}
    reset = httpx.post(f"{base}/reset", json={"seed": 2}, headers=auth).json()
    assert reset["done"] is False and reset["observation"]["text"]
    assert httpx.post(f"{base}/reset", json={}).status_code == 401
    assert text_server.manager.sessions == {}


async def test_openenv_capacity_is_shared() -> None:
    with served([TEXT], max_sessions=1) as server:
        base = f"{server.url}/openenv/{TEXT}"
        async with GenericEnvClient(base_url=base) as first:
            await first.reset(seed=0)
            async with GenericEnvClient(base_url=base) as second:
                try:
                    await second.reset(seed=0)
                except RuntimeError as exc:
                    assert "CAPACITY_REACHED" in str(exc)
                else:
                    raise AssertionError("a second session was opened beyond max_sessions")
        await wait_until(lambda: server.manager.sessions == {})
