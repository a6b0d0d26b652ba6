"""Task filters by field: `where` (equality, a list meaning any of) and `lengths` (len()).

    matches(task, {"operation": "reverse"}, {"words": 3})
    parse_where(["operation=reverse", "len(words)=3"], sample_task)
        -> ({"operation": "reverse"}, {"words": 3})

Dotted names reach into nested fields (`params.mode`). `parse_where` types each value like the
task field it filters (an int field compares with an int, `true`/`false` for bools, a JSON
list for a list field), so `--where n=3` matches a task whose `n` is the integer 3.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import DatasetError
from .suggest import closest

__all__ = ["MISSING", "field_value", "matches", "parse_where"]

MISSING = object()


def field_value(task: Any, dotted: str) -> Any:
    """The value of a (dotted) field of `task`, or `MISSING`."""
    value = task
    for name in dotted.split("."):
        value = value.get(name, MISSING) if isinstance(value, dict) else \
            getattr(value, name, MISSING)
        if value is MISSING:
            return MISSING
    return value


def matches(task: Any, where: dict[str, Any], lengths: dict[str, int] | None = None) -> bool:
    """Whether `task` has every `where` value (a list: any of them) and every `lengths` len."""
    for name, wanted in where.items():
        value = field_value(task, name)
        if value is MISSING or (value not in wanted if isinstance(wanted, list)
                                else value != wanted):
            return False
    for name, length in (lengths or {}).items():
        value = field_value(task, name)
        if value is MISSING or not hasattr(value, "__len__") or len(value) != length:
            return False
    return True


def _typed(raw: str, like: Any, name: str) -> Any:
    try:
        if isinstance(like, bool):
            if raw.lower() not in ("true", "false"):
                raise ValueError(raw)
            return raw.lower() == "true"
        if isinstance(like, (int, float)):
            return type(like)(raw)
        if isinstance(like, (list, dict)):
            return json.loads(raw)
    except (ValueError, json.JSONDecodeError):
        raise DatasetError(f"--where {name}={raw}: the task field {name!r} holds "
                           f"{type(like).__name__} values (e.g. {like!r})") from None
    return raw


def parse_where(items: list[str], sample: Any) -> tuple[dict[str, Any], dict[str, int]]:
    """`NAME=VALUE` / `len(NAME)=N` strings → (`where`, `lengths`), typed like `sample`'s
    fields; a value of several comma-separated items means any of them (scalar fields)."""
    where: dict[str, Any] = {}
    lengths: dict[str, int] = {}
    fields = sample.fields() if hasattr(sample, "fields") else dict(sample)
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise DatasetError(f"--where {item!r}: write NAME=VALUE or len(NAME)=N")
        if name.startswith("len(") and name.endswith(")"):
            inner = name[4:-1]
            if field_value(sample, inner) is MISSING:
                raise DatasetError(f"--where: tasks have no field {inner!r}."
                                   f"{closest(inner, fields)}")
            if not raw.strip().isdigit():
                raise DatasetError(f"--where {item!r}: a length is a whole number")
            lengths[inner] = int(raw)
            continue
        like = field_value(sample, name)
        if like is MISSING:
            raise DatasetError(f"--where: tasks have no field {name!r}.{closest(name, fields)} "
                               f"Fields: {', '.join(sorted(fields))}")
        if "," in raw and not isinstance(like, (list, dict)):
            where[name] = [_typed(part.strip(), like, name) for part in raw.split(",")]
        else:
            where[name] = _typed(raw, like, name)
    return where, lengths
