"""Limits on sampling parameters, checked before a request can reach a decode batch.

A request breaking one is refused alone, with a one-line `ValueError` naming the field, the
allowed range and the value sent. `LocalPolicy.validate` and serve-policy's wire models
(`corral.runner.policy.wire`) call the same functions, so an HTTP client and an in-process
caller read the same sentence.
"""

from __future__ import annotations

import math
from typing import Any

from .base import GenerationRequest

__all__ = ["MAX_SEED", "MAX_STOP_CHARS", "MAX_STOP_STRINGS", "MAX_TEMPERATURE", "MAX_TOKENS",
           "MIN_TEMPERATURE", "check_max_tokens", "check_sampling", "check_seed", "check_stop",
           "check_temperature", "check_top_p", "seed_for_sample"]

# 0 means greedy. Between 0 and this, `logits / temperature` overflows fp32 for ordinary
# logits (1e-300 gives inf, then NaN log-probabilities); vLLM clamps at the same value.
MIN_TEMPERATURE = 1e-2
# Above this the distribution is uniform to fp32 precision: a larger value is a mistake.
MAX_TEMPERATURE = 100.0
# torch generators take a signed 64-bit seed on some versions and unsigned on others; the
# non-negative int64 range is accepted by all of them (2**64 overflows them all).
MAX_SEED = 2**63 - 1
# An absolute bound for models that do not state their context length.
MAX_TOKENS = 1 << 20
# Every decode step searches the decoded text for each stop string: bound the work.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024


def _finite(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return number


def check_temperature(value: Any) -> float:
    """`value` as a temperature: 0 (greedy) or in [MIN_TEMPERATURE, MAX_TEMPERATURE]."""
    t = _finite("temperature", value)
    if t != 0.0 and not MIN_TEMPERATURE <= t <= MAX_TEMPERATURE:
        raise ValueError(f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, "
                         f"{MAX_TEMPERATURE:g}], got {value!r}")
    return t


def check_top_p(value: Any) -> float:
    """`value` as a nucleus mass in (0, 1]."""
    p = _finite("top_p", value)
    if not 0.0 < p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {value!r}")
    return p


def check_seed(value: Any) -> int | None:
    """`value` as a generator seed in [0, MAX_SEED], or None (the policy's own generator)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise ValueError(f"seed must be an integer in [0, 2**63 - 1], got {value!r}")
    return value


def check_max_tokens(value: Any) -> int:
    """`value` as a generation length in [1, MAX_TOKENS] (the model's context is checked by
    the policy, which knows it)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKENS:
        raise ValueError(f"max_tokens must be an integer in [1, {MAX_TOKENS}], got {value!r}")
    return value


def check_stop(value: list[str]) -> list[str]:
    """`value` as stop strings: at most MAX_STOP_STRINGS, each at most MAX_STOP_CHARS long."""
    if len(value) > MAX_STOP_STRINGS:
        raise ValueError(f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(value)}")
    longest = max((len(s) for s in value), default=0)
    if longest > MAX_STOP_CHARS:
        raise ValueError(f"stop strings must be at most {MAX_STOP_CHARS} characters, got one "
                         f"of {longest}")
    return value


def seed_for_sample(seed: int | None, index: int) -> int | None:
    """The seed of sample `index` of a seeded request: samples differ, and the sum wraps so a
    seed near MAX_SEED stays in range."""
    return None if seed is None else (seed + index) % (MAX_SEED + 1)


def check_sampling(request: GenerationRequest) -> None:
    """Raise `ValueError` (one line) when a sampling field of `request` is out of range."""
    check_temperature(request.temperature)
    check_top_p(request.top_p)
    check_seed(request.seed)
    check_max_tokens(request.max_tokens)
    check_stop(request.stop)
