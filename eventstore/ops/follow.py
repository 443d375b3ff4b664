"""`follow`: yield a session's events as they are appended, by any process, each once.

Reads the live log from an engine position and waits on the engine for more
(`Engine.wait`: polling for files, a notification where the engine has one). When the
log is replaced by a snapshot, the events appended after the last read and before the
compaction are read from the history; with no archive, the snapshot stands in for them
(as in `read_events`). A log replaced by another history (the session purged, then
written again from seq 1) is a `HistoryUnavailableError` rather than read on as if it
continued the one followed, when the follower can tell: its head falls behind the
last event yielded, or its line (or opening snapshot) at that seq has another hash. (A
new history already compacted past that seq, without that line, is not told apart.)
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator

from eventstore.core.session_core import CoreOwner, core_of
from eventstore.core.validation import described, whole
from eventstore.engines.base import EMPTY_HEAD
from eventstore.errors import HistoryUnavailableError, InvalidArgumentError
from eventstore.format.events import (
    Event,
    Snapshot,
)
from eventstore.format.reader import read_lines
from eventstore.ops.history import iter_history

__all__ = ["MIN_POLL_INTERVAL", "follow", "poll_interval_of"]

_STOP_CHECK = 0.2  # seconds: how soon a stop set during a wait is seen

MIN_POLL_INTERVAL = 0.001
"""The shortest poll interval, in seconds: a shorter one spins a core re-reading logs."""


def poll_interval_of(value: object) -> float:
    """`value` as a poll interval in seconds: a finite number from `MIN_POLL_INTERVAL`
    up, else InvalidArgumentError. One rule for every follower and its CLI option."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not MIN_POLL_INTERVAL <= value < math.inf  # also refuses nan
    ):
        raise InvalidArgumentError(
            f"poll_interval must be a number of seconds from {MIN_POLL_INTERVAL} up, got {value!r}"
        )
    return float(value)


def follow(
    core: CoreOwner,
    session_id: str,
    *,
    from_seq: int = 1,
    poll_interval: float = 0.2,
    stop: threading.Event | None = None,
) -> Iterator[Event]:
    """Yield every event with seq >= `from_seq` as it is appended, by any process, until
    `stop` is set (or the generator is closed). Each event once, none missed.

    `poll_interval`: the longest wait between two looks at the log (and at `stop`).
    """
    core = core_of(core)
    poll_interval = poll_interval_of(poll_interval)
    core.session(session_id)
    whole(from_seq, "from_seq")
    if stop is not None and not callable(getattr(stop, "is_set", None)):
        raise InvalidArgumentError(f"stop must be a threading.Event, not {described(stop)}")
    engine = core.engine
    decoder = core.codec.decoder(None)
    head = EMPTY_HEAD
    last = from_seq - 1
    yielded = (0, "")  # the seq and hash of the last event yielded ((0, ""): none yet)
    while stop is None or not stop.is_set():
        res = engine.read(session_id, head.position)
        if res.head.seq < yielded[0]:
            raise _replaced(session_id, yielded[0])
        start = EMPTY_HEAD if res.reset else head
        events: list[Event] = []
        if res.data:
            events = read_lines(
                res.data,
                core.codec,
                decoder,
                res.where,
                offset=res.offset,
                seq=start.seq,
                link=start.link,
            ).events
        head = res.head
        for ev in events:
            if ev.seq == yielded[0] and yielded[1] not in (ev.h, getattr(ev, "base_h", None)):
                raise _replaced(session_id, yielded[0])  # (a snapshot there: its base_h)
            if type(ev) is Snapshot:
                if ev.seq > last:
                    # events up to the snapshot that this reader has not seen yet
                    for old, _ in iter_history(core, session_id, decoder, last + 1, ev.seq):
                        if old.seq > last:
                            yield old
                            last, yielded = old.seq, (old.seq, old.h)
                    last = max(last, ev.seq)
                continue
            if ev.seq > last:
                yield ev
                last, yielded = ev.seq, (ev.seq, ev.h)
        deadline = time.monotonic() + poll_interval
        # in slices: a stop set meanwhile (by a signal handler) ends a long wait at once
        while stop is None or not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or engine.wait(session_id, head.position, min(left, _STOP_CHECK)):
                break
        else:
            return


def _replaced(session_id: str, seq: int) -> HistoryUnavailableError:
    return HistoryUnavailableError(
        f"session {session_id!r} was replaced under this follower (purged and written"
        f" again, or its log restored from another copy): the history it followed up to"
        f" seq {seq} is gone"
    )
