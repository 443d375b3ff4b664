"""Forks: start a new session from another's state at a sequence number, with provenance.

Written once for every engine, over the engine interface alone. `fork_session(core, src,
dst, at_seq)` takes one picture of `src`'s history, folds every registered projection
over its events 1..N exactly as `state_at(src, seq=N)` does (read from the archive where
compaction removed them; N is `at_seq`, or the head of that picture when None), and
writes `dst`'s first line: a `snapshot` at seq N whose states are those folds, whose
`base_h` is the link of `src`'s line N (so `dst`'s chain continues `src`'s as of N), and
whose `origin` (`ForkOrigin`) names `src`, N and the hash of `src`'s line N. Appends to
`dst` continue at N + 1; `src` is only read.

`dst` must hold nothing (`SessionExistsError`, nothing written): the line is appended
against the empty head, so of two racing forks (or a fork and a writer) one wins.
`source_line` gives what `verify` checks the origin against: the hash and link of the
source's line at that seq, as its history still holds it (live log or archive).
Because the origin is part of the snapshot line, `migrate` copies it byte for byte.
"""

from __future__ import annotations

from typing import Any

import msgspec

from eventstore import entropy
from eventstore.core.session_core import CoreOwner, SessionCore, core_of
from eventstore.engines.base import EMPTY_HEAD, EncodedBatch, HeadMovedError, History
from eventstore.errors import (
    HistoryUnavailableError,
    InvalidArgumentError,
    SessionDeletedError,
    SessionExistsError,
    UnknownSessionError,
)
from eventstore.format.chain import link_of
from eventstore.format.events import Event, ForkOrigin, Snapshot
from eventstore.ops.compaction import build_snapshot
from eventstore.ops.history import iter_history, require_history
from projections import fold, snapshot_entry, stored_in_snapshot

__all__ = ["ForkOrigin", "ForkResult", "fork_session", "source_line"]


class ForkResult(msgspec.Struct, frozen=True):
    """What `fork_session` wrote: `session_id` (the new session) starts with a snapshot
    at `seq`, forked from `source` whose line at `seq` has hash `h`; `bytes`: the size
    of that snapshot line."""

    session_id: str
    source: str
    seq: int
    h: str
    bytes: int


def _check_at_seq(at_seq: object) -> int | None:
    if at_seq is None:
        return None
    if not isinstance(at_seq, int) or isinstance(at_seq, bool) or at_seq < 1:
        raise InvalidArgumentError(f"at_seq must be an int >= 1 or None, got {at_seq!r}")
    return at_seq


def _fold_source(
    core: SessionCore, src: str, hist: History, at_seq: int | None
) -> tuple[list[Event], dict[str, msgspec.Raw]]:
    """The events 1..N of `src`'s history picture `hist` (N: `at_seq`, or its last) and
    every projection's state folded over them, as snapshot entries."""
    events = [ev for ev, _ in iter_history(core, src, core.codec.decoder(None), 1, at_seq,
                                            exact=True, history=hist)]  # fmt: skip
    last = events[-1].seq if events else 0
    if not events or (at_seq is not None and last < at_seq):
        raise HistoryUnavailableError(
            f"session {src!r} has no event {at_seq} (its last is {last}): cannot fork it there"
        )
    n = last
    states: dict[str, msgspec.Raw] = {}
    for name, proj in core.projections.items():
        own: list[Event] | Any = events
        if name not in core.builtin:
            # a user's projection folds a decode of its own, as a load gives it
            own = (ev for ev, _ in iter_history(
                core, src, core.codec.decoder(proj.event_types), 1, n, exact=True, history=hist
            ))  # fmt: skip
        state = fold(proj, proj.initial(), own)
        if stored_in_snapshot(proj, state):
            states[name] = snapshot_entry(proj, state)
    return events, states


def fork_session(
    core: CoreOwner, source: str, session_id: str, at_seq: int | None = None
) -> ForkResult:
    """Start `session_id` from `source`'s state after `at_seq` (its head when None); see
    the module docstring. UnknownSessionError: `source` has nothing stored;
    HistoryUnavailableError: no event `at_seq` (beyond the last, or compacted away);
    SessionExistsError: `session_id` already holds events (a tombstone too);
    SessionDeletedError: `source` was deleted. Nothing is written on error."""
    core = core_of(core)
    at_seq = _check_at_seq(at_seq)
    core.session(session_id)  # validates the id, checks the store is open
    engine = core.engine
    with engine.history(session_id) as held:
        if held.segments:
            raise SessionExistsError(
                f"cannot fork {source!r} into {session_id!r}: session {session_id!r} already"
                f" exists in the store at {core.url}"
            )
    gone = core.loaded(source, core.lifecycle, core.lifecycle.copy).deleted
    if gone is not None:
        raise SessionDeletedError(source, gone.ts, gone.by)
    with require_history(core, source) as hist:
        if core.keys is None:
            core.refuse_encrypted(source, "forking it")
        events, states = _fold_source(core, source, hist, at_seq)
        last = events[-1]
        h = _held_hash(core, source, hist, last)
    origin = ForkOrigin(session_id=source, seq=last.seq, h=h)
    snap = build_snapshot(events, states, b"", link_of(last), core.codec, False, False)
    at = entropy.now()
    # the fork is `session_id`'s first activity: its snapshot answering last activity
    # with `source`'s (`last_ts`) made a session forked now idle since `source`'s last
    # event, tombstoned by the next `gc --idle`
    snap = msgspec.structs.replace(snap, origin=origin, last_ts=at)
    cipher = core.snapshot_cipher(session_id, "forking into it", first=True)
    line, stamped = core.codec.encode_snapshot(snap, last.seq, link_of(last), at, cipher)
    batch = EncodedBatch(line, last.seq, last.seq, (stamped.h,), stamped.base_h)
    try:
        engine.append(session_id, batch, EMPTY_HEAD)
    except HeadMovedError:
        raise SessionExistsError(
            f"cannot fork {source!r} into {session_id!r}: session {session_id!r} was"
            f" created meanwhile in the store at {core.url}"
        ) from None
    core.forget(session_id)  # anything kept of it (an empty fold) restarts from the engine
    return ForkResult(session_id, source, last.seq, h, len(line))


def _held_hash(core: SessionCore, src: str, hist: History, last: Event) -> str:
    """The hash of `src`'s line at `last.seq` as the picture `hist` holds it, which
    `source_line` reads: after pruning, the exact fold's last event may be a snapshot
    standing in for the pruned events while the line it covers is still archived."""
    if type(last) is not Snapshot:
        return last.h
    envelopes = core.codec.decoder(frozenset())
    held = iter_history(core, src, envelopes, last.seq, last.seq, history=hist)
    return next((ev.h for ev, _ in held if ev.seq == last.seq), last.h)


def source_line(core: CoreOwner, origin: ForkOrigin) -> tuple[str, str] | None:
    """The (hash, link) of `origin.session_id`'s line at `origin.seq`, as its history
    holds it now (live log or archive); None when the session or that seq is gone (never
    stored, removed, pruned, compacted without an archive). CorruptLogError if its
    history does not check on the way there; InvalidSessionIdError for an origin naming
    no possible session id."""
    core = core_of(core)
    envelopes = core.codec.decoder(frozenset())
    try:
        with require_history(core, origin.session_id) as hist:
            for ev, _ in iter_history(
                core, origin.session_id, envelopes, origin.seq, origin.seq, history=hist
            ):
                if ev.seq == origin.seq:
                    return ev.h, link_of(ev)
    except (UnknownSessionError, HistoryUnavailableError):
        pass
    return None
