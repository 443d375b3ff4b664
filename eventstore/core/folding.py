"""Folds that may need the history: a projection folded over a piece of the live log,
rebuilt from the archive when the snapshot opening the log lacks its state (or holds it
folded without events this store reads)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eventstore.core.segments import pruned_start, read_segment
from eventstore.errors import CorruptLogError, SnapshotVersionError
from eventstore.format.codec import EventCodec
from eventstore.format.events import Event, Snapshot
from projections import Projection, fold

if TYPE_CHECKING:
    from eventstore.engines.base import Engine

__all__ = ["fold_events", "fold_from_archive", "folded_without"]


def fold_events(
    codec: EventCodec,
    engine: Engine,
    session_id: str,
    proj: Projection[Any],
    state: Any,
    events: list[Event],
    where: str,
) -> Any:
    """`fold`, plus what needs the history: rebuild from the archive a state that the
    opening snapshot lacks or that its compactor folded without events this store reads
    (`folded_without`), and name the log of a snapshot state that does not decode."""
    if events and type(events[0]) is Snapshot and folded_without(codec, proj, events[0]):
        return fold_from_archive(codec, engine, session_id, proj, events, where)
    try:
        return fold(proj, state, events)
    except SnapshotVersionError:
        return fold_from_archive(codec, engine, session_id, proj, events, where)
    except CorruptLogError as exc:
        if exc.path is not None:
            raise
        # offset 0: a snapshot opens the log
        raise CorruptLogError(where, 0, exc.seq, exc.reason) from None


def folded_without(codec: EventCodec, proj: Projection[Any], snap: Snapshot) -> bool:
    """Whether `snap` holds a state of `proj` folded without events that `codec` decodes
    and `proj` reads: its compactor did not know their type and kept them verbatim, so
    a reader that knows it would fold another state (it rebuilds this one instead)."""
    if not snap.unknown or proj.name not in snap.states:
        return False
    extra = codec.types.keys() - set(snap.known)
    wanted = extra if proj.event_types is None else extra & proj.event_types
    return bool(wanted) and any(
        codec.head_decoder.decode(raw).type in wanted for raw in snap.unknown
    )


def fold_from_archive(
    codec: EventCodec,
    engine: Engine,
    session_id: str,
    proj: Projection[Any],
    events: list[Event],
    where: str,
) -> Any:
    """Fold `proj` over the whole history (archived segments, then `events`, which start
    with a snapshot that lacks this projection's state or holds another version of it)."""
    snap = events[0]
    assert isinstance(snap, Snapshot)
    wanted = proj.event_types
    if snap.known and wanted is not None and not (wanted & set(snap.known)):
        # every event this projection reads was unknown to the compactor: all kept verbatim
        kept = [codec.decode_line(bytes(raw), 0, where) for raw in snap.unknown]
        return fold(proj, proj.initial(), [*kept, *events[1:]])
    history: list[Event] = []
    upto = snap.seq
    decoder = codec.decoder(proj.event_types)
    with engine.history(session_id) as hist:
        after: tuple[int, str | None] | None = None
        # pruned history cannot be folded from the start: nothing to rebuild from
        for seg in hist.segments if pruned_start(hist)[0] == 1 else []:
            if not seg.archived:
                break
            lines = read_segment(codec, seg, decoder, after=after)
            if lines.events and lines.seq is not None and lines.link is not None:
                after = (lines.seq, lines.link)
            for ev in lines.events:
                if ev.seq > upto:
                    break
                if not history and ev.seq != 1:
                    break  # this segment does not start at the beginning: history is lost
                if history and ev.seq <= history[-1].seq:
                    continue  # a later segment starts with a snapshot of what we have
                history.append(ev)
    if not history or history[-1].seq != upto or history[0].seq != 1:
        raise SnapshotVersionError(
            f"{where}: the snapshot at seq {snap.seq} has no usable state for"
            f" projection {proj.name!r} (version {proj.version}) and the archive does not"
            " hold the history to rebuild it; compact with archive=True to keep it"
        )
    return fold(proj, proj.initial(), [*history, *events[1:]])
