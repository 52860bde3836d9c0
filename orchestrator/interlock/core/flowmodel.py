"""The manifest's flow-control constructs, defined beside :mod:`interlock.core.model`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

OnLimit = Literal["queue", "skip", "cancel-oldest"]


class ConcurrencyLimit(msgspec.Struct, kw_only=True, frozen=True):
    """At most ``limit`` runs hold a slot of this limit for each value of ``key`` at once;
    a run over it waits (``queue``, in the order runs started), is not run (``skip``), or
    has the oldest holder cancelled to make room (``cancel-oldest``). A ``scope`` shares the
    limit with every workflow of the namespace that names the same scope."""

    key: Annotated[
        str,
        msgspec.Meta(
            description=(
                "A CEL expression over 'inputs' and the trigger's 'event' and 'data': "
                "runs with the same value share the limit's slots."
            )
        ),
    ]
    limit: Annotated[int, msgspec.Meta(ge=1, le=100_000)]
    scope: (
        Annotated[
            str, msgspec.Meta(description="DNS label naming a limit shared between workflows.")
        ]
        | None
    ) = None
    on_limit: OnLimit = "queue"
    fair: (
        Annotated[
            str,
            msgspec.Meta(
                description=(
                    "A CEL expression over 'inputs', 'event' and 'data': runs waiting for the "
                    "limit's slots are served in turn by its value (round robin), so one value "
                    "with many runs waiting does not hold up another with few."
                )
            ),
        ]
        | None
    ) = None
    weight: (
        Annotated[
            str,
            msgspec.Meta(
                description=(
                    "A CEL expression over 'inputs', 'event' and 'data' giving an integer from "
                    "1 to 1000: the weight of the run's fairness key, whose share of the slots "
                    "is its weight against the other keys' waiting (needs 'fair')."
                )
            ),
        ]
        | None
    ) = None


TriggerKey = Annotated[
    str,
    msgspec.Meta(
        description=(
            "A CEL expression over the trigger's 'event' and 'data': events with the same "
            "value share one window (or one rate)."
        )
    ),
]
FlowDuration = Annotated[
    str,
    msgspec.Meta(description="A duration: a number followed by ms, s, m, h or d (e.g. 30s)."),
]


class Debounce(msgspec.Struct, kw_only=True, frozen=True):
    """One run per key, started ``period`` after the last matching event of the key (with
    that event), and never later than ``max_wait`` after the first."""

    key: TriggerKey | None = None
    period: FlowDuration
    max_wait: FlowDuration | None = None


class Batch(msgspec.Struct, kw_only=True, frozen=True):
    """One run per batch of matching events of a key: cut at ``max_events`` events, or
    ``max_wait`` after the first, whichever comes first; the events are its input
    ``events``."""

    key: TriggerKey | None = None
    max_events: Annotated[int, msgspec.Meta(ge=1, le=1_000)]
    max_wait: FlowDuration


class TriggerRate(msgspec.Struct, kw_only=True, frozen=True):
    """At most ``limit`` runs started by the trigger per ``per``, for each value of
    ``key``; the events over it start their runs later (``queue``) or are dead-lettered
    (``drop``)."""

    limit: Annotated[int, msgspec.Meta(ge=1, le=1_000)]
    per: FlowDuration
    key: TriggerKey | None = None
    on_limit: Literal["queue", "drop"] = "queue"


CapabilityKey = Annotated[
    str,
    msgspec.Meta(
        description=(
            "A CEL expression over the action's rendered 'input': requests with the same "
            "value share the limit (none: one limit for every request)."
        )
    ),
]


MaxWaiting = Annotated[
    int,
    msgspec.Meta(
        ge=1,
        le=250_000,
        description=(
            "The most requests that may wait in this limit's line per key; one more fails "
            "its attempt (platform_error, code capacity_line_full). Without it: some 250,000."
        ),
    ),
]


class CapabilityConcurrency(msgspec.Struct, kw_only=True, frozen=True):
    """At most ``limit`` requests of the capability are at work at once for each value of
    ``key``, across every workflow that uses it; the others wait, in order, undispatched."""

    limit: Annotated[int, msgspec.Meta(ge=1, le=100_000)]
    key: CapabilityKey | None = None
    max_waiting: MaxWaiting | None = None


class CapabilityRate(msgspec.Struct, kw_only=True, frozen=True):
    """At most ``limit`` requests of the capability are dispatched per ``per`` for each
    value of ``key`` (evenly spaced; ``burst`` of them at once after a quiet spell)."""

    limit: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
    per: Annotated[
        str,
        msgspec.Meta(
            description="A duration: the window the limit counts over (1s, 1m, 1h).",
            examples=["1s", "1m", "1h"],
        ),
    ]
    key: CapabilityKey | None = None
    burst: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 1
    max_waiting: MaxWaiting | None = None


ActionPriority = Annotated[
    str | int,
    msgspec.Meta(
        description=(
            "An integer, or CEL giving one (-1,000,000 to 1,000,000): where the action's "
            "requests wait in line for their capability's limits, highest first."
        )
    ),
]


class Capability(msgspec.Struct, kw_only=True, frozen=True):
    """An AgentDef's capability: its schemas, defaults, and the limits on its requests."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] | None = None
    max_retries: Annotated[int, msgspec.Meta(ge=0)] | None = None
    concurrency: CapabilityConcurrency | None = None
    rate: CapabilityRate | None = None
