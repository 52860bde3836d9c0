"""The manifest kinds, defined once as msgspec Structs.

These Structs are the single definition of the manifest format: the JSON Schemas in
contracts/ are generated from them, structural validation runs against those schemas, and
the compiler reads the typed values. ``interlock.io/v1`` is the native API version; the
zynax formats (``zynax.io/v1`` Workflow, ``zynax.io/v1alpha1`` AgentDef) are accepted
unchanged because they are a subset of the same language.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from interlock.core.flowmodel import (
    ActionPriority,
    Batch,
    Capability,
    ConcurrencyLimit,
    Debounce,
    TriggerRate,
)
from interlock.core.historymodel import ContinueAsNew, History
from interlock.core.vocabulary import ErrorClass

WORKFLOW_API_VERSIONS = ("interlock.io/v1", "zynax.io/v1")
AGENTDEF_API_VERSIONS = ("interlock.io/v1", "zynax.io/v1alpha1", "zynax.io/v1")

Duration = Annotated[
    str,
    msgspec.Meta(
        description="A duration: a whole number followed by ms, s, m, h or d (e.g. 30s, 30m, 1h).",
        examples=["30s", "30m", "1h"],
    ),
]
CelExpression = Annotated[str, msgspec.Meta(description="A CEL expression.")]
Value = Annotated[
    Any,
    msgspec.Meta(
        description=(
            "A literal, a '{{ cel }}' template, or a '$.states.<state>.output.<key>' reference; "
            "objects and lists nest."
        )
    ),
]


class _Strict(msgspec.Struct, kw_only=True, frozen=True):
    """Base of every manifest object.

    Unknown keys are errors, but keys starting ``x-`` are author annotations. msgspec's
    ``forbid_unknown_fields`` cannot make that exception, so the generated JSON Schema
    forbids unknown keys (validation runs against it first, reporting every error with its
    position) and decoding then ignores the ``x-`` keys that the schema let through.
    """


class Metadata(_Strict, frozen=True, kw_only=True):
    name: Annotated[str, msgspec.Meta(description="DNS label: lowercase letters, digits, '-'.")]
    namespace: str = "default"
    version: str | int | float | None = None
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    description: str | None = None


class InputSpec(_Strict, frozen=True, kw_only=True):
    """A typed run input."""

    type: Annotated[
        str,
        msgspec.Meta(
            description=("string, integer, number, boolean, object, list, list[<type>] or any.")
        ),
    ] = "any"
    required: bool = False
    default: Any = None
    description: str | None = None


class Trigger(_Strict, frozen=True, kw_only=True):
    """Starts a run when a CloudEvent of ``event`` type arrives and every filter entry matches."""

    event: str
    filter: dict[str, Any] = {}
    input: dict[str, Value] | None = None
    debounce: Debounce | None = None
    batch: Batch | None = None
    rate: TriggerRate | None = None


class Backoff(_Strict, frozen=True, kw_only=True):
    """Wait between attempts: ``initial``, times ``multiplier`` each time, at most ``max``."""

    initial: Duration = "1s"
    multiplier: Annotated[float, msgspec.Meta(ge=1)] = 2.0
    max: Duration = "60s"
    jitter: bool = True
    """Spread each wait over [wait/2, wait] (derived from the action id: deterministic)."""


class Retry(_Strict, frozen=True, kw_only=True):
    """Attempts of an action that fails with a retryable error (timeout, platform_error, or
    an error the agent marked retryable), or with one of ``errors``."""

    max_attempts: Annotated[int, msgspec.Meta(ge=1)] = 3
    backoff: Backoff = Backoff()
    errors: Annotated[
        list[str], msgspec.Meta(description="Classes retried too, retryable or not (`*`: any).")
    ] = []


class Action(_Strict, frozen=True, kw_only=True):
    """One capability invocation (or a sub-workflow run), run in order when its state is
    entered. Exactly one of ``capability`` and ``workflow``."""

    capability: str | None = None
    workflow: Annotated[
        str | None,
        msgspec.Meta(description="Run this workflow (NAME or NAMESPACE/NAME) as a child run."),
    ] = None
    timeout: Duration | None = None
    input: Value = None
    output: dict[str, str] = {}
    retry: Retry | None = None
    description: str | None = None
    priority: ActionPriority | None = None


class Catch(_Strict, frozen=True, kw_only=True):
    """Where a failed action (after its retries) goes, by error class (``*``: any) and,
    with ``codes``, by the agent's own failure code (``tool_error``, ``guardrail_denied``)."""

    errors: list[str] = msgspec.field(default_factory=lambda: ["*"])
    codes: list[str] = []
    goto: str
    set: dict[str, Value] = {}
    budget: EdgeBudgets = []


class StateTimeout(_Strict, frozen=True, kw_only=True):
    """Leave the state for ``goto`` when it has not been left ``after`` this long."""

    after: Duration
    goto: str
    set: dict[str, Value] = {}


class Quorum(_Strict, frozen=True, kw_only=True):
    """Done once ``at_least`` distinct producers (the ``source`` of each answer) have
    answered successfully; the rest are cancelled. Fails when that can no longer happen."""

    at_least: Annotated[int, msgspec.Meta(ge=1)]


Completion = Literal["all", "any", "all_settled"] | Quorum


class ParallelSpec(_Strict, frozen=True, kw_only=True):
    """Run every action at once (each its own capability and input); ``all`` waits for
    every one (results in order, the first failure fails the state), ``any`` takes the
    first success, ``all_settled`` waits for every one whatever its outcome."""

    actions: Annotated[list[Action], msgspec.Meta(min_length=1)]
    completion: Completion = "all"


class RunDeadline(_Strict, frozen=True, kw_only=True):
    """How long the whole run may take: when ``after`` has passed since it started, it
    moves to ``goto`` (whatever state it is in), or without ``goto`` fails with timeout."""

    after: Duration | None = None
    goto: str | None = None
    set: dict[str, Value] = {}


class Archive(_Strict, frozen=True, kw_only=True):
    """Where a finished run's log is written before retention deletes it, in the format of
    ``interlock export`` (JSONL CloudEvents, ``<run id>.jsonl``): exactly one of ``bucket``,
    a JetStream Object Store bucket, or ``directory``, a folder on the orchestrator's host."""

    bucket: str | None = None
    directory: str | None = None


class MapSpec(_Strict, frozen=True, kw_only=True):
    """Run ``action`` once per item of the CEL list ``over``, at most ``parallelism`` at a
    time; ``all`` waits for every item (results in input order, the first failure fails
    the state), ``any`` takes the first success (fails only when every item failed)."""

    over: CelExpression
    as_: Annotated[str, msgspec.Meta(description="The item's variable name.")] = msgspec.field(
        name="as"
    )
    action: Action
    parallelism: Annotated[int, msgspec.Meta(ge=1)] = 8
    completion: Completion = "all"


EdgeOutcome = Literal["completed", "failed", "skipped", "ended"]


class DagEdgeSpec(_Strict, frozen=True, kw_only=True):
    """A dependency on ``step`` that holds only when it ended one of ``on`` (``ended``: any
    of completed, failed, skipped); otherwise the dependent step is skipped."""

    step: str
    on: EdgeOutcome | list[EdgeOutcome] = "completed"


class DagStepSpec(_Strict, frozen=True, kw_only=True):
    """One step of a DAG: its action starts as soon as every step it depends on has ended
    as the edge asks (a plain name: completed) and the evidence proves what it
    ``requires``."""

    depends_on: list[str | DagEdgeSpec] = []
    action: Action
    requires: Annotated[
        dict[str, str | bool],
        msgspec.Meta(
            description="Evidence gate: predicate -> the value the evidence must show for "
            "the step's subject (true: any non-empty value)."
        ),
    ] = {}
    subject: Annotated[
        str | None,
        msgspec.Meta(description="Whose evidence the gate reads (default: the step's name)."),
    ] = None
    description: str | None = None


class DagSpec(_Strict, frozen=True, kw_only=True):
    """Steps that start as soon as what they depend on allows, at most ``parallelism`` at
    once, with no barrier between them; ``all`` fails the state when a step fails and no
    step depends on that failure, ``all_settled`` runs every step that can run whatever
    their outcomes."""

    steps: Annotated[dict[str, DagStepSpec], msgspec.Meta(min_length=1)]
    parallelism: Annotated[int, msgspec.Meta(ge=1)] = 8
    completion: Literal["all", "all_settled"] = "all"


class LoopSpec(_Strict, frozen=True, kw_only=True):
    """Repeat ``action`` until ``until`` (CEL over ``result``) is true, at most
    ``max_iterations`` times (then the state fails with budget_exceeded)."""

    until: CelExpression
    max_iterations: Annotated[int, msgspec.Meta(ge=1)]
    action: Action


EdgeBudgets = Annotated[
    list[str],
    msgspec.Meta(
        description="Edge budgets (declared in spec.budget.edges) this edge counts against: "
        "when one is spent, the edge firing again fails the run (budget_exceeded)."
    ),
]


class Transition(_Strict, frozen=True, kw_only=True):
    """An edge keyed by a CloudEvent type; the first whose event matches and guard holds fires."""

    event: str
    goto: str
    guard: CelExpression | None = None
    set: dict[str, Value] = {}
    budget: EdgeBudgets = []
    continue_as_new: bool | ContinueAsNew = False
    """Enter ``goto`` in a new run that continues this one (true, or ``{inputs: {...}}``)."""
    description: str | None = None


class Fail(_Strict, frozen=True, kw_only=True):
    """Makes a terminal state end the run as failed, with this error."""

    message: str
    error_class: str = msgspec.field(name="class", default=ErrorClass.WORKFLOW_FAILED)


class StateGate(_Strict, frozen=True, kw_only=True):
    """Evidence a state's answer must prove before the state passes: checked on the answer
    that completes the state's actions (when ``when`` holds); an answer that does not prove
    every predicate is refused and the last action is asked again, at the same attempt."""

    requires: Annotated[
        dict[str, str | bool],
        msgspec.Meta(
            min_length=1,
            description="predicate -> the value the evidence must show (true: any non-empty "
            "value).",
        ),
    ]
    evidence: Annotated[
        list[CelExpression],
        msgspec.Meta(
            description="CEL expressions over the answer (result) and the run, each giving "
            "a map of predicate to value; merged in order over what evidence events have "
            "proven for the subject."
        ),
    ] = []
    subject: Annotated[
        str | None,
        msgspec.Meta(description="Whose recorded evidence counts too (default: the state's name)."),
    ] = None
    when: Annotated[
        CelExpression | None,
        msgspec.Meta(description="The answers the gate checks (default: every answer)."),
    ] = None


class State(_Strict, frozen=True, kw_only=True):
    type: Literal["normal", "terminal", "human_in_the_loop"] = "normal"
    description: str | None = None
    actions: list[Action] = []
    map: MapSpec | None = None
    loop: LoopSpec | None = None
    parallel: ParallelSpec | None = None
    dag: DagSpec | None = None
    gate: StateGate | None = None
    on: list[Transition] = []
    catch: list[Catch] = []
    timeout: StateTimeout | None = None
    outputs: dict[str, Value] | None = None
    fail: Fail | None = None
    required: Annotated[
        bool,
        msgspec.Meta(
            description="Every run that completes must pass through this state (an "
            "approval, a gate): a path around it is refused (required-step-bypass)."
        ),
    ] = False


class Budget(_Strict, frozen=True, kw_only=True):
    """Limits of one run; exceeding one fails with budget_exceeded."""

    max_transitions: Annotated[int, msgspec.Meta(ge=1)] = 1000
    max_actions: Annotated[int, msgspec.Meta(ge=1)] = 1000
    max_fan_out: Annotated[int, msgspec.Meta(ge=1)] = 64
    edges: Annotated[
        dict[str, Annotated[int, msgspec.Meta(ge=1)]],
        msgspec.Meta(
            description="Named edge budgets: how many times, in one run, the transitions "
            "and catches that name one (their `budget`) may fire altogether: per edge (one "
            "names it), per state (its exits name it), or over a cycle's back-edges."
        ),
    ] = {}
    max_cost: (
        Annotated[
            float,
            msgspec.Meta(
                gt=0,
                description="The most the run may spend: the sum of the `cost` each answer "
                "reports; the answer that takes it over fails its state (budget_exceeded).",
            ),
        ]
        | None
    ) = None
    max_spawn_depth: (
        Annotated[
            int,
            msgspec.Meta(
                ge=0,
                description="How deep spawns may nest below a run: its own actions are spawns "
                "at depth 1, a child run's actions at depth 2 and so on; a deeper one fails "
                "its action (budget_exceeded, code max_spawn_depth). A child run keeps the "
                "tighter of its parent's limit and its own.",
            ),
        ]
        | None
    ) = None
    max_total_spawns: (
        Annotated[
            int,
            msgspec.Meta(
                ge=1,
                description="Spawns (actions requested: every attempt, map item, loop "
                "iteration and child run) that a run and all its child runs may make "
                "altogether; the one over it fails its action (budget_exceeded, code "
                "max_total_spawns). A child run is handed what is left, reserved until it "
                "ends; then only what it spent stays charged.",
            ),
        ]
        | None
    ) = None


class EvidenceSpec(_Strict, frozen=True, kw_only=True):
    """Event types whose data is evidence (``{subject: {predicate: value}}``): recorded
    whenever one arrives, whatever state the run is in, and read by evidence gates."""

    events: Annotated[list[str], msgspec.Meta(min_length=1)]


class Correlate(_Strict, frozen=True, kw_only=True):
    """How later events reach a run without naming it: ``key`` (a template over its
    inputs, computed at its start) and, per event type, CEL giving that key from the event."""

    key: str
    events: dict[str, CelExpression]


class WorkflowSpec(_Strict, frozen=True, kw_only=True):
    initial_state: str
    states: Annotated[dict[str, State], msgspec.Meta(min_length=1)]
    description: str | None = None
    inputs: dict[str, InputSpec] = {}
    triggers: list[Trigger] = []
    context: dict[str, Any] = {}
    budget: Budget = Budget()
    correlate: Correlate | None = None
    deadline: RunDeadline | None = None
    evidence: EvidenceSpec | None = None
    retention: Duration | None = None
    archive: Archive | None = None
    history: History | None = None
    numbers: Literal["typed", "double"] = "typed"  # JSON numbers in CEL: as written, or doubles
    concurrency: list[ConcurrencyLimit] = []
    priority: CelExpression | None = None


class Workflow(_Strict, frozen=True, kw_only=True):
    apiVersion: Literal["interlock.io/v1", "zynax.io/v1"]
    kind: Literal["Workflow"]
    metadata: Metadata
    spec: WorkflowSpec


class AgentDefSpec(_Strict, frozen=True, kw_only=True):
    capabilities: Annotated[list[Capability], msgspec.Meta(min_length=1)]
    description: str | None = None


class AgentDef(_Strict, frozen=True, kw_only=True):
    apiVersion: Literal["interlock.io/v1", "zynax.io/v1alpha1", "zynax.io/v1"]
    kind: Literal["AgentDef"]
    metadata: Metadata
    spec: AgentDefSpec


class SecretRef(_Strict, frozen=True, kw_only=True):
    """Where the gateway reads a secret: exactly one of an environment variable (``env``)
    or a file (``file``). Never the secret itself."""

    env: str | None = None
    file: str | None = None


class FromRequest(_Strict, frozen=True, kw_only=True):
    """A value from a request: one of a ``header``, a ``field`` of the JSON body (a dotted
    path) or a fixed ``value``, after ``prefix``; ``values``: what a header may say."""

    header: str | None = None
    field: str | None = None
    value: str | None = None
    prefix: str = ""
    values: list[str] | None = None


class WebhookSignals(_Strict, frozen=True, kw_only=True):
    """``POST /webhooks/<name>/runs/<run_id>/signals/<signal>``: type ``prefix`` + signal to
    the run, signed with ``secret`` (default: the webhook's); the body names both."""

    secret: SecretRef | None = None
    prefix: str = ""
    run_field: str = "run_id"
    signal_field: str = "signal"


class WebhookSpec(_Strict, frozen=True, kw_only=True):
    """How a signed HTTP request becomes a CloudEvent."""

    scheme: Literal["github", "standard"]
    secret: SecretRef
    type: FromRequest
    source: str | None = None
    id: FromRequest | None = None
    subject: FromRequest | None = None
    signature_header: str | None = None
    replay_window: Duration = "5m"
    signals: WebhookSignals | None = None
    description: str | None = None


class Webhook(_Strict, frozen=True, kw_only=True):
    apiVersion: Literal["interlock.io/v1"]
    kind: Literal["Webhook"]
    metadata: Metadata
    spec: WebhookSpec


KINDS: dict[str, type[Workflow] | type[AgentDef] | type[Webhook]] = {
    "Workflow": Workflow,
    "AgentDef": AgentDef,
    "Webhook": Webhook,
}
