"""Integrations of eventstore with agent harnesses, each over the public API (optional)."""
