"""Typed inputs: the types an input may declare, and whether a value is of one. Pure."""

from __future__ import annotations

import re
from typing import Any

_SCALARS: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "int": (int,),
    "number": (int, float),
    "float": (int, float),
    "boolean": (bool,),
    "bool": (bool,),
    "object": (dict,),
    "map": (dict,),
    "list": (list,),
    "any": (object,),
}
_LIST = re.compile(r"^list\[(.+)\]$")


def known_type(type_name: str) -> bool:
    """Whether an input type is one the language knows."""
    inner = _LIST.match(type_name)
    if inner:
        return known_type(inner.group(1).strip())
    return type_name in _SCALARS


def type_matches(type_name: str, value: Any) -> bool:
    """Whether ``value`` is of the declared input type (``list[string]`` checks items)."""
    inner = _LIST.match(type_name)
    if inner:
        return isinstance(value, list) and all(
            type_matches(inner.group(1).strip(), v) for v in value
        )
    allowed = _SCALARS.get(type_name, (object,))
    if bool not in allowed and isinstance(value, bool) and type_name != "any":
        return False  # true is not an integer here, whatever Python says
    return isinstance(value, allowed)


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__
