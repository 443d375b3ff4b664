"""Where eventstore gets the time, unique names and random numbers: one place, so that a
test can fix them.

Everything eventstore writes that is not the caller's data comes from here: the time of
an append (each line's `ts`, a record's default `created_at`), the stamps of files set
aside (`log.jsonl.torn-<time>`), the names of temporary files and of removed sessions,
the journal's epoch numbers, the harness map's times and UUIDv7s, data keys and
nonces. Ordinarily these are
the clock, `uuid4` and the operating system's random bytes.

`fixed(seed)` is the documented test hook: inside it, the clock starts at `start` and
moves `step` forward at each reading, and unique names and random numbers come from a
`random.Random(seed)`, so that running the same calls twice writes the same bytes (the
crash-state explorer records a workload twice and gets the same trace). It is
process-wide and not for production use: names drawn under it are unique only within
one run.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

__all__ = ["fixed", "now", "random_bits", "random_bytes", "time_ns", "token_hex"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _Fixed:
    __slots__ = ("at", "rng", "step")

    def __init__(self, seed: int, start: datetime, step: timedelta) -> None:
        self.rng = random.Random(seed)
        self.at = start
        self.step = step

    def tick(self) -> datetime:
        at = self.at
        self.at = at + self.step
        return at


_fixed: _Fixed | None = None


def now() -> datetime:
    """The current time, timezone-aware (UTC)."""
    if _fixed is None:
        return datetime.now(UTC)
    return _fixed.tick()


def time_ns() -> int:
    """The current time in nanoseconds since the Unix epoch."""
    if _fixed is None:
        return time.time_ns()
    return (_fixed.tick() - _EPOCH) // timedelta(microseconds=1) * 1000


def token_hex(nbytes: int = 16) -> str:
    """`2 * nbytes` random hex digits, for a name no other writer picks (`uuid4().hex`
    for the default 16)."""
    if _fixed is None:
        return uuid.uuid4().hex if nbytes == 16 else os.urandom(nbytes).hex()
    return _fixed.rng.randbytes(nbytes).hex()


def random_bytes(n: int) -> bytes:
    """`n` random bytes (`os.urandom`): data keys and nonces. Under `fixed` they come from
    the seeded generator too, so an encrypted run reproduces: never under it in
    production (a fixed seed repeats keys and nonces)."""
    if _fixed is None:
        return os.urandom(n)
    return _fixed.rng.randbytes(n)


def random_bits(k: int) -> int:
    """A random non-negative integer of `k` bits."""
    if _fixed is None:
        return int.from_bytes(os.urandom((k + 7) // 8), "big") >> (-k % 8)
    return _fixed.rng.getrandbits(k)


@contextmanager
def fixed(
    seed: int,
    *,
    start: datetime = datetime(2026, 1, 1, tzinfo=UTC),
    step: timedelta = timedelta(milliseconds=1),
) -> Iterator[None]:
    """Fix the time, unique names and random numbers for the duration (see the module
    docstring): a test hook, process-wide; nests (the outer setting comes back)."""
    global _fixed
    outer = _fixed
    _fixed = _Fixed(seed, start, step)
    try:
        yield
    finally:
        _fixed = outer
