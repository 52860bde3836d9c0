"""Roles and credentials enforced by NATS itself (decentralized JWT auth with nkeys).

``roles`` holds every role's permissions (the one place they are written); ``jwt`` makes
keys, JWTs and creds files; ``keys`` keeps an installation's signing keys, issues and
revokes; ``push`` hands account updates to running servers; ``dev`` sets it all up for
``interlock dev`` and ``make demo``.
"""
