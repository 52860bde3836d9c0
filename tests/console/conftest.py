"""The console's tests run its gateway as it is deployed: on a server with authentication, on a
credential of an account of its own (support.accounts)."""

from support.accounts import pooled_subjects, secured_nats_url

__all__ = ["pooled_subjects", "secured_nats_url"]  # fixtures: nats_url, subjects
