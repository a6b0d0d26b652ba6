"""Flags generated from `TrainConfig`'s fields, so `corral train` can set every field a Python
caller can, and a field added to the model gets its flag (typed, with its description as the
help) without an edit here.

A scalar field (`int`, `float`, `str`, `bool`, `Path`, a `Literal` of choices, any of these
`| None`) gets `--field-name VALUE` (bools: `--x/--no-x`; a `Literal` lists its choices); a
list of those a repeatable option; a structured field (a `dict`, a pydantic model) a
repeatable `--field-name KEY=VALUE` whose values are read as JSON where they parse (`3`,
`0.5`, `true`, `[1,2]`) and as text otherwise (a `dict[str, str]`'s keys and values as
written); any other type its JSON text. Bounds and cross-field checks stay in the model:
its errors are reported under the flag's name (`corral.cli.train.flag_of`).
"""

from __future__ import annotations

import enum
import inspect
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from .common import parse_items

__all__ = ["SCALARS", "field_kind", "field_values", "generated_options", "is_structured",
           "is_text_map", "kebab", "option_for", "parse_items", "unwrap_optional"]

SCALARS = (int, float, str, bool, Path)


def kebab(name: str) -> str:
    """`sft_lr` -> `--sft-lr`."""
    return "--" + name.replace("_", "-")


def unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """(`X`, True) for `X | None`; (annotation, False) otherwise."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(annotation)) == 2:
            return args[0], True
    return annotation, False


def is_structured(annotation: Any) -> bool:
    """Whether a field is set by `KEY=VALUE` items (a dict or a pydantic model)."""
    inner, _ = unwrap_optional(annotation)
    return typing.get_origin(inner) is dict or inner is dict or (
        isinstance(inner, type) and issubclass(inner, BaseModel))


def is_text_map(info: FieldInfo) -> bool:
    """Whether an items field maps names to text (`dict[str, str]`): its items are read
    as written (`parse_items(text=True)`)."""
    inner, _ = unwrap_optional(info.annotation)
    return typing.get_origin(inner) is dict and typing.get_args(inner) == (str, str)


def _help(info: FieldInfo, suffix: str = "") -> str:
    text = (info.description or "").strip()
    if text[1:2].islower():  # "vLLM replicas" keeps its case
        text = text[:1].upper() + text[1:]
    if text and not text.endswith("."):
        text += "."
    return (text + suffix).strip()


def _choices(name: str, annotation: Any) -> Any:
    """An Enum of a `Literal`'s values (typer lists them as the choices), else `annotation`."""
    if typing.get_origin(annotation) is Literal:
        values = {str(c): str(c) for c in typing.get_args(annotation)}
        return enum.Enum(f"{name}_choices", values, type=str)
    return annotation


def field_kind(info: FieldInfo) -> str:
    """How a field is set: "items" (KEY=VALUE), "list" (repeatable), "scalar" or "json"."""
    inner, _ = unwrap_optional(info.annotation)
    if is_structured(info.annotation):
        return "items"
    if typing.get_origin(inner) is list and len(typing.get_args(inner)) == 1:
        item = typing.get_args(inner)[0]
        return "list" if item in SCALARS or typing.get_origin(item) is Literal else "json"
    return "scalar" if inner in SCALARS or typing.get_origin(inner) is Literal else "json"


def option_for(name: str, info: FieldInfo, flag: str) -> inspect.Parameter:
    """The typer option (as a function parameter) that sets field `name` of the model."""
    inner, optional = unwrap_optional(info.annotation)
    default = None if info.is_required() or info.default_factory is not None else info.default
    kind, extra, suffix = field_kind(info), {}, ""
    if kind == "items":
        annotation: Any = list[str]
        default, extra = [], {"metavar": "KEY=VALUE", "show_default": False}
        suffix = (" KEY=VALUE, repeatable (values as text)." if is_text_map(info) else
                  " KEY=VALUE, repeatable (values as JSON where they parse).")
    elif kind == "list":
        annotation = list[_choices(name, typing.get_args(inner)[0])]  # type: ignore[misc]
        default, suffix = None, " Repeatable."
    elif kind == "scalar":
        annotation = _choices(name, inner)
        if default is not None and annotation is not inner:
            default = annotation(str(default))
    else:  # any other type: its JSON text, validated by the model
        annotation, default, extra = str, None, {"metavar": "JSON"}
        suffix = " (JSON)."
    decls = [f"{flag}/--no-{flag[2:]}"] if annotation is bool else [flag]
    if optional and annotation is not bool and default is None:
        annotation = Union[annotation, None]
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
        default=typer.Option(default, *decls, help=_help(info, suffix), **extra))


def generated_options(model: type[BaseModel], skip: set[str], flags: dict[str, str]
                      ) -> list[inspect.Parameter]:
    """One option per field of `model` not in `skip`, in declaration order."""
    return [option_for(name, info, flags.get(name, kebab(name)))
            for name, info in model.model_fields.items() if name not in skip]


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def field_values(model: type[BaseModel], values: dict[str, Any], flags: dict[str, str]
                 ) -> dict[str, Any]:
    """Generated options' values as model field values: structured items parsed, JSON text
    decoded, unset options (None, or no items) left out so the model's defaults apply."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if value is None or (isinstance(value, (list, tuple)) and not value):
            continue
        kind = field_kind(model.model_fields[name])
        if kind == "items":
            out[name] = parse_items(flags.get(name, kebab(name)), list(value),
                                    text=is_text_map(model.model_fields[name]))
        elif kind == "json":
            try:
                out[name] = json.loads(value)
            except json.JSONDecodeError:
                out[name] = value
        else:
            out[name] = _plain(value)
    return out
