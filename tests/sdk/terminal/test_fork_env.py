"""An env's side of a fork (issue 32): `Env.on_fork` restarts what setup left running in each
child; an env whose setup leaves a process running and that has no `on_fork` says it is not
forkable and refuses to fork."""

from __future__ import annotations

import asyncio

import pytest

import corral as cr
from corral.errors import AuthoringError

# a service setup starts: it rewrites /tmp/beat every 20 ms while it runs
SERVICE = "nohup sh -c 'while :; do date +%s%N > /tmp/beat; sleep 0.02; done' >/dev/null 2>&1 &"


@cr.environment("tests/term-service-v0", tasks=[{"word": "x"}], max_turns=3)
class ServiceEnv(cr.TerminalEnv):
    """Setup starts a background service and writes a file."""

    async def setup(self, sandbox, task):
        await sandbox.write_file("/root/seed.txt", task.word)
        await sandbox.exec(SERVICE)

    def instruction(self, task):
        return "Keep the service up."


@cr.environment("tests/term-service-restart-v0", tasks=[{"word": "x"}], max_turns=3)
class RestartingEnv(ServiceEnv):
    """The same, with the hook that starts the service again in a fork."""

    async def on_fork(self, sandbox, task):
        await sandbox.exec(SERVICE)


@cr.environment("tests/term-quiet-v0", tasks=[{"word": "x"}], max_turns=3)
class QuietEnv(cr.TerminalEnv):
    """Setup writes a file and starts nothing."""

    async def setup(self, sandbox, task):
        await sandbox.write_file("/root/seed.txt", task.word)

    def instruction(self, task):
        return "Nothing to keep up."


async def beating(sandbox) -> bool:
    """Whether /tmp/beat changes within 2 s (the service runs)."""
    first = await sandbox.read_file("/tmp/beat")
    for _ in range(100):
        await asyncio.sleep(0.02)
        if await sandbox.read_file("/tmp/beat") != first:
            return True
    return False


async def test_on_fork_restarts_setups_service_in_each_child(sandboxes: str) -> None:
    plain = cr.make("tests/term-service-v0", backend="bwrap", run_id=sandboxes)
    restarting = cr.make("tests/term-service-restart-v0", backend="bwrap", run_id=sandboxes)
    quiet = cr.make("tests/term-quiet-v0", backend="bwrap", run_id=sandboxes)
    try:
        await asyncio.gather(plain.areset(), restarting.areset(), quiet.areset())
        assert not plain.forkable()
        with pytest.raises(AuthoringError, match="not forkable.*on_fork"):
            await plain.fork_sandbox(1)
        assert quiet.forkable() and restarting.forkable()
        (calm,) = await quiet.fork_sandbox(1)
        await calm.close()
        children = await restarting.fork_sandbox(2)
        try:
            for child in children:
                assert await child.read_file("/root/seed.txt") == b"x"
                assert await beating(child)
            assert await beating(restarting.episode.sandbox)  # the parent's runs on
        finally:
            await asyncio.gather(*(c.close() for c in children))
    finally:
        await asyncio.gather(plain.aclose(), restarting.aclose(), quiet.aclose())
