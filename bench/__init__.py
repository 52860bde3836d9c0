"""Benchmarks: ``python -m bench [SUITE] [ARGS...]`` (``make bench`` runs every suite).

Suites: ``core`` (the pure core: fold rate and guard cost, in-process, seconds) and
``runtime`` (end to end against an embedded nats-server).
"""
