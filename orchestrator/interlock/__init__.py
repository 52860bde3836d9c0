"""Interlock: an event-sourced workflow orchestrator on NATS JetStream."""

__version__ = "0.1.0"
