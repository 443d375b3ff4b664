"""The log format: event types, the line codec, the hash chain, and the line reader.

Nothing here does I/O or knows about engines, sessions or stores (see docs/log-format.md).
"""
