"""The ``interlock`` command line."""

from interlock.cli.main import main

__all__ = ["main"]
