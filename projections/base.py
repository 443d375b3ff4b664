"""The projection protocol, the one fold loop and retention. Pure: no I/O, no clock.

A projection is an initial state, a function applying one event to a state, and a way
to encode its state into a snapshot and back. `fold` is the only loop that applies
events anywhere in eventstore. Retention (opt-in trimming of a snapshot's state) belongs
to each projection: it trims its own state (`retain`) and recognises a trimmed state
(`retained_from`); the face never knows which lists a projection keeps.
"""

# no `from __future__ import annotations`: msgspec reads these structs' annotations
# as objects, not strings to evaluate; that keeps decoder builds on cold loads ~3x cheaper
from collections.abc import Iterable
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from eventstore.errors import (
    CorruptLogError,
    InvalidArgumentError,
    InvalidRecordError,
    NestingTooDeepError,
    SnapshotVersionError,
)
from eventstore.format.events import (
    Event,
    SessionDeleted,
    Snapshot,
)

__all__ = [
    "Projection",
    "Retention",
    "StructProjection",
    "fold",
    "is_retained",
    "restore_state",
    "retain",
    "snapshot_entry",
    "stored_in_snapshot",
]

S = TypeVar("S")


class Retention(msgspec.Struct, frozen=True):
    """Opt-in trimming applied to a snapshot: keep only the newest N of each list.

    None keeps everything (the default). What is dropped stays in the archive (when
    compaction archives), so `state_at` can still see it. Each projection applies the
    fields that concern it (`retain`): the bootstrap projection `progress` and
    `checkpoints`, the transcript projection `messages`.
    """

    progress: int | None = None
    checkpoints: int | None = None
    messages: int | None = None

    def __post_init__(self) -> None:
        for name in ("progress", "checkpoints", "messages"):
            n = getattr(self, name)
            if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
                raise InvalidArgumentError(
                    f"Retention.{name} must be None or an int >= 0, got {n!r}"
                )


def keep_last(items: list[Any], n: int | None) -> list[Any]:
    """The newest `n` items (all of them for None): what a retention count keeps."""
    if n is None:
        return items
    return items[max(0, len(items) - n) :] if n else []


def is_suffix(kept: list[Any], full: list[Any]) -> bool:
    """Whether `kept` is the newest part of `full` (what `keep_last` leaves)."""
    return len(kept) <= len(full) and (not kept or kept == full[len(full) - len(kept) :])


class Projection(Protocol[S]):
    """What eventstore needs of a projection.

    `name` keys its state in snapshots; bump `version` whenever the state's shape
    changes, so an old snapshot is never misread. `event_types` lists the tags the
    projection reads (None: all); the others reach `apply` as bare envelopes, their
    payloads never materialized, and `apply` should ignore them.

    Optional (used when present; `StructProjection` has both): `retain(state,
    retention) -> state` trims the state a snapshot stores, and `retained_from(stored,
    full) -> bool` says whether `stored` is `full` trimmed that way (verify uses it).
    Without them a projection is never trimmed. `state_from_snapshot(snapshot) -> state
    | None` derives the state from the snapshot's other states when it holds none of
    this projection's version (one taken before the projection existed): a load then
    needs no archive to rebuild it from. `absent_is_initial = True`: a snapshot leaves
    out a state equal to `initial()`, and one without an entry stands for it (for
    states most sessions never leave, such as labels and tombstones). `in_snapshots =
    False`: a snapshot never stores the state, and a log that opens with one folds it
    from `initial()` (for a state about the live log's lines rather than the events,
    which a compaction replaces: an index of where lines are). `changes_events = False`:
    `apply` never changes an event it is given, so a writer folds it the events it
    appended (shared with other folds, all types decoded) instead of a decode of their
    bytes of its own. `ignores_other_types = True` (with `event_types`): `apply` returns
    the state unchanged for an event of a type outside `event_types`, so a writer does
    not fold it a batch holding none of those (nor a snapshot or a tombstone).
    `cache_frames(state) -> list[bytes]` and `from_cache_frame(state, frame) -> state`
    keep a large state in the fold cache as frames a cold load decodes one at a time,
    folding each into `initial()` in order (without them the cache holds
    `encode_state`'s bytes as one frame). With them, `cache_frames_from(state, start,
    stop=None) -> (frames, complete)` gives the frames from frame index `start` on, cut
    as `cache_frames` cuts, and how many of them (the first) are complete; with `stop`,
    only the complete ones before frame `stop`. A projection with it promises that a
    complete frame never changes while its state object is folded forward (a state
    replaced is a new object): the store then writes each complete frame once, as a
    chunk cache, and a close writes only the rest. `encode_cache(state) -> bytes` and
    `decode_cache(data) -> state` keep an unframed state in the fold cache in an
    encoding of the projection's own (without them, `encode_state`'s JSON): e.g.
    MessagePack for a state of bytes values, which JSON holds as base64.
    """

    @property
    def name(self) -> str:
        """The key of this projection's state in snapshots."""
        ...

    @property
    def version(self) -> int:
        """Bump it whenever the state's shape changes."""
        ...

    @property
    def event_types(self) -> frozenset[str] | None:
        """The tags `apply` reads (None: all); the others arrive as bare envelopes."""
        ...

    def initial(self) -> S:
        """The state of a session with no events."""
        ...

    def apply(self, state: S, event: Event) -> S:
        """The state after `event` (may change `state` in place and return it)."""
        ...

    def encode_state(self, state: S) -> bytes:
        """The state as JSON, for a snapshot."""
        ...

    def decode_state(self, data: bytes) -> S:
        """The state back from `encode_state`'s JSON."""
        ...

    def copy(self, state: S) -> S:
        """A copy the caller may change without changing the store's cached state."""
        ...


def _json(name: str, state: Any) -> bytes:
    """`state` as JSON; InvalidRecordError naming projection `name` for a state msgspec
    cannot encode (a value of a type it does not know, a lone surrogate), which would
    otherwise escape a load or a compaction as a bare TypeError."""
    try:
        return msgspec.json.encode(state)
    except RecursionError:  # nested deeper than the encoder can go from here
        raise NestingTooDeepError(
            f"the state of projection {name!r} nests arrays and objects too deep to encode"
            " or copy from here"
        ) from None
    except (msgspec.EncodeError, TypeError, UnicodeEncodeError) as exc:
        raise InvalidRecordError(
            f"the state of projection {name!r} cannot be encoded as JSON: {exc}"
        ) from exc


class _SnapshotEntry(msgspec.Struct):
    version: int
    state: msgspec.Raw


class _TypedEntry(msgspec.Struct, Generic[S]):
    version: int
    state: S


class StructProjection(Generic[S]):
    """A base for projections whose state msgspec can encode (Structs, lists, dicts).

    Subclasses set `name`, `version`, `event_types`, `state_type` and define `initial`
    and `apply`; snapshot encoding and copying come from msgspec.
    """

    name: str
    version: int = 1
    event_types: frozenset[str] | None = None
    state_type: Any

    def initial(self) -> S:
        """The state of a session with no events (define it)."""
        raise NotImplementedError

    def apply(self, state: S, event: Event) -> S:
        """The state after `event` (define it)."""
        raise NotImplementedError

    def encode_state(self, state: S) -> bytes:
        """The state as JSON, by msgspec (InvalidRecordError if it cannot be)."""
        return _json(self.name, state)

    def decode_state(self, data: bytes) -> S:
        """The state back from JSON, typed by `state_type`."""
        return msgspec.json.decode(data, type=self.state_type)  # type: ignore[no-any-return]

    def retain(self, state: S, retention: Retention) -> S:
        """The state a snapshot keeps under `retention` (untrimmed unless overridden)."""
        return state

    def retained_from(self, stored: S, full: S) -> bool:
        """Whether `stored` is what `retain` keeps of `full` (equal unless overridden)."""
        return self.encode_state(stored) == self.encode_state(full)

    def copy(self, state: S) -> S:
        """A deep copy (a JSON round trip)."""
        # a deep copy at C speed: callers get state they may change freely (JSON, not
        # msgpack, which would turn every timestamp's offset into UTC)
        return msgspec.json.decode(  # type: ignore[no-any-return]
            _json(self.name, state), type=self.state_type
        )

    def _snapshot_decoder(self) -> msgspec.json.Decoder[Any]:
        """A decoder of this projection's snapshot entry (`{"version", "state"}`, see
        `snapshot_entry`) typed by `state_type`: the entry and its state in one pass.
        Built once per projection (and again if `state_type` changes): projections hold
        no module state."""
        state_type = self.state_type
        memo = self.__dict__.get("_snapshot_decoder_memo")
        if memo is None or memo[0] is not state_type:
            dec = msgspec.json.Decoder(_TypedEntry[state_type])  # type: ignore[valid-type]
            memo = (state_type, dec)
            self.__dict__["_snapshot_decoder_memo"] = memo  # (a frozen subclass too)
        return memo[1]


_entry_decoder = msgspec.json.Decoder(_SnapshotEntry)


def stored_in_snapshot(projection: Projection[Any], state: Any) -> bool:
    """Whether a snapshot stores `state`: not when the projection says a snapshot with no
    entry stands for its initial state (`absent_is_initial`) and `state` is that one, so
    a session that never used it (no labels, no tombstone) keeps the snapshot it had;
    never for a projection kept out of snapshots (`in_snapshots`)."""
    if not in_snapshots(projection):
        return False
    return not (getattr(projection, "absent_is_initial", False) and state == projection.initial())


def in_snapshots(projection: Projection[Any]) -> bool:
    """Whether snapshots store the projection's state (all but those that say
    `in_snapshots = False`: their state is about the live log's lines)."""
    return getattr(projection, "in_snapshots", True) is not False


def snapshot_entry(projection: Projection[Any], state: Any) -> msgspec.Raw:
    """The JSON a snapshot stores for one projection's state."""
    return msgspec.Raw(
        msgspec.json.encode(
            _SnapshotEntry(projection.version, msgspec.Raw(projection.encode_state(state)))
        )
    )


def restore_state(projection: Projection[S], snapshot: Snapshot) -> S:
    """The projection's state stored in a snapshot (`initial()` for one kept out of
    snapshots: `in_snapshots`), or derived from its other states by
    the projection's `state_from_snapshot`; SnapshotVersionError if it is absent or of
    another version and cannot be derived (the caller may rebuild it from the archive)."""
    if not in_snapshots(projection) or (
        getattr(projection, "absent_is_initial", False) and projection.name not in snapshot.states
    ):
        return projection.initial()
    try:
        return _stored_state(projection, snapshot)
    except SnapshotVersionError:
        derive = getattr(projection, "state_from_snapshot", None)
        derived = None if derive is None else derive(snapshot)
        if derived is None:
            raise
        return derived  # type: ignore[no-any-return]


def _stored_state(projection: Projection[S], snapshot: Snapshot) -> S:
    raw = snapshot.states.get(projection.name)
    if raw is None:
        raise SnapshotVersionError(
            f"snapshot at seq {snapshot.seq} holds no state for projection {projection.name!r}"
        )
    if getattr(type(projection), "decode_state", None) is StructProjection.decode_state:
        # msgspec's own decoding: the entry and its state in one pass over the raw
        # bytes, no copy of the state's (a long transcript's megabytes); anything
        # irregular goes the careful way below, which says what is wrong
        try:
            typed = projection._snapshot_decoder().decode(raw)  # type: ignore[attr-defined]
        except msgspec.MsgspecError:
            pass
        else:
            if typed.version == projection.version:
                return typed.state  # type: ignore[no-any-return]
    try:
        entry = _entry_decoder.decode(raw)
    except msgspec.MsgspecError as exc:
        raise CorruptLogError(
            None, 0, snapshot.seq, f"snapshot entry of {projection.name!r} is malformed: {exc}"
        ) from None
    if entry.version != projection.version:
        raise SnapshotVersionError(
            f"snapshot at seq {snapshot.seq} holds {projection.name!r} version"
            f" {entry.version}; this code reads version {projection.version}"
        )
    try:
        return projection.decode_state(bytes(entry.state))
    except msgspec.MsgspecError as exc:
        raise CorruptLogError(
            None, 0, snapshot.seq, f"snapshot state of {projection.name!r} does not decode: {exc}"
        ) from None


def fold(projection: Projection[S], state: S, events: Iterable[Event]) -> S:
    """Apply `events` in order. A snapshot replaces the state with the one it stores; a
    tombstone (`session_deleted`) resets it to the initial state before it is applied (a
    deleted session reads as empty, whichever projection folds it)."""
    apply = projection.apply
    for ev in events:
        t = type(ev)
        if t is Snapshot:
            state = restore_state(projection, ev)  # type: ignore[arg-type]  # (t: one type() call)
        elif t is SessionDeleted:
            state = apply(projection.initial(), ev)
        else:
            state = apply(state, ev)
    return state


def retain(projection: Projection[S], state: S, retention: Retention) -> S:
    """`projection.retain(state, retention)`, or `state` for a projection without it."""
    trim = getattr(projection, "retain", None)
    return state if trim is None else trim(state, retention)


def is_retained(projection: Projection[S], stored: S, full: S) -> bool:
    """Whether a snapshot's `stored` state is the fold `full`, possibly trimmed by
    the projection's own retention."""
    check = getattr(projection, "retained_from", None)
    if check is not None:
        return bool(check(stored, full))
    return projection.encode_state(stored) == projection.encode_state(full)
