"""A session's whole history, read back: `read_events`, `state_at`, `transcript_at`, and
the folds that need the history (rebuilding a projection a snapshot lacks).

A session's history is what its engine still holds (`Engine.history`, one consistent
picture): the archived segments in order, then the live log. Every segment after the
first starts with a `snapshot` at sequence N whose `base_h` is the link of line N of the
segment before it; lines after the snapshot continue the sequence (some of them may also
be in the segment before: they are copies, read once). Every line is checked against
the hash chain as it is read.

Decisions (documented in the README, "Audit and replay"):

- `read_events` yields the original events. A snapshot is yielded only (a) where the
  events it replaced are in no segment (compacted with `archive=False`): it then stands
  in for them, at its sequence number N, so folding what `read_events` yields always
  gives the current state; or (b) when `types` asks for `"snapshot"` explicitly.
- `state_at` / `transcript_at` are exact: the fold of the events 1..N, read from the
  archive where needed (retention never changes them). Where history is gone (no
  archive) and a snapshot cannot stand in, they raise `HistoryUnavailableError`.
  "As of a time" means every event up to the first one appended after that time.
- After `prune_archive`, history starts at the first event kept (`first_kept_seq`): the
  pruning records, which every compaction carries into its snapshot, say where. Reading
  from an earlier seq — 1, the default, included — raises `HistoryPrunedError` before
  anything is yielded: a partial history is never passed off as the whole one.
  Internal views of what is held (export, stats, repair) read from `from_seq=None`.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from eventstore.core.segments import pruned_start, read_segment
from eventstore.core.session_core import CoreOwner, SessionCore, core_of
from eventstore.core.validation import described, optional_whole, whole
from eventstore.errors import (
    CorruptLogError,
    HistoryPrunedError,
    HistoryUnavailableError,
    InvalidArgumentError,
    UnknownSessionError,
)
from eventstore.format.codec import LineDecoder
from eventstore.format.events import (
    Event,
    Snapshot,
    UnknownEvent,
    event_tag,
)
from eventstore.records import (
    BootstrapState,
    Message,
)
from projections import (
    Projection,
    fold,
)

if TYPE_CHECKING:
    from eventstore.engines.base import (
        History,
        Segment,
    )

__all__ = [
    "LogFile",
    "first_kept_seq",
    "history_files",
    "is_pruned",
    "iter_history",
    "parse_time",
    "projection_at",
    "pruned_message",
    "read_events",
    "require_history",
    "state_at",
    "transcript_at",
]

INF = float("inf")


def require_history(core: CoreOwner, session_id: str) -> History:
    """The session's history (close it when done); UnknownSessionError if it has none."""
    core = core_of(core)
    core.session(session_id)  # validates the id, checks the store is open
    hist = core.engine.history(session_id)
    if not hist.segments:
        hist.close()
        raise UnknownSessionError(f"no session {session_id!r} in the store at {core.url}")
    return hist


def first_kept_seq(core: CoreOwner, session_id: str) -> int:
    """The first sequence number the session's history still holds: 1, or after
    `prune_archive` the one after the last event it pruned (read from there: reading
    from an earlier one raises HistoryPrunedError)."""
    core = core_of(core)
    core.session(session_id)
    with core.engine.history(session_id) as hist:
        return pruned_start(hist)[0]


def is_pruned(seg: Segment, kept: int) -> bool:
    """Whether the archived `seg` lies wholly in the pruned prefix (before seq `kept`): a
    crash in `prune_archive` may leave some of the segments it records as removed."""
    return seg.archived and seg.last_seq is not None and seg.last_seq < kept


def pruned_message(session_id: str, kept: int) -> str:
    """What to say about history pruned before seq `kept`."""
    return (
        f"session {session_id!r}: events 1..{kept - 1} were pruned from the archive"
        " (recorded by an archive_pruned event)"
    )


def iter_history(
    core: CoreOwner,
    session_id: str,
    decoder: LineDecoder,
    from_seq: int | None = None,
    to_seq: int | None = None,
    *,
    exact: bool = False,
    all_snapshots: bool = False,
    history: History | None = None,
) -> Generator[tuple[Event, bytes]]:
    """Every event of the history in [from_seq, to_seq] once, with its raw line.

    `from_seq` None: from the first event the history still holds (after pruning, the
    first one kept); a number below the first one kept raises HistoryPrunedError before
    anything is yielded. Snapshots follow the rules in the module docstring. `exact`:
    raise HistoryUnavailableError (HistoryPrunedError for pruned history) where the
    range needs events no segment holds, starting at 1 whatever `from_seq` says. Raises
    CorruptLogError at a line that does not check. `history`: a picture the caller took
    (and closes); by default one is taken for this iteration.
    """
    core = core_of(core)
    core.session(session_id)
    if history is None:
        with core.engine.history(session_id) as hist:
            yield from _iter_segments(
                core, session_id, hist, decoder, from_seq, to_seq, exact, all_snapshots
            )
    else:
        yield from _iter_segments(
            core, session_id, history, decoder, from_seq, to_seq, exact, all_snapshots
        )


def _iter_segments(
    core: SessionCore,
    session_id: str,
    hist: History,
    decoder: LineDecoder,
    start: int | None,
    to_seq: int | None,
    exact: bool,
    all_snapshots: bool,
) -> Iterator[tuple[Event, bytes]]:
    hi = INF if to_seq is None else to_seq
    kept, link = pruned_start(hist)
    if exact:
        from_seq = 1  # an exact read folds from the beginning
    elif start is None:
        from_seq = kept
    elif start < kept:
        # never a partial history as if it were whole: the caller asked for what is gone
        raise HistoryPrunedError(session_id, start, kept)
    else:
        from_seq = start
    nxt = kept  # the first sequence number not yet covered by what was read
    # where the segment read last ended; after pruning, the first one kept continues a
    # line that is gone, whose link the pruning record names
    after: tuple[int, str | None] | None = None if kept == 1 else (kept - 1, link)
    # an exact read that needs pruned events waits for a snapshot standing in for them
    lost = exact and from_seq < kept
    for seg in hist.segments:
        if is_pruned(seg, kept):
            continue
        # every segment is read, also those before `from_seq`: a segment that does not
        # open with a snapshot continues the chain of the one before it
        lines = read_segment(core.codec, seg, decoder, keep_raw=True, after=after)
        assert lines.raw is not None
        if lines.events and lines.seq is not None and lines.link is not None:
            after = (lines.seq, lines.link)
        for ev, line in zip(lines.events, lines.raw, strict=True):
            s = ev.seq
            if lost:
                if s > hi:
                    raise HistoryPrunedError(session_id, 1, kept)
                if type(ev) is Snapshot:
                    if ev.trimmed:  # its states are no state as of s
                        raise HistoryPrunedError(session_id, 1, kept)
                    lost = False  # it stands in for everything up to s, pruned or not
                    nxt = s + 1
                    yield ev, line
                continue
            if type(ev) is Snapshot:
                if s >= nxt and nxt <= hi and s >= from_seq:
                    # events nxt..s exist nowhere else: the snapshot stands in for them
                    if ev.archived:
                        raise CorruptLogError(
                            seg.where, 0, s, f"events {nxt}..{s} were archived by the"
                            " compaction that wrote this snapshot, and no archive holds them",
                        )  # fmt: skip
                    if exact and ev.trimmed:
                        raise HistoryUnavailableError(
                            f"session {session_id!r}: events {max(nxt, from_seq)}..{s} were"
                            " compacted without an archive, by a retention that trimmed the"
                            " snapshot standing in for them"
                        )
                    if s > hi:
                        if exact:
                            raise HistoryUnavailableError(
                                f"session {session_id!r}: events {max(nxt, from_seq)}..{s}"
                                " were compacted without an archive"
                            )
                        return
                    yield ev, line
                elif all_snapshots and from_seq <= s <= hi:
                    yield ev, line
                nxt = max(nxt, s + 1)
                continue
            if s < nxt:
                continue  # a verbatim copy of an event an earlier segment held
            if s > hi:
                return
            nxt = s + 1
            if s >= from_seq:
                yield ev, line
    if lost:
        raise HistoryPrunedError(session_id, 1, kept)


def _type_filter(
    core: SessionCore, types: Iterable[str | type[Event]] | None
) -> tuple[LineDecoder, Any]:
    """(decoder, predicate) for a `types` filter: tags or Event classes."""
    if types is None:
        return core.codec.decoder(None), None
    if isinstance(types, (str, bytes, bytearray, Mapping)) or not isinstance(types, Iterable):
        raise InvalidArgumentError(
            f"types must be a list of event tags or Event classes, not {described(types)}"
        )
    tags: set[str] = set()
    classes: list[type[Event]] = []
    for t in types:
        if isinstance(t, str):
            tags.add(t)
        elif isinstance(t, type) and issubclass(t, Event):
            classes.append(t)
            if t is not UnknownEvent:
                tags.add(event_tag(t))
        else:
            raise InvalidArgumentError(
                f"types must hold event tags or Event classes, not {described(t)}"
            )
    known = frozenset(tags & set(core.codec.types))
    want_unknown = UnknownEvent in classes

    def keep(ev: Event) -> bool:
        if type(ev) is UnknownEvent:
            return want_unknown or ev.type_name in tags
        return type(ev).__struct_config__.tag in tags or isinstance(ev, tuple(classes))

    # types outside the filter decode as bare envelopes: their payloads are never built
    return core.codec.decoder(known), keep


def read_events(
    core: CoreOwner,
    session_id: str,
    *,
    from_seq: int = 1,
    to_seq: int | None = None,
    types: Iterable[str | type[Event]] | None = None,
) -> Iterator[Event]:
    """Typed events with `from_seq <= seq <= to_seq`, in order, each once.

    Reads the archive where compaction removed events from the live log. After
    `prune_archive`, a `from_seq` below the first event kept (1 included, the default:
    the whole history) raises HistoryPrunedError, naming the first seq kept, before
    anything is yielded: a partial history is never passed off as the whole one; read
    from `first_kept_seq(core, session_id)` for what is kept. `types`: event
    tags (`"progress_appended"`, or the type name of an unknown event) or Event classes
    (`UnknownEvent` matches every unknown type). Snapshots are yielded only in place of
    history no segment holds, or when `types` names them. An unknown session yields
    nothing.
    """
    core = core_of(core)
    core.session(session_id)  # a bad id refused before anything is read
    whole(from_seq, "from_seq")
    optional_whole(to_seq, "to_seq")
    decoder, keep = _type_filter(core, types)
    wants_snapshots = keep is not None and keep(Snapshot(base_h=""))
    # the arguments are checked above, when called; the events are read as iterated
    return (
        ev
        for ev, _ in iter_history(
            core, session_id, decoder, from_seq, to_seq, all_snapshots=wants_snapshots
        )
        if keep is None or keep(ev)
    )


def parse_time(text: str) -> datetime:
    """An ISO 8601 time (`2026-11-29T15:40`, `...Z`, `...+01:00`); no offset means UTC.
    InvalidArgumentError for anything else."""
    try:
        ts = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"not an ISO 8601 time: {text!r}") from None
    ts = ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)
    try:
        ts.astimezone(UTC)  # (0001-01-01T00:00+01:00 is before the first UTC instant)
    except OverflowError:
        raise InvalidArgumentError(f"not a time in UTC's range: {text!r}") from None
    return ts


def projection_at(
    core: CoreOwner,
    proj: Projection[Any],
    session_id: str,
    seq: int | None,
    at: datetime | str | None,
) -> Any:
    """The state of any projection as of `seq` or `at` (exactly one); see `state_at`."""
    core = core_of(core)
    if (seq is None) == (at is None):
        raise InvalidArgumentError("give exactly one of seq= and at=")
    if isinstance(at, str):
        at = parse_time(at)
    elif at is not None and not isinstance(at, datetime):
        raise InvalidArgumentError(f"at= must be a datetime or an ISO 8601 str, not {at!r}")
    if at is not None and (at.tzinfo is None or at.utcoffset() is None):
        raise InvalidArgumentError("at= must be a timezone-aware datetime")
    if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool) or seq < 0):
        raise InvalidArgumentError(f"seq must be an int >= 0, got {seq!r}")
    if seq == 0:
        return proj.initial()
    decoder = core.codec.decoder(proj.event_types)
    history = iter_history(core, session_id, decoder, 1, seq, exact=True)
    last = 0

    def prefix() -> Iterator[Event]:
        nonlocal last
        for ev, _ in history:
            if at is not None and ev.ts > at:
                if type(ev) is Snapshot:
                    kept = first_kept_seq(core, session_id)
                    if kept > 1:  # the snapshot stands in for pruned history too
                        raise HistoryPrunedError(session_id, 1, kept)
                    raise HistoryUnavailableError(
                        f"session {session_id!r}: the events before {_iso(ev.ts)} up to"
                        f" seq {ev.seq} were compacted without an archive"
                    )
                return
            last = ev.seq
            yield ev

    try:
        state = fold(proj, proj.initial(), prefix())
    except HistoryPrunedError as exc:
        asked = f"the state as of seq {seq}" if at is None else f"the state as of {_iso(at)}"
        raise HistoryPrunedError(session_id, exc.requested, exc.first_kept, asked) from None
    finally:
        history.close()
    if seq is not None and last < seq:
        raise HistoryUnavailableError(
            f"session {session_id!r} has no event {seq} (its last is {last})"
        )
    return state


def state_at(
    core: CoreOwner,
    session_id: str,
    *,
    seq: int | None = None,
    at: datetime | str | None = None,
) -> BootstrapState:
    """The bootstrap state as of sequence number `seq` (0: before any event) or as of the
    aware time `at` (every event up to the first appended after it); exactly one. `at`
    may be an ISO 8601 str (no offset: UTC).

    Equals the fold of the events 1..seq, read from the archive where needed.
    HistoryUnavailableError for a seq beyond the last, or history compacted away.
    """
    core = core_of(core)
    return projection_at(core, core.projections["bootstrap"], session_id, seq, at)  # type: ignore[no-any-return]


def transcript_at(
    core: CoreOwner,
    session_id: str,
    *,
    seq: int | None = None,
    at: datetime | str | None = None,
) -> list[Message]:
    """The transcript as of `seq` or `at` (exactly one); see `state_at`."""
    core = core_of(core)
    return projection_at(core, core.projections["transcript"], session_id, seq, at)  # type: ignore[no-any-return]


def _iso(ts: datetime) -> str:
    return ts.astimezone(UTC).isoformat().replace("+00:00", "Z")


# -- folds that need the history ----------------------------------------------------------


class LogFile(msgspec.Struct, frozen=True):
    """One segment of a session's history: `name`, the engine's name for it (a path for
    the file engine, a URL-like name elsewhere); `path`, its file, for the file engine
    only (None elsewhere). `first_seq`/`last_seq`: what an archived segment's name says
    (None for the live log)."""

    name: str
    archived: bool
    first_seq: int | None = None
    last_seq: int | None = None
    path: Path | None = None


def history_files(core: CoreOwner, session_id: str) -> list[LogFile]:
    """The segments of a session's history, archived ones first then the live log (if
    any): their names and what they hold. Empty for an unknown session."""
    core = core_of(core)
    core.session(session_id)
    with core.engine.history(session_id) as hist:
        return [
            LogFile(seg.where, seg.archived, seg.first_seq, seg.last_seq, seg.path)
            for seg in hist.segments
        ]
