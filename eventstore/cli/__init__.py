"""The `eventstore` command: one module per command, thin views over the public API."""

from eventstore.cli.app import main

__all__ = ["main"]
