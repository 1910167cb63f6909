"""Dataclass records to and from JSON-ready dicts, strictly: a missing or unknown key is an error that names it.

Results files are records (``compare``'s ``results.json`` and what it holds), so a renamed field fails where
the file is read, with the field's path, and not after every run has trained. Fields may be dataclasses,
``list``/``tuple``/``dict`` of them, ``X | None``, and JSON scalars; ``Any`` passes through unchanged.
:func:`check_keys` is the unknown-key half alone, for settings a user writes (a config file's table, a model's
options) that build a dataclass directly and are validated by its own ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

R = TypeVar("R")


def to_dict(record: Any) -> Any:
    """A record as JSON-ready values: dataclasses become dicts (fields only), tuples become lists."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: to_dict(getattr(record, f.name)) for f in dataclasses.fields(record)}
    if isinstance(record, (list, tuple)):
        return [to_dict(item) for item in record]
    if isinstance(record, dict):
        return {key: to_dict(value) for key, value in record.items()}
    return record


def from_dict(cls: type[R], data: Any, where: str = "") -> R:
    """Rebuild a ``cls`` record from :func:`to_dict`'s output, checking keys and types on the way."""
    return _build(cls, data, where or cls.__name__)


def check_keys(cls: type, data: Mapping[str, Any], what: str, where: str = "") -> None:
    """Refuse the keys of ``data`` that are no field of the dataclass ``cls``, naming them and the allowed fields
    (``what`` names the keys, e.g. "[train] setting(s)"; ``where``, when given, leads the message): ``cls(**data)``
    would raise a TypeError naming only the first and not what is allowed."""
    unknown = _unknown_keys(cls, data)
    if unknown:
        allowed = sorted(_init_fields(cls)) or "none"
        raise ValueError(f"{where + ': ' if where else ''}unknown {what} {unknown}; allowed: {allowed}")


def _init_fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _unknown_keys(cls: type, data: Mapping[str, Any]) -> list[str]:
    return sorted(set(data) - set(_init_fields(cls)))


def _build(annotation: Any, data: Any, where: str) -> Any:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        (inner,) = [arg for arg in args if arg is not type(None)]
        return _build(inner, data, where)
    if dataclasses.is_dataclass(annotation):
        _expect(isinstance(data, dict), where, "an object", data)
        fields = _init_fields(annotation)
        missing = sorted(name for name, f in fields.items() if name not in data and _required(f))
        unknown = _unknown_keys(annotation, data)
        if missing or unknown:
            raise ValueError(f"{where}: missing field(s) {missing}, unknown field(s) {unknown}")
        hints = typing.get_type_hints(annotation)
        values = {name: _build(hints[name], value, f"{where}.{name}") for name, value in data.items()}
        return annotation(**values)
    if origin in (list, tuple):
        _expect(isinstance(data, list), where, "a list", data)
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            _expect(len(data) == len(args), where, f"a list of {len(args)}", data)
            return tuple(
                _build(arg, item, f"{where}[{i}]") for i, (arg, item) in enumerate(zip(args, data, strict=True))
            )
        items = [_build(args[0], item, f"{where}[{i}]") for i, item in enumerate(data)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        _expect(isinstance(data, dict), where, "an object", data)
        return {key: _build(args[1], value, f"{where}.{key}") for key, value in data.items()}
    if annotation is float:
        _expect(isinstance(data, (int, float)) and not isinstance(data, bool), where, "a number", data)
        return float(data)
    _expect(
        isinstance(data, annotation) and not (annotation is int and isinstance(data, bool)),
        where,
        annotation.__name__,
        data,
    )
    return data


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _expect(ok: bool, where: str, what: str, data: Any) -> None:
    if not ok:
        raise ValueError(f"{where}: expected {what}, got {type(data).__name__} {str(data)[:80]!r}")
