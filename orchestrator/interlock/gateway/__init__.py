"""The HTTP gateway: CloudEvents over HTTP, signed webhooks, the REST API over runs.

It is a NATS client like any other (it reads the registry buckets, publishes inbound
events, reads and appends run logs as the CLI does), so it runs as its own process
(``interlock gateway``), scales by running more of it and fails on its own; ``interlock
dev`` runs one in-process.
"""

from interlock.gateway.app import build_app
from interlock.gateway.service import Gateway

__all__ = ["Gateway", "build_app"]
