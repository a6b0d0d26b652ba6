"""SandboxPool: pre-warming, reuse after reset, replacement of broken sandboxes, capacity."""

from __future__ import annotations

import asyncio

import pytest

from corral.errors import InfraError
from corral.runner.pool import SandboxPool
from corral.sandbox.spec import Terminal

from runner_helpers import SPEC, DirOpener, FileEnv


async def test_prewarm_fills_ahead_of_demand_and_refills(opener: DirOpener) -> None:
    async with SandboxPool(4, opener=opener) as pool:
        await pool.prewarm(SPEC, 3, wait=True)
        assert pool.warm_count(SPEC) == 3 and pool.stats.starts == 3
        env = FileEnv()
        sandbox = await pool.acquire(SPEC, env)
        assert sandbox in opener.opened and pool.stats.warm_hits == 1
        await pool.prewarm(SPEC, 3, wait=True)  # the background refill restores the target
        assert pool.warm_count(SPEC) == 3 and pool.stats.starts == 4
        assert pool.live == 4 and pool.in_use == 1
        await pool.release(sandbox, env, reusable=False)
        await pool.drain()
        assert sandbox.closed and pool.live == 3


async def test_reusable_sandbox_is_reset_and_handed_out_again(opener: DirOpener) -> None:
    async with SandboxPool(2, opener=opener) as pool:
        env = FileEnv()
        first = await pool.acquire(SPEC, env)
        await first.write_file("left-over.txt", "x")
        await pool.release(first, env, reusable=True)
        await pool.drain()
        second = await pool.acquire(SPEC, env)
        assert second is first and first.resets == 1
        assert not (first.root / "left-over.txt").exists()  # reset as the env declares
        assert pool.stats.reuses == 1 and pool.stats.starts == 1


async def test_broken_sandboxes_are_replaced(opener: DirOpener) -> None:
    async with SandboxPool(2, opener=opener) as pool:
        await pool.prewarm(SPEC, 1, wait=True)
        dead = opener.opened[0]
        dead.kill()  # dies while idle in the warm set
        sandbox = await pool.acquire(SPEC, FileEnv())
        assert sandbox is not dead and sandbox.alive
        assert pool.stats.failures == 1 and pool.stats.replaced == 1
        await pool.drain()
        assert dead.closed

        # a sandbox whose reset fails is not reused either
        await pool.release(sandbox, BadReset(), reusable=True)
        await pool.drain()
        assert sandbox.closed and pool.stats.replaced == 2 and pool.stats.failures == 2
        fresh = await pool.acquire(SPEC, FileEnv())  # the warm target (1) was kept up
        assert fresh not in (dead, sandbox) and fresh.alive and pool.stats.reuses == 0


class BadReset(FileEnv):
    async def reset_sandbox(self, sandbox) -> None:  # type: ignore[no-untyped-def]
        raise OSError("could not clean the work directory")


async def test_capacity_admission_blocks_until_release(opener: DirOpener) -> None:
    env = FileEnv()
    async with SandboxPool(2, opener=opener) as pool:
        a = await pool.acquire(SPEC, env)
        b = await pool.acquire(SPEC, env)
        third = asyncio.ensure_future(pool.acquire(SPEC, env))
        done, _ = await asyncio.wait([third], timeout=0.3)
        assert not done and pool.live == 2  # over capacity: it waits
        await pool.release(a, env, reusable=False)
        c = await asyncio.wait_for(third, 10)
        assert c not in (a, b) and pool.live == 2 and pool.in_use == 2
        assert len(pool.stats.wait_seconds) == 3 and max(pool.stats.wait_seconds) > 0.2


async def test_a_sandbox_being_removed_holds_no_capacity(opener: DirOpener) -> None:
    env = FileEnv()
    async with SandboxPool(1, opener=opener) as pool:
        first = await pool.acquire(SPEC, env)
        first.close_gate = asyncio.Event()  # its removal hangs until we say so
        await pool.release(first, env, reusable=False)
        second = await asyncio.wait_for(pool.acquire(SPEC, env), 10)
        assert second is not first and not first.closed  # did not wait for the removal
        assert pool.live == 1 and pool.in_use == 1
        first.close_gate.set()
        await pool.drain()
        assert first.closed and pool.live == 1 and pool.stats.closes == 1


async def test_prewarming_follows_demand(opener: DirOpener) -> None:
    waiting = [0]
    async with SandboxPool(4, opener=opener) as pool:
        await pool.prewarm(SPEC, 3, wait=True, demand=lambda: waiting[0])
        assert pool.warm_count(SPEC) == 0 and pool.stats.starts == 0  # nobody waits: none
        waiting[0] = 2
        await pool.prewarm(SPEC, 3, wait=True, demand=lambda: waiting[0])
        assert pool.warm_count(SPEC) == 2  # capped by the work waiting, not the target
        env = FileEnv()
        waiting[0] = 0  # both waiting items are admitted and take the warm ones
        taken = [await pool.acquire(SPEC, env) for _ in range(2)]
        assert pool.stats.warm_hits == 2
        for sandbox in taken:  # the run ends: releases start no replacements
            await pool.release(sandbox, env, reusable=False)
        await pool.drain()
        assert pool.stats.starts == 2 and pool.warm_count(SPEC) == 0 and pool.live == 0


async def test_warm_sandbox_of_another_spec_is_evicted(opener: DirOpener) -> None:
    other = Terminal(image="corral-test/other:0")
    async with SandboxPool(1, opener=opener) as pool:
        await pool.prewarm(other, 1, wait=True)
        sandbox = await asyncio.wait_for(pool.acquire(SPEC, FileEnv()), 10)
        assert pool.stats.evictions == 1 and sandbox is not opener.opened[0]
        await pool.drain()
        assert opener.opened[0].closed


async def test_start_failure_raises_infra_error_and_frees_capacity(opener: DirOpener) -> None:
    opener.fail_next = 1
    async with SandboxPool(1, opener=opener) as pool:
        with pytest.raises(InfraError):
            await pool.acquire(SPEC, FileEnv())
        assert pool.live == 0 and pool.stats.failures == 1
        sandbox = await pool.acquire(SPEC, FileEnv())  # capacity was given back
        assert sandbox.alive


async def test_refill_starts_what_a_rise_in_demand_wants_at_once(opener: DirOpener) -> None:
    """Demand rises outside the pool (an episode goes on deck): `refill` starts its sandbox
    then, instead of at the pool's next acquire or release."""
    waiting = [0]
    async with SandboxPool(4, opener=opener) as pool:
        await pool.prewarm(SPEC, 3, wait=True, demand=lambda: waiting[0])
        waiting[0] = 2
        await asyncio.sleep(0.05)
        assert pool.stats.starts == 0  # the pool cannot see the rise by itself
        pool.refill(SPEC)
        await pool.drain()
        assert pool.stats.starts == 2 and pool.warm_count(SPEC) == 2
