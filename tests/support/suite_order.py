"""The modules that take longest (``pytest --durations``, summed by module, measured on a
loaded 2-core machine), longest first.

``make test`` hands whole modules to its two processes (pytest-xdist ``--dist loadfile``) in
the order collected, each process taking the next module when it is nearly done with its
own: a long module collected late leaves the other process idle until it ends, and holds
the module already given to its process behind it. tests/conftest.py moves these ahead of
the others so they start first and the short modules fill in around them: both processes
finish near together. A module not listed keeps its place in the collection order, after
these; tests/test_suite_order.py checks that each listed module exists.
"""

from __future__ import annotations

LONGEST_FIRST = (
    "tests/runtime/test_cli_reads.py",
    "tests/runtime/test_cli_e2e.py",
    "tests/flow/test_examples.py",
    "tests/runtime/test_layouts.py",
    "tests/security/test_hostile_chaos.py",
    "tests/objects/test_large_events.py",
    "tests/runtime/test_client.py",
    "tests/security/test_flow_control_operator.py",
    "tests/console/test_console.py",
    "tests/dialects/runs/test_dialects_kxm.py",
    "tests/runtime/test_cli_emit.py",
    "tests/wire/test_asyncapi.py",
    "tests/console/test_console_acting.py",
    "tests/objects/test_large_answers.py",
    "tests/security/test_creds_cli.py",
    "tests/security/test_cli_first_use.py",
    "tests/console/test_console_run.py",
    "tests/runtime/test_run_pausing.py",
    "tests/runtime/test_partition_owners.py",
    "tests/console/test_console_signin.py",
    "tests/observability/test_prometheus_live.py",
    "tests/security/test_flow_control_cli_roles.py",
    "tests/runtime/test_capability_pause.py",
    "tests/security/test_role_cli.py",
    "tests/flow/test_replay_cli.py",
    "tests/flow/test_flow_crash.py",
    "tests/security/test_hostile_cel.py",
    "tests/security/test_hostile_events.py",
    "tests/gateway/test_openapi.py",
    "tests/security/test_capability_pause_roles.py",
    "tests/wire/test_node_publisher.py",
    "tests/wire/test_node_agent.py",
)
