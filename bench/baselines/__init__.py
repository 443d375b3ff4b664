"""Baseline implementations of the session API, for the benchmark only (not the library)."""
