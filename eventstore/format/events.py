"""The event types: the msgspec tagged union every log line decodes to.

A log line is one event encoded as a JSON object whose `type` tag names its class, with
the envelope fields every event carries (`seq`, `ts`, `more`, `key`, `v`, `h`) and the
event's payload; `eventstore.format.chain` says how `h` chains the lines and
`eventstore.format.codec` encodes and decodes them. Subclass `Event` with `tag="..."` to
define a custom event; bump its `VERSION` and register an `Upcaster` when its payload's
shape changes.

Besides the events: `LineHead` and `SnapshotHead`, the envelopes a reader decodes when it
needs no payload, and `UnknownEvent`, what a line of a type this reader does not know
becomes.
"""

# no `from __future__ import annotations`: msgspec reads these structs' annotations
# as objects, not strings to evaluate; that keeps decoder builds on cold loads ~3x cheaper
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import msgspec

from eventstore.errors import InvalidRecordError
from eventstore.records import (
    FeatureRecord,
    Message,
    ProgressEntry,
    RunCheckpoint,
    SessionManifest,
)

__all__ = [
    "BUILTIN_EVENT_TYPES",
    "EPOCH",
    "ArchivePruned",
    "CheckpointRecorded",
    "Event",
    "FeatureListReplaced",
    "FeaturePassUpdated",
    "ForkOrigin",
    "KeyForgotten",
    "LabelsSet",
    "LineHead",
    "ManifestSet",
    "MessagesAppended",
    "ProgressAppended",
    "Quarantined",
    "SealWitnessed",
    "Sealed",
    "SessionDeleted",
    "Snapshot",
    "SnapshotHead",
    "UnknownEvent",
    "Upcaster",
    "event_tag",
    "from_micros",
    "micros",
]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def micros(ts: datetime) -> int:
    """An aware time as whole microseconds since the epoch (exact: what an index keeps)."""
    return (ts - EPOCH) // _MICROSECOND


def from_micros(us: int) -> datetime:
    """The aware UTC time `us` microseconds after the epoch (`micros` reversed)."""
    return EPOCH + us * _MICROSECOND


class Event(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True):
    """Base of every event. Subclass with `tag="..."` to define a custom event.

    The envelope fields are stamped by the log when the event is appended; leave them
    at their defaults when you build an event. `VERSION` is the current version of the
    event's payload shape; bump it and register an upcaster when the shape changes.
    """

    VERSION: ClassVar[int] = 1
    SKIPPED: ClassVar[bool] = False  # True on the envelope-only stand-ins of skipped types
    # True on types whose lines are upkeep of the log, never activity (`is_maintenance`)
    MAINTENANCE: ClassVar[bool] = False

    seq: int = 0
    ts: datetime = EPOCH
    more: int = 0
    key: str | None = None
    v: int = 1
    h: str = ""

    def is_maintenance(self) -> bool:
        """Whether this line is upkeep of the log (a compaction's snapshot, a pruned
        archive, a seal...) rather than activity of its session: a session's last
        activity, which `gc --idle` ages, passes over it. Its type's `MAINTENANCE`; a
        type with lines of both kinds overrides this."""
        return self.MAINTENANCE


class ManifestSet(Event, tag="manifest_set", kw_only=True):
    """`save_manifest` (and the first line of an initialization): the whole manifest."""

    manifest: SessionManifest


class FeatureListReplaced(Event, tag="feature_list_replaced", kw_only=True):
    """`replace_feature_list`: the whole list, in order."""

    features: list[FeatureRecord]


class FeaturePassUpdated(Event, tag="feature_pass_updated", kw_only=True):
    """`update_feature_pass`: one feature's flag (written only for a feature that exists)."""

    feature_id: str
    passes: bool


class ProgressAppended(Event, tag="progress_appended", kw_only=True):
    """`append_progress_entry`."""

    entry: ProgressEntry


class CheckpointRecorded(Event, tag="checkpoint_recorded", kw_only=True):
    """`record_run_checkpoint`."""

    checkpoint: RunCheckpoint


class MessagesAppended(Event, tag="messages_appended", kw_only=True, gc=False):
    """`append_transcript_messages`: the whole list in one event, so it is atomic.

    Not tracked by the cyclic garbage collector (`gc=False`, like `Message`): a cold
    load decodes one per turn, and each tracked one brought collection passes nearer.
    """

    messages: list[Message]


class LabelsSet(Event, tag="labels_set", kw_only=True):
    """`set_labels`: the session's labels from now on (the whole set: a label absent
    here is removed), which the session index lists and filters by."""

    labels: dict[str, str]


class ArchivePruned(Event, tag="archive_pruned", kw_only=True):
    """Archived history dropped for good (`eventstore.ops.lifecycle.prune_archive`), so the
    audit trail says what went and when (its `ts`): events `first_seq`..`last_seq`, in
    the archive `segments` (`bytes` in all), pruned as asked by `before` (a sequence
    number or a time). `last_h`: the link of event `last_seq`, which the first event kept
    chains to, so readers still check that event ("" in a record that did not keep it)."""

    first_seq: int
    last_seq: int
    segments: list[str]
    bytes: int
    before: str
    last_h: str = ""

    MAINTENANCE = True


class ForkOrigin(msgspec.Struct, frozen=True):
    """Where a forked session came from (`eventstore.ops.fork`): the source session's id,
    the sequence number it was forked at, and `h`, the hash of the source's line at that
    seq, so `verify` can check the source still holds that very line."""

    session_id: str
    seq: int
    h: str


class Quarantined(Event, tag="quarantined", kw_only=True):
    """Written by `repair` (`eventstore.ops.repair`) in place of each event it set aside:
    the lines from a damaged one on could not stay in the live log (the chain breaks
    there), so events `first_seq`..`last_seq` (`lines` lines, `bytes` bytes, `problem`
    the damage found) are kept only in the saved original beside the log; one of these
    holds each of their sequence numbers, so no number is used again for another event."""

    first_seq: int
    last_seq: int
    lines: int
    bytes: int
    problem: str

    MAINTENANCE = True


class Sealed(Event, tag="seal", kw_only=True):
    """A seal (`eventstore.ops.seal`): the signature of the key `key_id` (an Ed25519 key,
    named by its fingerprint, `eventstore.signing.key_id`) over the session id, the
    sequence number `sealed_seq` and hash `sealed_h` of the line before this one (the
    head it seals), the time `at` and the sealing policy's `every` (at most that many
    events may follow a seal before the next; None: no such promise). Folds to nothing;
    `verify` with the public key checks it against the chain."""

    session_id: str
    sealed_seq: int
    sealed_h: str
    at: datetime
    key_id: str
    every: int | None = None
    sig: str

    MAINTENANCE = True


class SealWitnessed(Sealed, tag="seal_witnessed", kw_only=True):
    """A seal as a witness store keeps it (`SealPolicy(witness=URL)`): the facts of a
    seal line of the session of the same id in the store that sealed it (`sealed_seq`,
    `sealed_h`: the line it sealed there). Checked by `verify(witness=URL)` against that
    store's history; in the witness store itself it folds to nothing."""

    # the record of a seal made elsewhere: the witness session's activity
    MAINTENANCE = False


class SessionDeleted(Event, tag="session_deleted", kw_only=True):
    """A tombstone (`eventstore.ops.lifecycle.delete_session` without purge): the session
    was deleted at this line's `ts`, `by` whom, when its last event was `last_seq` with
    hash `last_h`. Always a log's last line: every projection folds it to its initial
    state (`projections.fold`), and the store refuses any write after it
    (SessionDeletedError) until `restore` frees the id."""

    by: str = ""
    last_seq: int = 0
    last_h: str = ""


class KeyForgotten(Event, tag="key_forgotten", kw_only=True):
    """Written by `SessionStore.forget_key` after it destroyed the session's data key
    `dk` (crypto-shredding): the session's sealed lines can never be opened again; the
    chain still verifies. Never sealed itself."""

    dk: str


class Snapshot(Event, tag="snapshot", kw_only=True):
    """Written by compaction: the folded state of every projection at sequence `seq`.

    `states` maps a projection name to `{"version": int, "state": ...}` (idempotency
    keys are one of them); `unknown` keeps, verbatim, events of types this writer did
    not know, so compaction never drops them; `known` lists the types it did know, so a
    projection over only unknown types can be rebuilt from `unknown` alone. `pruned`
    keeps, verbatim, every `archive_pruned` line the snapshot replaces (and those the
    snapshot before it kept), so the point history was pruned to outlives any compaction.

    What history needs where the snapshot stands in for events no segment holds (absent,
    false or None in snapshots written before them): `archived`, the log it replaced
    was archived (a missing archive is then corruption, not a compaction without one);
    `trimmed`, a retention trimmed its states or those of a snapshot it was folded from
    (so they are no state as of its seq); `last_ts`, the time of the newest event it
    covers that is not maintenance (a compaction is not activity).

    `origin`: set on the first line of a forked session only (`fork_session`): the
    source session, seq and line hash its states were folded from (None otherwise).
    """

    base_h: str
    length: int = 0
    layout: dict[str, tuple[int, int]] = msgspec.field(default_factory=dict)
    states: dict[str, msgspec.Raw] = msgspec.field(default_factory=dict)
    unknown: list[msgspec.Raw] = msgspec.field(default_factory=list)
    known: list[str] = msgspec.field(default_factory=list)
    pruned: list[msgspec.Raw] = msgspec.field(default_factory=list)
    archived: bool = False
    trimmed: bool = False
    last_ts: datetime | None = None
    origin: ForkOrigin | None = None

    MAINTENANCE = True


class SnapshotHead(msgspec.Struct):
    """The fields of a snapshot line before its states: enough to read one state alone.

    `length` is the line's length (without the newline) and `layout` maps each
    projection to the byte range of its entry in the line, so a reader that needs one
    projection preads that range and never touches the rest (e.g. a long transcript).
    """

    type: str
    seq: int
    ts: datetime = EPOCH
    base_h: str = ""
    length: int = 0
    layout: dict[str, tuple[int, int]] = msgspec.field(default_factory=dict)


class UnknownEvent(Event, tag="__unknown__", kw_only=True):
    """A line whose type this reader does not know (written by a newer writer).

    Never written under this tag: `raw` is the original line, and it is kept verbatim.
    """

    type_name: str = ""
    raw: bytes = b""


class LineHead(msgspec.Struct):
    """The envelope of any line, whatever its type: what recovery and verify need."""

    type: str
    seq: int
    ts: datetime = EPOCH
    v: int = 1
    more: int = 0
    key: str | None = None
    h: str = ""
    base_h: str | None = None


BUILTIN_EVENT_TYPES: tuple[type[Event], ...] = (
    ManifestSet,
    FeatureListReplaced,
    FeaturePassUpdated,
    ProgressAppended,
    CheckpointRecorded,
    MessagesAppended,
    ArchivePruned,
    Quarantined,
    Sealed,
    SealWitnessed,
    SessionDeleted,
    Snapshot,
    KeyForgotten,
    LabelsSet,
)

# a function turning an event's payload (a dict) at one version into the next version's,
# registered per event type and version with `EventCodec.register_upcaster`
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


def event_tag(cls: type[Event]) -> str:
    """The `type` tag of an event class."""
    tag = cls.__struct_config__.tag
    if not isinstance(tag, str):
        raise InvalidRecordError(f"{cls.__name__} has no string tag; define it with tag='...'")
    return tag
