"""What the concurrency tests share: a limited workflow, and the checks made from the logs."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from nats.aio.client import Client

from interlock.core import events as ev
from interlock.transport.directget import read_messages
from interlock.transport.subjects import Subjects
from support.runtime import yaml


def limited(
    name: str = "limited",
    *,
    limit: int = 2,
    capability: str = "slow",
    scope: str | None = None,
    on_limit: str = "queue",
    extra_limit: str = "",
) -> str:
    """A workflow of one action whose runs share ``limit`` slots per ``inputs.customer``."""
    scope_line = f"\n              scope: {scope}" if scope else ""
    return yaml(
        f"""\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata:
          name: {name}
        spec:
          inputs:
            customer: {{type: string, required: true}}
            n: {{type: integer, default: 0}}
          concurrency:
            - key: inputs.customer
              limit: {limit}
              on_limit: {on_limit}{scope_line}{extra_limit}
          initial_state: work
          states:
            work:
              actions:
                - capability: {capability}
                  input: {{n: "{{{{ inputs.n }}}}"}}
              on:
                - {{event: task.completed, goto: done}}
            done:
              type: terminal
        """
    )


@dataclass
class Timeline:
    """Every run's queued, admitted and end records, in the order the RUNS stream holds
    them (one order for all runs, whichever process appended)."""

    queued: list[str] = field(default_factory=list)
    queued_at: dict[str, str] = field(default_factory=dict)
    admitted: list[str] = field(default_factory=list)
    ended: dict[str, str] = field(default_factory=dict)
    """run id -> the type of its end record"""
    slots: dict[str, list[ev.SlotClaim]] = field(default_factory=dict)
    most: dict[tuple[str, str], int] = field(default_factory=dict)
    """The most runs admitted and not ended at once, per limit and key."""
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    """run id -> record type -> how often it is in the log"""


async def timeline(nc: Client, subjects: Subjects) -> Timeline:
    out = Timeline()
    holding: dict[tuple[str, str], set[str]] = defaultdict(set)
    messages = await read_messages(nc, subjects.runs_stream, subjects.runs_all)
    for _, _, payload in messages:
        for record in ev.decode_batch(payload):
            run = record.subject
            kind = ev.record_type(record).removeprefix(ev.PREFIX)
            counts = out.counts.setdefault(run, {})
            counts[kind] = counts.get(kind, 0) + 1
            if isinstance(record, ev.RunQueued):
                out.queued.append(run)
                out.queued_at[run] = record.time
                out.slots[run] = record.data.slots
            elif isinstance(record, ev.RunAdmitted):
                out.admitted.append(run)
                for claim in out.slots[run]:
                    at = (claim.limit, claim.key)
                    holding[at].add(run)
                    out.most[at] = max(out.most.get(at, 0), len(holding[at]))
            elif isinstance(record, ev.RunCompleted | ev.RunFailed | ev.RunCancelled):
                out.ended[run] = kind
                for claim in out.slots.get(run, []):
                    holding[(claim.limit, claim.key)].discard(run)
    return out
