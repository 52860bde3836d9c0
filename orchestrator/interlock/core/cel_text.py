"""CEL evaluation errors as a manifest's author reads them.

The expression engine (celpy) words its errors in Python: ``StringType('alice') with type:
'<class 'celpy.celtypes.StringType'>' does not support field selection``. The run's log
keeps the error as it was recorded (a replay must find the very same records), and what is
shown to people (the CLI, the console, ``describe``, ``explain``) goes through
:func:`plain_cel_error`: the value's type in CEL's words (``string``, ``int``, ``map``...),
the operator as written in the expression, the value as JSON would show it. Text that is
not one of celpy's errors comes back as it was, so it can be applied to any message.
"""

from __future__ import annotations

import re

_CEL_TYPES = {
    "BoolType": "bool",
    "BytesType": "bytes",
    "DoubleType": "double",
    "DurationType": "duration",
    "IntType": "int",
    "ListType": "list",
    "MapType": "map",
    "NullType": "null",
    "StringType": "string",
    "TimestampType": "timestamp",
    "UintType": "uint",
    "TypeType": "type",
}

_OPERATORS = {
    "relation_lt": "<",
    "relation_le": "<=",
    "relation_gt": ">",
    "relation_ge": ">=",
    "relation_eq": "==",
    "relation_ne": "!=",
    "relation_in": "in",
    "addition_add": "+",
    "addition_sub": "-",
    "multiplication_mul": "*",
    "multiplication_div": "/",
    "multiplication_mod": "%",
    "unary_not": "!",
    "unary_neg": "-",
}

_CLASS = re.compile(r"<class '(?:celpy\.celtypes\.)?(\w+)'>")
_SCALAR = re.compile(r"\b(String|Int|Uint|Double|Bool)Type\(([^()]*)\)")
_FIELD = re.compile(
    r"(?P<value>\w+Type\(.*?\)) with type: '(?P<type><class '[\w.]+'>)' "
    r"does not support field selection"
)
_OVERLOAD = re.compile(
    r"found no matching overload for (?:Token\('RULE', )?'?(?P<op>\w+)'?\)? "
    r"applied to '\((?P<types>[^']*(?:'[^']*'[^']*)*?)\)'"
)
_MEMBER = re.compile(r"no such member in mapping: (?P<key>'[^']*'|\"[^\"]*\")")
_FIXED = {
    "no such key": "no such key in the map",
    "no such overload": "no function or method of that name takes arguments of these types",
    "invalid_argument": "an index out of range, or an argument of the wrong type",
    "return error for overflow": "a value that does not convert, or is out of range",
    "modulus or divide by zero": "division by zero",
    "divide by zero": "division by zero",
}


def _type_name(cls: str) -> str:
    return _CEL_TYPES.get(cls, cls.removesuffix("Type").lower())


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1] in "aeiou" else f"a {noun}"


def _types(text: str) -> str:
    """``<class 'celpy.celtypes.StringType'>`` -> ``string``, throughout ``text``."""
    return _CLASS.sub(lambda m: _type_name(m[1]), text)


def _value(text: str) -> str:
    """``StringType('alice')`` -> ``'alice'``, ``IntType(3)`` -> ``3``."""
    return _SCALAR.sub(lambda m: m[2], text)


def plain_cel_error(message: str) -> str:
    """``message`` with celpy's Python words put in CEL's (see the module)."""
    found = _FIELD.search(message)
    if found is not None:
        cel_type = _types(found["type"])
        wrapped = re.fullmatch(r"\w+Type\((.*)\)", found["value"])
        value = _value(wrapped[1] if wrapped else found["value"])
        said = f"field selection on {_a(cel_type)} ({value}): {_a(cel_type)} has no fields"
        return message[: found.start()] + said + message[found.end() :]
    found = _OVERLOAD.search(message)
    if found is not None:
        op = _OPERATORS.get(found["op"], found["op"])
        kinds = _types(found["types"]).replace(", ", " and ")
        said = f"no `{op}` for {kinds}"
        return message[: found.start()] + said + message[found.end() :]
    found = _MEMBER.search(message)
    if found is not None:
        said = f"no field {found['key']} (the map has no such key)"
        return message[: found.start()] + said + message[found.end() :]
    head, sep, error = message.rpartition(": ")
    if error in _FIXED:
        return f"{head}{sep}{_FIXED[error]}"
    return _value(_types(message))
