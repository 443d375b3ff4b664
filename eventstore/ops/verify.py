"""`verify`: check a session's whole history and report every problem, never raise on
damaged input.

Every line of every segment is read by the one line reader with a collecting reporter
(hash, decoding, sequence, batches: see `eventstore.format.reader`); across segments, verify checks
the chain: each snapshot's `base_h` equals the link of its sequence number in the segment
before it, copies of an event in two segments are identical, an archived segment holds
what its name says, and a snapshot's states equal the fold of the archived events it
replaced (a snapshot edited with its `h` recomputed breaks no link, so its states are
compared instead; retention is recognised by each projection), and every `archive_pruned`
record names events before itself and has identical copies (a snapshot carries them
verbatim: an edited copy would move where history reads as pruned). A forked session's
first snapshot names its origin (`eventstore.ops.fork`): when the source still holds that
seq, its line there must have the origin's hash (`fork_origin`, an error, if not); when
it does not, an "info" (`fork_source`) says the origin could not be checked.

Problems have a severity: an "error" (an edited, dropped, inserted or reordered line, an
undecodable line, a broken batch in the middle, a broken archive chain) makes `ok` False;
a "warning" does not: a torn tail (what a crash or a writer caught mid-append leaves;
readers ignore it and the next writer sets it aside), an event type this reader does not
know, a blank line, history compacted away without an archive, events `repair` set
aside (each held by a `quarantined` record). `head_hash` is the link
the next append will chain to (the `h` of the last committed line, or a snapshot's
`base_h`): compaction does not change it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from eventstore.core.folding import folded_without
from eventstore.core.segments import (
    archive_shortfall,
    opening_chain,
    pruned_start,
    pruning_records,
)
from eventstore.core.session_core import CoreOwner, SessionCore, core_of
from eventstore.errors import (
    CorruptLogError,
    EventStoreError,
    InvalidSessionIdError,
    SnapshotVersionError,
)
from eventstore.format.chain import (
    SNAPSHOT_OPEN,
    line_hash,
    split_hash,
)
from eventstore.format.crypt import states_encrypted
from eventstore.format.depth import HEAD_DECODER
from eventstore.format.events import (
    Event,
    Quarantined,
    Snapshot,
)
from eventstore.format.reader import (
    Collecting,
    Lines,
    Problem,
    Severity,
    read_lines,
)
from eventstore.ops.fork import source_line
from eventstore.ops.history import (
    is_pruned,
    pruned_message,
    require_history,
)
from eventstore.ops.seal import SealHistory, Witness
from eventstore.ops.tombstone import tombstone_of
from projections import (
    fold,
    in_snapshots,
    is_retained,
    restore_state,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from eventstore.engines.base import Segment

__all__ = ["Problem", "Severity", "VerifyReport", "verify"]

_line_head = HEAD_DECODER


class VerifyReport(msgspec.Struct):
    """What `verify` found. `ok` is False when any problem is an error (warnings, such as
    a torn tail or an unknown event type, leave it True)."""

    session_id: str
    ok: bool
    problems: list[Problem]
    head_hash: str
    head_seq: int
    events: int
    files: list[str]


def verify(
    store: CoreOwner,
    session_id: str,
    *,
    public_key: Ed25519PublicKey | None = None,
    witness: Witness | None = None,
) -> VerifyReport:
    """Check a session's whole history: every line's hash (recomputed), decoding,
    sequence contiguity, batch integrity, and the chain across compactions (see the
    module docstring). UnknownSessionError if the session has nothing stored.

    With `public_key`, every seal's signature and the sealed heads too, and the sealing
    policy; with `witness` (what a witness holds of the session), its seals against the
    history (`eventstore.ops.seal.check_seals`)."""
    store = core_of(store)
    with require_history(store, session_id) as hist:
        walk = _Walk(store, session_id, pruned_start(hist))
        for seg in hist.segments:
            walk.segment(seg)
    if public_key is not None or witness is not None:
        from eventstore.ops.seal import check_seals

        walk.problems.extend(check_seals(session_id, walk.sealed, public_key, witness))
    report = walk.report()
    return _deleted(store, report) if report.ok else report


def _deleted(store: SessionCore, report: VerifyReport) -> VerifyReport:
    """A tombstoned session's report: an "info" `deleted` finding saying when and by
    whom, in place of the history gap its erasure leaves (no fault: its events were
    deleted on purpose)."""
    try:
        t = tombstone_of(store, report.session_id)
    except EventStoreError:
        return report  # (whatever is wrong is in the report already)
    if t is None:
        return report
    state = "" if t.erased else " (its events are still stored: delete it again to erase them)"
    found = Problem(
        report.files[-1] if report.files else "", 0, t.seq, "deleted",
        f"session deleted at {t.deleted_at.isoformat()} by {t.by!r}; its last event was"
        f" seq {t.last_seq} (hash {t.last_h or '-'}){state}", "info",
    )  # fmt: skip
    kept = [p for p in report.problems if not (p.kind == "history_gap" and p.seq == t.seq)]
    return msgspec.structs.replace(report, problems=[*kept, found])


class _Walk:
    """Verify's walk through a session's segments, oldest first: what each segment is
    checked against (the segments before it), and what was found."""

    def __init__(self, store: SessionCore, session_id: str, pruned: tuple[int, str | None]) -> None:
        self.store, self.session_id = store, session_id
        self.codec = store.codec
        # a sealed line whose key this store lacks is checked by its envelope and chain
        self.decoder = self.codec.decoder(None, lenient=True)
        self.problems: list[Problem] = []
        self.head_hash, self.head_seq = "", 0
        self.names: list[str] = []
        self.prev: Lines | None = None
        self.prev_name = ""
        # every link and hash read so far, by seq (segments may overlap: a snapshot is
        # checked against whichever earlier segment holds its seq)
        self.earlier = Lines([], 0, None, None, "")
        # the events read so far, each seq once, while every segment read was clean
        self.so_far: list[Event] | None = []
        self.kept, self.kept_link = pruned
        self.records: dict[int, tuple[bytes, str]] = {}  # each pruning record by seq, and where
        self.i = -1  # the index of the segment being checked, among those pruning kept
        self.sealed = SealHistory({}, {}, {}, 0)  # what seals are checked against

    def segment(self, seg: Segment) -> None:
        """Read one segment with a collecting reporter and check it against the others."""
        name = seg.where
        self.names.append(name)
        if is_pruned(seg, self.kept):
            self.problems.append(
                Problem(
                    name,
                    0,
                    seg.first_seq,
                    "archive_pruned",
                    f"{pruned_message(self.session_id, self.kept)}; this segment was left by"
                    " an interrupted pruning (pruning again removes it)",
                    "warning",
                )
            )
            return
        self.i += 1
        reporter = Collecting()
        try:
            data = seg.read()
        except (OSError, EventStoreError) as exc:
            self.problems.append(Problem(name, 0, None, "unreadable", str(exc)))
            self.prev, self.so_far = None, None
            return
        seq, link = self._opening(name, data)
        scan = read_lines(
            data,
            self.codec,
            self.decoder,
            name,
            seq=seq,
            link=link,
            reporter=reporter,
            keep_links=True,
        )
        found = self._check(seg, name, data, scan, reporter.problems)
        self.problems.extend(found)
        self._advance(name, scan, found)
        if seg.archived and scan.events and scan.seq is not None:
            # a compaction archived this segment as it installed a snapshot at its last seq
            self.sealed.installed.add(scan.seq)

    def _opening(self, name: str, data: bytes) -> tuple[int | None, str | None]:
        """The (seq, link) the segment's first line chains to (None: unknown)."""
        if self.i == 0 and self.kept > 1:
            # the line before this segment was pruned: the pruning record names its link
            self.problems.append(
                Problem(name, 0, self.kept, "history_pruned",
                        pruned_message(self.session_id, self.kept), "warning")
            )  # fmt: skip
            return opening_chain(data, (self.kept - 1, self.kept_link))
        if self.i == 0:
            return 0, ""
        if data.startswith(SNAPSHOT_OPEN):
            return None, None  # chained to what came before by _check_snapshot
        prev = self.prev
        if prev is not None and prev.seq is not None and prev.link is not None:
            return opening_chain(data, (prev.seq, prev.link))
        return None, None  # the segment before is unreadable: cannot chain

    def _check(
        self, seg: Segment, name: str, data: bytes, scan: Lines, found: list[Problem]
    ) -> list[Problem]:
        """What the reader found in the segment, and the checks across segments."""
        if seg.archived:
            # an archive has no torn tail: what looks like one is a segment cut short
            found = [p for p in found if p.kind not in ("torn_tail", "torn_batch")]
            short = archive_shortfall(seg, len(data), scan.end, scan.seq if scan.events else None)
            if short is not None:
                found.append(Problem(name, short[0], short[1], "archive_truncated", short[2]))
        first = scan.events[0] if scan.events else None
        first_seq = first.seq if first is not None else None
        last_seq = scan.seq if scan.events else None
        if (
            seg.archived
            and seg.first_seq is not None
            and (first_seq, last_seq) != (seg.first_seq, seg.last_seq)
        ):
            found.append(
                Problem(
                    name,
                    0,
                    first_seq,
                    "archive_name",
                    f"the name says seq {seg.first_seq}..{seg.last_seq}, the segment holds"
                    f" {first_seq}..{last_seq}",
                )
            )
        prev = self.prev
        if isinstance(first, Snapshot) and first.origin is not None and self.i == 0:
            found.extend(_check_origin(self.store, first, name))
        elif isinstance(first, Snapshot) and not (self.i == 0 and self.kept > 1):
            found.extend(
                _check_snapshot(
                    self.store, first, name, prev if prev is None else self.earlier,
                    self.prev_name, scan, self.so_far,
                )
            )  # fmt: skip
        elif self.i > 0 and first is not None and (prev is None or not prev.events):
            found.append(
                Problem(
                    name,
                    0,
                    first.seq,
                    "archive_chain",
                    "a segment after an archived one does not start with a snapshot",
                )
            )
        found.extend(_check_pruning_records(name, data, self.records))
        found.extend(_quarantine_notes(name, scan))
        if not seg.archived and self.kept > 1:
            found.extend(_check_live_not_pruned(name, data, scan, self.kept))
        return found

    def _advance(self, name: str, scan: Lines, found: list[Problem]) -> None:
        """Move past a checked segment: its events, head and links join what came before."""
        if self.so_far is not None:
            if any(p.severity == "error" for p in found):
                self.so_far = None
            else:
                nxt = self.so_far[-1].seq + 1 if self.so_far else 1
                self.so_far.extend(
                    ev for ev in scan.events if type(ev) is not Snapshot and ev.seq >= nxt
                )
        if scan.events:
            self.head_hash, self.head_seq = scan.link or "", scan.seq or 0
        self._keep_for_seals(name, scan)
        self.prev, self.prev_name = scan, name
        earlier = self.earlier
        earlier.links.update(scan.links)
        earlier.hashes.update(scan.hashes)
        if scan.events:
            earlier.events = earlier.events or scan.events[:1]
            earlier.seq = max(earlier.seq or 0, scan.seq or 0)

    def _keep_for_seals(self, name: str, scan: Lines) -> None:
        """Each line by seq, first segment first (an archive holds the original of a line
        a snapshot replaced), and each snapshot's own hash: what seals are checked against."""
        sealed = self.sealed
        for ev in scan.events:
            sealed.lines.setdefault(ev.seq, (ev, name))
            if type(ev) is Snapshot:
                sealed.snapshot_h[ev.seq] = scan.hashes.get(ev.seq, "")
        for s, h in scan.hashes.items():
            sealed.hashes.setdefault(s, h)
        sealed.head_seq = self.head_seq

    def report(self) -> VerifyReport:
        """The problems in file order (segments oldest first, then byte offset)."""
        names, problems = self.names, self.problems
        order = {n: i for i, n in enumerate(names)}
        problems.sort(key=lambda p: (order.get(p.file, len(names)), p.offset))
        return VerifyReport(
            session_id=self.session_id,
            ok=not any(p.severity == "error" for p in problems),
            problems=problems,
            head_hash=self.head_hash,
            head_seq=self.head_seq,
            events=self.head_seq,
            files=names,
        )


def _check_pruning_records(
    name: str, data: bytes, seen: dict[int, tuple[bytes, str]]
) -> list[Problem]:
    """The `archive_pruned` records in a segment (lines, and those a snapshot carries):
    each names events before itself, and every copy of one is the same bytes (a snapshot
    carries them verbatim, so an edited copy would move where history reads as pruned)."""
    found: list[Problem] = []
    for rec, raw in pruning_records(data):
        if not 1 <= rec.first_seq <= rec.last_seq < rec.seq:
            found.append(
                Problem(
                    name, 0, rec.seq, "pruning_record",
                    f"the archive_pruned record at seq {rec.seq} names events"
                    f" {rec.first_seq}..{rec.last_seq}, which are not all before it",
                )
            )  # fmt: skip
        first = seen.setdefault(rec.seq, (raw, name))
        if first[0] != raw:
            found.append(
                Problem(
                    name, 0, rec.seq, "pruning_record",
                    f"the archive_pruned record at seq {rec.seq} differs from its copy in"
                    f" {first[1]}",
                )
            )  # fmt: skip
    return found


def _quarantine_notes(name: str, scan: Lines) -> list[Problem]:
    """A warning for each run of `quarantined` records (repair set those events aside:
    they are in the original it saved beside the log, not in the history)."""
    return [
        Problem(
            name,
            0,
            ev.seq,
            "quarantined",
            f"events {ev.first_seq}..{ev.last_seq} were set aside by repair ({ev.problem});"
            f" they are only in the original it saved beside the log ({ev.lines} lines,"
            f" {ev.bytes} bytes)",
            "warning",
        )  # fmt: skip
        for ev in scan.events
        if type(ev) is Quarantined and ev.seq == ev.first_seq
    ]


def _check_live_not_pruned(name: str, data: bytes, scan: Lines, kept: int) -> list[Problem]:
    """Pruning removes archived logs only, so the live log holds no event before `kept`
    (the first seq the pruning records keep) but a snapshot standing in for them. One it
    holds is history that every read refuses as pruned while it is here: the record
    naming it (at its own line, when it is one of this log's) is wrong."""
    held = [ev.seq for ev in scan.events if type(ev) is not Snapshot and ev.seq < kept]
    if not held:
        return []
    naming = [(rec, raw) for rec, raw in pruning_records(data) if rec.last_seq + 1 == kept]
    offset, seq = (data.find(naming[0][1]), naming[0][0].seq) if naming else (0, None)
    return [
        Problem(
            name, max(offset, 0), seq, "pruning_record",
            f"an archive_pruned record names events up to {kept - 1} pruned, but this live"
            f" log holds events {held[0]}..{held[-1]} of them: reads refuse history that"
            " is here",
        )
    ]  # fmt: skip


def _history_gap(name: str, snap: Snapshot, first: int) -> Problem:
    """Events `first`..`snap.seq` are in no segment: compacted without an archive (a
    warning: the snapshot's base_h cannot be checked), or, when the snapshot says its
    compaction archived them, an archive lost (an error)."""
    span = f"events {first}..{snap.seq}"
    if snap.archived:
        why = "were archived by the compaction that wrote this snapshot; no archive holds them"
        return Problem(name, 0, snap.seq, "history_gap", f"{span} {why}")
    why = "were compacted without an archive: the snapshot's base_h cannot be checked"
    return Problem(name, 0, snap.seq, "history_gap", f"{span} {why}", "warning")


def _check_snapshot(
    store: SessionCore,
    snap: Snapshot,
    name: str,
    prev: Lines | None,
    prev_name: str,
    scan: Lines,
    so_far: list[Event] | None,
) -> list[Problem]:
    """A snapshot opening a segment against the segment before it."""
    n = snap.seq
    if prev is None:
        return [_history_gap(name, snap, 1)]
    found: list[Problem] = []
    old_h = prev.links.get(n)
    if old_h is None and prev.seq is not None and prev.events and n > prev.seq:
        # the segment before ends before the snapshot: the events after it were compacted
        # without an archive (a later compaction than the one that archived it)
        return [_history_gap(name, snap, prev.seq + 1)]
    if old_h is None:
        first = prev.events[0].seq if prev.events else None
        found.append(
            Problem(
                name,
                0,
                n,
                "archive_chain",
                f"the snapshot covers seq {n}, which {prev_name} does not hold"
                f" ({first}..{prev.seq})",
            )
        )
    elif old_h != snap.base_h:
        found.append(
            Problem(
                name,
                0,
                n,
                "snapshot_base",
                f"base_h {snap.base_h} is not the link {old_h} of seq {n} in {prev_name}",
            )
        )
    for s, h in scan.hashes.items():
        if s > n and prev.hashes.get(s, h) != h:
            found.append(
                Problem(
                    name, 0, s, "archive_mismatch", f"seq {s} differs from its copy in {prev_name}"
                )
            )
    found.extend(_check_kept_lines(snap, name, prev))
    if so_far is not None:
        found.extend(_check_snapshot_states(store, snap, name, [e for e in so_far if e.seq <= n]))
    return found


def _check_origin(store: SessionCore, snap: Snapshot, name: str) -> list[Problem]:
    """A forked session's first line against its source (`eventstore.ops.fork`): the
    source's line at the origin's seq must have the origin's hash, and link to the
    snapshot's base_h. A source that no longer holds that seq cannot be checked (info)."""
    origin = snap.origin
    assert origin is not None
    src, n = origin.session_id, origin.seq
    where = f"forked from {src!r} at seq {n} (hash {origin.h})"
    if not 1 <= n <= snap.seq:  # (a compaction of the fork carries the origin to a later seq)
        return [Problem(name, 0, snap.seq, "fork_origin",
                        f"{where}, but the snapshot is at seq {snap.seq}")]  # fmt: skip
    try:
        held = source_line(store, origin)
    except InvalidSessionIdError as exc:
        return [Problem(name, 0, n, "fork_origin", f"{where}: not a session id: {exc}")]
    except CorruptLogError as exc:
        return [Problem(name, 0, n, "fork_origin", f"{where}: the source does not check:"
                        f" {exc}", "warning")]  # fmt: skip
    if held is None:
        why = "source not available (the session or that seq is gone): it cannot be checked"
        return [Problem(name, 0, n, "fork_source", f"{where}: {why}", "info")]
    h, link = held
    if h != origin.h or (n == snap.seq and link != snap.base_h):
        return [Problem(name, 0, n, "fork_origin", f"{where}, but the source's line at seq"
                        f" {n} has hash {h} (link {link}; the snapshot's base_h is"
                        f" {snap.base_h}): the origin does not match its source")]  # fmt: skip
    return []


def _check_kept_lines(snap: Snapshot, name: str, prev: Lines) -> list[Problem]:
    """The lines `snap` keeps verbatim (`unknown`: events of types its compactor did not
    know) against the archive: a reader that knows the type folds these copies, so an
    edited one (the snapshot re-hashed) would change its state unseen. A copy must carry
    the `h` of its seq in the archive and still hash to it from the link before it (so
    it is that line, byte for byte); a seq the archive does not hold cannot be checked."""
    found: list[Problem] = []
    for raw in snap.unknown:
        line = bytes(raw)
        split = split_hash(line)
        try:
            seq: int | None = _line_head.decode(line).seq
        except msgspec.MsgspecError:
            seq = None
        if seq is not None and seq not in prev.hashes:
            continue  # history the archive does not hold: nothing to compare with
        # (the line before the first event kept after pruning is gone: its h alone then)
        link = None if seq is None else "" if seq == 1 else prev.links.get(seq - 1)
        same = (
            seq is not None
            and split is not None
            and split[1] == prev.hashes[seq]
            and (link is None or line_hash(link, split[0]) == split[1])
        )
        if not same:
            found.append(
                Problem(
                    name, 0, snap.seq, "snapshot_state",
                    f"the line of seq {seq} the snapshot keeps verbatim (an event of a type"
                    " its compactor did not know) differs from that line in the archive:"
                    " the snapshot was edited",
                )
            )  # fmt: skip
    return found


def _check_snapshot_states(
    store: SessionCore, snap: Snapshot, name: str, history: list[Event]
) -> list[Problem]:
    """Each registered projection's state in `snap` against the fold of events 1..seq
    (a state trimmed by its projection's retention is recognised as such)."""
    if not history or history[-1].seq != snap.seq or history[0].seq != 1:
        return []  # the history before this snapshot is not all there to compare with
    if len(history) != snap.seq:
        return []  # a gap (history lost between archives) or a snapshot in between
    if states_encrypted(snap.states) or any(type(e).SKIPPED for e in history):
        return []  # sealed, and this store has not the key: checked by the chain alone
    found: list[Problem] = []
    for proj in store.projections.values():
        if not in_snapshots(proj):
            continue  # never stored: a load folds it from `initial()`, as it should
        if folded_without(store.codec, proj, snap):
            why = "its compactor did not decode events it reads; loads rebuild it"
            found.append(Problem(name, 0, snap.seq, "snapshot_version", why, "warning"))
            continue
        try:
            stored: Any = restore_state(proj, snap)
        except SnapshotVersionError as exc:
            found.append(Problem(name, 0, snap.seq, "snapshot_version", str(exc), "warning"))
            continue
        except CorruptLogError as exc:
            found.append(Problem(name, 0, snap.seq, "snapshot_state", exc.reason))
            continue
        expected = fold(proj, proj.initial(), history)
        if is_retained(proj, stored, expected):
            continue
        found.append(
            Problem(
                name,
                0,
                snap.seq,
                "snapshot_state",
                f"the snapshot's {proj.name!r} state differs from the fold of the archived"
                f" events 1..{snap.seq}: the snapshot was edited",
            )
        )
    return found
