"""The manifest's flow-control constructs, defined beside :mod:`interlock.core.model`."""

from __future__ import annotations

from typing import Annotated, Literal

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
