"""Router policy: least-outstanding for new sessions, stickiness, overload moves, cool-downs."""

from __future__ import annotations

import pytest

from corral.runner.policy.router import Router


class Clock:
    """A clock the test advances (the router's cool-down is time-based)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_new_sessions_go_to_the_least_loaded_replica() -> None:
    router = Router(["a", "b", "c"])
    held = [router.acquire(f"s{i}") for i in range(3)]
    assert sorted(held) == ["a", "b", "c"]  # one each, none doubled up
    router.acquire("s3")  # all at 1: tie broken by fewest served, then order -> "a"
    router.release("b")
    router.release("c")
    assert router.acquire("s4") == "b"  # b and c at 0; b has served no more than c
    assert router.acquire(None) == "c"
    assert router.stats.new_sessions == 5 and router.stats.sticky_hits == 0


def test_sessions_stick_to_their_replica() -> None:
    router = Router(["a", "b"])
    first = router.acquire("traj")
    router.release(first)
    for _ in range(3):
        other = router.acquire("other-" + str(_))  # load elsewhere does not pull it away
        assert router.acquire("traj") == first
        router.release(first)
        router.release(other)
    assert router.stats.sticky_hits == 3 and router.stats.moves == 0
    assert router.session_replica("traj") == first
    router.forget("traj")
    assert router.session_replica("traj") is None


def _spread(router: Router, n: int) -> dict[str, list[str]]:
    """Open n new sessions (least-loaded spreads them); returns replica -> sessions."""
    placed: dict[str, list[str]] = {}
    for i in range(n):
        placed.setdefault(router.acquire(f"s{i}"), []).append(f"s{i}")
    return placed


def test_overloaded_replica_loses_its_session_which_then_sticks_to_the_new_one() -> None:
    router = Router(["a", "b"], overload_factor=2.0, overload_slack=2)
    assert router.acquire("traj") == "a"
    router.release("a")
    placed = _spread(router, 6)  # a: 3 outstanding, b: 3
    for _ in placed["b"]:
        router.release("b")  # b's turns finish; a's are still decoding
    assert (router.outstanding("a"), router.outstanding("b")) == (3, 0)
    moved = router.acquire("traj")  # a: 3 > 2*0+2
    assert moved == "b" and router.stats.overload_moves == 1 and router.stats.moves == 1
    router.release("b")
    assert router.acquire("traj") == "b"  # sticky to its new replica
    assert router.stats.moves == 1 and router.stats.sticky_hits == 1


def test_load_within_the_threshold_keeps_stickiness() -> None:
    router = Router(["a", "b"], overload_factor=2.0, overload_slack=2)
    assert router.acquire("traj") == "a"
    router.release("a")
    placed = _spread(router, 6)  # a: 3, b: 3
    router.release("b")
    router.release("b")  # b: 1; a: 3 <= 2*1+2
    assert placed["a"] and router.acquire("traj") == "a"
    assert router.stats.moves == 0 and router.stats.sticky_hits == 1


def test_unhealthy_replicas_are_skipped_for_a_cooldown() -> None:
    clock = Clock()
    router = Router(["a", "b"], cooldown=5.0, clock=clock)
    assert router.acquire("traj") == "a"
    router.release("a")
    router.mark_unhealthy("a")
    assert router.acquire("traj") == "b" and router.stats.unhealthy_moves == 1
    router.release("b")
    assert router.acquire("new") == "b"  # a is cooling down even though it is idle
    router.release("b")
    clock.now = 6.0
    assert router.acquire("later") == "a"  # back after the cool-down
    # every replica down: use the one that recovers first instead of failing
    router.mark_unhealthy("b")
    clock.now = 7.0
    router.mark_unhealthy("a")
    assert router.acquire(None) == "b"


def test_exclude_skips_the_failed_replica_on_retry() -> None:
    router = Router(["a", "b"])
    assert router.acquire("t") == "a"
    router.release("a")
    assert router.acquire("t", exclude="a") == "b"
    assert Router(["only"]).acquire(None, exclude="only") == "only"


def test_bad_replica_lists() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Router([])
    with pytest.raises(ValueError, match="twice"):
        Router(["a", "a"])
