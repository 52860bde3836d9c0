"""The rule ``gate-outcome-impossible``: a transition taken on an answer that the state's
capability can never give. Pure.

A capability whose AgentDef output schema fixes a field to a few values (``enum`` or
``const``: a gate that answers ``passed`` or ``implementation-failure``), or bounds a number
(``minimum``/``maximum``, exclusive or not), says what it can never answer. A
``task.completed`` transition whose guard can hold for none of the answers the schema
allows could never fire, and a run would wait there for an answer that never comes.

Guards are read only when the whole guard is made of comparisons of ``result.<field>``
with literals (``==``, ``!=``, ``in [...]``, ``<``, ``<=``, ``>``, ``>=``), joined by
``&&``, ``||``, ``!`` and parentheses; anything else (a function, another variable, a
field the schema does not pin) makes that part "unknown", which may hold. A ``!`` is read
only before a parenthesised guard (or another ``!``): CEL binds it to the operand, so
``!result.flag != null`` is ``(!result.flag) != null``, which is not read. A guard is
refused only when, for every combination of the pinned fields' values, it is false: a
field missing from an answer makes the comparison an error, and an error never makes a
guard hold where a value would not, so no answer the schema allows could fire it.
"""

from __future__ import annotations

import codecs
import itertools
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from interlock.core import model
from interlock.core.rules import Report

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<field>result\.[A-Za-z_][A-Za-z0-9_]*)
    | (?P<text>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
    | (?P<number>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
    | (?P<word>true|false|null)\b
    | (?P<op>&&|\|\||==|!=|<=|>=|<|>|!|\(|\)|\[|\]|,|\bin\b)
    )""",
    re.VERBOSE,
)
_LIMIT = 4096
"""Combinations of pinned values tried at most; past it the guard is not judged."""

Atom = tuple[str, str, Any]
"""``(field, operator, literal)``: one comparison of ``result.<field>``."""


class _Unreadable(Exception):
    """The guard is not made only of comparisons the rule reads."""


@dataclass(frozen=True, slots=True)
class Domain:
    """What an output schema lets one field be: a few values, or a numeric range."""

    values: tuple[Any, ...] | None = None
    low: float | None = None
    low_open: bool = False
    high: float | None = None
    high_open: bool = False


def _tokens(guard: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(guard):
        if guard[pos:].strip() == "":
            break
        match = _TOKEN.match(guard, pos)
        if match is None or match.end() == pos:
            raise _Unreadable(guard[pos:])
        kind = match.lastgroup or ""
        out.append((kind, match.group(kind)))
        pos = match.end()
    return out


class _Parser:
    """``or := and ('||' and)*; and := unary ('&&' unary)*; unary := '!' unary |
    '(' or ')' | comparison``; a comparison names ``result.<field>`` on one side."""

    def __init__(self, guard: str) -> None:
        self.tokens = _tokens(guard)
        self.i = 0

    def parse(self) -> Any:
        tree = self.disjunction()
        if self.i != len(self.tokens):
            raise _Unreadable("trailing")
        return tree

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.i] if self.i < len(self.tokens) else ("", "")

    def take(self, value: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if not token[0] or (value is not None and token[1] != value):
            raise _Unreadable(value or "end")
        self.i += 1
        return token

    def disjunction(self) -> Any:
        parts = [self.conjunction()]
        while self.peek()[1] == "||":
            self.take()
            parts.append(self.conjunction())
        return parts[0] if len(parts) == 1 else ("or", parts)

    def conjunction(self) -> Any:
        parts = [self.unary()]
        while self.peek()[1] == "&&":
            self.take()
            parts.append(self.unary())
        return parts[0] if len(parts) == 1 else ("and", parts)

    def unary(self) -> Any:
        if self.peek()[1] == "!":
            self.take()
            if self.peek()[1] not in ("!", "("):
                # CEL binds `!` to the operand: `!result.flag != null` is `(!result.flag) != null`.
                raise _Unreadable("!")
            return ("not", self.unary())
        if self.peek()[1] == "(":
            self.take()
            inner = self.disjunction()
            self.take(")")
            return inner
        return self.comparison()

    def comparison(self) -> Any:
        left = self.operand()
        op = self.take()
        if op[0] != "op" or op[1] not in ("==", "!=", "<", "<=", ">", ">=", "in"):
            raise _Unreadable(op[1])
        right = self.operand()
        if isinstance(left, _Field) and not isinstance(right, _Field):
            return ("atom", (left.name, op[1], right))
        if isinstance(right, _Field) and not isinstance(left, _Field) and op[1] != "in":
            flipped = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}.get(op[1], op[1])
            return ("atom", (right.name, flipped, left))
        raise _Unreadable("comparison")

    def operand(self) -> Any:
        kind, text = self.take()
        if kind == "field":
            return _Field(text.removeprefix("result."))
        if kind == "op" and text == "[":
            items = []
            while self.peek()[1] != "]":
                items.append(self.literal(self.take()))
                if self.peek()[1] == ",":
                    self.take()
            self.take("]")
            return items
        return self.literal((kind, text))

    @staticmethod
    def literal(token: tuple[str, str]) -> Any:
        kind, text = token
        if kind == "text":
            return _text(text)
        if kind == "number":
            return json.loads(text)
        if kind == "word":
            return json.loads(text)
        raise _Unreadable(text)


def _text(token: str) -> str:
    """A CEL string literal's value (its escapes: ``\\"``, ``\\n``, ``\\x41``, ``\\u00e9``...);
    one that cannot be read with certainty is not judged."""
    inner = token[1:-1]
    if "\\" not in inner:
        return inner
    if not inner.isascii() or re.search(r"\\[^abfnrtv\\'\"xuU0-7]", inner):
        raise _Unreadable(token)
    try:
        return codecs.decode(inner, "unicode_escape")
    except UnicodeDecodeError as exc:
        raise _Unreadable(token) from exc


@dataclass(frozen=True, slots=True)
class _Field:
    name: str


def _atoms(tree: Any) -> Iterator[Atom]:
    if tree[0] == "atom":
        yield tree[1]
    elif tree[0] == "not":
        yield from _atoms(tree[1])
    else:
        for part in tree[1]:
            yield from _atoms(part)


_NUMBER = (int, float)


def _is_number(value: Any) -> bool:
    return isinstance(value, _NUMBER) and not isinstance(value, bool)


def _compare(value: Any, op: str, literal: Any) -> bool | None:
    """One comparison for a known value; None where CEL's answer is not certain."""
    if op == "in":
        if not isinstance(literal, list):
            return None
        return any(_same(value, item) for item in literal)
    if op in ("==", "!="):
        same = _same(value, literal)
        return same if op == "==" else not same
    numbers = _is_number(value) and _is_number(literal)
    if not numbers and not (isinstance(value, str) and isinstance(literal, str)):
        return None
    order = (value > literal) - (value < literal)
    return {"<": order < 0, "<=": order <= 0, ">": order > 0, ">=": order >= 0}.get(op)


def _same(a: Any, b: Any) -> bool:
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    return type(a) is type(b) and a == b


def _in_range(domain: Domain, op: str, literal: Any) -> bool | None:
    """A comparison of a number bounded by ``domain`` with a number: False when no number
    in range satisfies it, True when all do, None otherwise."""
    if not _is_number(literal):
        return None
    low, high = domain.low, domain.high
    if op in (">", ">="):
        if high is not None and (
            high < literal or (high == literal and (op == ">" or domain.high_open))
        ):
            return False
        return None
    if op in ("<", "<="):
        if low is not None and (
            low > literal or (low == literal and (op == "<" or domain.low_open))
        ):
            return False
        return None
    if op == "==":
        below = low is not None and (literal < low or (literal == low and domain.low_open))
        above = high is not None and (literal > high or (literal == high and domain.high_open))
        return False if below or above else None
    return None


def _value(tree: Any, pick: Mapping[str, Any], domains: Mapping[str, Domain]) -> bool | None:
    """Kleene logic: True, False, or None (unknown)."""
    kind = tree[0]
    if kind == "atom":
        field, op, literal = tree[1]
        if field in pick:
            return _compare(pick[field], op, literal)
        domain = domains.get(field)
        return None if domain is None else _in_range(domain, op, literal)
    if kind == "not":
        inner = _value(tree[1], pick, domains)
        return None if inner is None else not inner
    values = [_value(part, pick, domains) for part in tree[1]]
    if kind == "and":
        return False if False in values else (True if all(values) else None)
    return True if True in values else (None if None in values else False)


def impossible(guard: str, domains: Mapping[str, Domain]) -> list[str] | None:
    """The fields whose pinned values make ``guard`` never hold (None: it may hold, or it
    is not read)."""
    try:
        tree = _Parser(guard).parse()
    except (_Unreadable, ValueError):
        return None
    fields = sorted({atom[0] for atom in _atoms(tree)})
    pinned = [f for f in fields if f in domains and domains[f].values is not None]
    choices = [domains[f].values or () for f in pinned]
    total = 1
    for values in choices:
        total *= len(values)
    if total > _LIMIT:
        return None
    for combination in itertools.product(*choices):
        if _value(tree, dict(zip(pinned, combination, strict=True)), domains) is not False:
            return None
    return [f for f in fields if f in domains]


def _domains(schema: Mapping[str, Any]) -> dict[str, Domain]:
    """What an output schema pins, per field: ``const``/``enum`` values, or a number's
    ``minimum``/``maximum`` (``exclusiveMinimum``/``exclusiveMaximum``)."""
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return {}
    out: dict[str, Domain] = {}
    for field, prop in properties.items():
        if not isinstance(prop, Mapping):
            continue
        if "const" in prop:
            out[str(field)] = Domain(values=(prop["const"],))
        elif isinstance(prop.get("enum"), list):
            out[str(field)] = Domain(values=tuple(prop["enum"]))
        elif prop.get("type") in ("integer", "number"):
            low, low_open = _bound(prop, "minimum", "exclusiveMinimum")
            high, high_open = _bound(prop, "maximum", "exclusiveMaximum")
            if low is not None or high is not None:
                out[str(field)] = Domain(low=low, low_open=low_open, high=high, high_open=high_open)
    return out


def _bound(prop: Mapping[str, Any], inclusive: str, exclusive: str) -> tuple[float | None, bool]:
    if _is_number(prop.get(exclusive)):
        return float(prop[exclusive]), True
    if _is_number(prop.get(inclusive)):
        return float(prop[inclusive]), False
    return None, False


def _bound_text(bound: float) -> str:
    """A bound as the schema wrote it: ``1234567``, ``0.5`` (never rounded, as ``:g`` would)."""
    return str(int(bound)) if bound.is_integer() else repr(bound)


def _allowed(domain: Domain) -> str:
    if domain.values is not None:
        return ", ".join(json.dumps(v) for v in domain.values)
    low = (
        ""
        if domain.low is None
        else f"{'>' if domain.low_open else '>='} {_bound_text(domain.low)}"
    )
    high = (
        ""
        if domain.high is None
        else f"{'<' if domain.high_open else '<='} {_bound_text(domain.high)}"
    )
    return " and ".join(p for p in (low, high) if p)


def check_outcomes(
    spec: model.WorkflowSpec, outputs: Mapping[str, Mapping[str, Any]], error: Report
) -> None:
    """Refuse each ``task.completed`` transition of a state with actions whose guard can
    hold for no answer the last action's capability may give (``gate-outcome-impossible``)."""
    for name, state in spec.states.items():
        if not state.actions or state.actions[-1].capability is None:
            continue
        capability = state.actions[-1].capability
        schema = outputs.get(capability)
        domains = _domains(schema) if schema else {}
        if not domains:
            continue
        for i, transition in enumerate(state.on):
            if transition.event != "task.completed" or transition.guard is None:
                continue
            fields = impossible(transition.guard, domains)
            if not fields:
                continue
            allows = "; ".join(f"result.{f}: {_allowed(domains[f])}" for f in fields)
            error(
                ("spec", "states", name, "on", i, "guard"),
                "gate-outcome-impossible",
                f"transition {i} of state {name!r} waits for {transition.guard}, which no "
                f"answer of capability {capability!r} can satisfy (its output schema "
                f"allows {allows})",
            )
