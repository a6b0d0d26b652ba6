"""Policy arguments out of range are refused where they are given (docs/policies.md), not found
later as requests that fail every retry or a decode thread that never answers."""

from __future__ import annotations

from typing import Any

import pytest

from corral.runner import LocalPolicy, OpenAIPolicy
from corral.runner.policy.scripted import ByteTokenizer


@pytest.mark.parametrize("urls", ["http://", "127.0.0.1:8000", "ftp://host", "http://a b",
                                  "http://host:99999", ["http://host:1", 5]])
def test_openai_policy_refuses_a_url_that_is_not_http(urls: Any) -> None:
    """These were accepted; each request then failed ("failed mid-request") and was retried."""
    with pytest.raises(ValueError, match="not an http:// or https:// URL|must be a string"):
        OpenAIPolicy(urls, ByteTokenizer(), model="m")


@pytest.mark.parametrize("kwargs, field", [
    ({"retries": -1}, "retries"), ({"retries": 1.5}, "retries"), ({"timeout": 0}, "timeout"),
    ({"timeout": float("nan")}, "timeout"), ({"connect_timeout": -1}, "connect_timeout"),
    ({"backoff": -0.1}, "backoff"), ({"max_backoff": float("inf")}, "max_backoff")])
def test_openai_policy_refuses_retry_settings_out_of_range(kwargs: dict[str, Any],
                                                           field: str) -> None:
    """`retries=-1` made every request fail "after 0 attempts"; `timeout=0` is aiohttp's "no
    timeout at all"."""
    with pytest.raises(ValueError, match=f"^{field} must be"):
        OpenAIPolicy("http://127.0.0.1:8000", ByteTokenizer(), model="m", **kwargs)


def test_openai_policy_accepts_the_documented_forms() -> None:
    policy = OpenAIPolicy(["http://gpu1:8000", "https://gpu2:8000/v1/", "http://[::1]:9"],
                          ByteTokenizer(), retries=0, timeout=300)
    assert policy.base_urls == ["http://gpu1:8000", "https://gpu2:8000", "http://[::1]:9"]


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_local_policy_refuses_threads_below_one(threads: Any) -> None:
    """`threads=0` was accepted; the decode thread's `torch.set_num_threads(0)` then raised and
    every `generate()` waited forever."""
    with pytest.raises(ValueError, match="threads must be an integer of at least 1"):
        LocalPolicy("tiny", threads=threads)
