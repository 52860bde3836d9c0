"""The manifest's constructs of long runs (``spec.history``, a transition's
``continue_as_new``), defined beside :mod:`interlock.core.model`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

ByteSize = Annotated[
    int | str,
    msgspec.Meta(
        description="A size: a number of bytes, or a whole number followed by KB, MB, GB "
        "(powers of 1000) or KiB, MiB, GiB (powers of 1024), e.g. 64MiB.",
        examples=[65536, "64MiB"],
    ),
]


class History(msgspec.Struct, kw_only=True, frozen=True):
    """How long one run's log may grow: past ``max_records`` records or ``max_bytes`` bytes
    it is continued as new (``continue_as_new: auto``, at its first transition from 80% of
    a limit) or fails with history_exceeded (``never``, at the limit). Unset fields take
    the installation's."""

    max_records: Annotated[int, msgspec.Meta(ge=10)] | None = None
    max_bytes: ByteSize | None = None
    continue_as_new: Literal["auto", "never"] | None = None


class ContinueAsNew(msgspec.Struct, kw_only=True, frozen=True):
    """The run's log ends and the run goes on as a new run, in the transition's ``goto``,
    with what it carries over (inputs, context, states' outputs...); ``inputs`` replaces
    some of its inputs."""

    inputs: Annotated[
        dict[str, Any],
        msgspec.Meta(description="Values (literals, templates, references) by input name."),
    ] = {}
