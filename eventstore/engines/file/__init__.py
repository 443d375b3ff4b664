"""The file engine: one JSON Lines log per session under a store directory."""

from eventstore.engines.file.engine import FileEngine

__all__ = ["FileEngine"]
