"""`repair`: make a session's live log trustworthy again, explicitly, under the writers'
exclusion. Never automatic, and it never destroys a byte.

A live log whose opening snapshot is damaged is rebuilt rather than emptied: a new
snapshot is folded from the archived events (1..M, each checked), linked to the archive's
last line, followed by the lines after the damaged snapshot that still chain to it. The
`archive_pruned` records the damaged snapshot carried are carried on when its JSON still
reads, so a pruned archive stays pruned history rather than a lost one. When
the archive cannot rebuild the state the snapshot held, the new snapshot keeps the
damaged one's sequence number (with the state the archive gives, or the initial one), and
the lines after it that still chain; where a damaged line among those drops the rest, the
new snapshot is numbered past every seq they held. So no sequence number is ever used
twice.

The live log is read by the one line reader with a prefix-keeping reporter: reading
stops at the first error, and what is kept is the committed batches before it. A torn
tail is cut off; a log with a bad line keeps its valid prefix. Either way the engine
saves the whole original aside first (`RepairHold.keep_prefix`: for the file engine a
hard link `<log>.torn-<UTC time>` or `<log>.corrupt-<UTC time>`, so there is never a
moment without a log). Archived history is never changed. Bytes past the end an
engine's own head records (`RepairHold.head_end`: written from outside, never appended)
are cut the same way, as a `past_head` problem, even when they read as lines.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from eventstore import entropy
from eventstore.core.segments import pruning_records
from eventstore.core.session_core import CoreOwner, SessionCore, core_of
from eventstore.engines.base import History
from eventstore.errors import (
    CorruptLogError,
    HistoryUnavailableError,
    UnknownSessionError,
)
from eventstore.format.chain import (
    HASH_SUFFIX_LEN,
    SNAPSHOT_OPEN,
    hash_checks,
    link_of,
    split_hash,
)
from eventstore.format.depth import HEAD_DECODER
from eventstore.format.events import (
    Event,
    LineHead,
    Quarantined,
    Snapshot,
    UnknownEvent,
)
from eventstore.format.reader import (
    PrefixReporter,
    Problem,
    read_lines,
)
from eventstore.ops.history import iter_history
from projections import (
    fold,
    snapshot_entry,
    stored_in_snapshot,
)

__all__ = ["RepairReport", "repair"]


class RepairReport(msgspec.Struct):
    """What `repair` did. `action`: "none" (nothing to do), "truncated" (a torn tail was
    cut off), "moved_aside" (the log had a bad line and keeps its valid prefix) or
    "rebuilt" (its opening snapshot was damaged and was folded again from the archive).
    Every change first saved the whole original at `moved_to`. `quarantined`: the
    sequence numbers (first, last) of the events a "moved_aside" left in the saved
    original only, each held in the live log by a `quarantined` record (None: none)."""

    session_id: str
    action: Literal["none", "truncated", "moved_aside", "rebuilt"]
    log: str
    moved_to: str | None
    kept_events: int
    kept_bytes: int
    dropped_bytes: int
    problem: Problem | None
    message: str
    quarantined: tuple[int, int] | None = None


def repair(core: CoreOwner, session_id: str) -> RepairReport:
    """Cut a torn tail, or keep the committed batches before the first bad line; the
    original is saved aside first (see the module docstring). UnknownSessionError if the
    session has no live log."""
    core = core_of(core)
    sess = core.session(session_id)
    codec = core.codec
    # the archive, read before the hold (reading history takes the writers' exclusion
    # too); no compaction can add to it meanwhile: it cannot read a damaged live log
    archived = _archived_events(core, session_id)
    with sess.lock, core.engine.hold(session_id) as hold:
        buf = hold.data
        if not buf:
            raise UnknownSessionError(f"session {session_id!r} has no live log to repair")
        where = hold.where
        reporter = PrefixReporter()
        end = hold.head_end  # (bytes past it: written from outside, never committed)
        scan = buf if end is None else buf[:end]
        kept = read_lines(scan, codec, codec.decoder(frozenset()), where, reporter=reporter)
        torn = [p for p in reporter.warnings if p.kind in ("torn_tail", "torn_batch")]
        bad = reporter.error
        if bad is None and end is not None:
            bad = Problem(
                where, end, (kept.seq or 0) + 1, "past_head",
                f"{len(buf) - end} bytes after the end the log's head records: written"
                " from outside the store",
            )  # fmt: skip
        cut = kept.end
        n = len(kept.events)
        if bad is None and not torn:
            return RepairReport(
                session_id, "none", where, None, n, len(buf), 0, None,
                "the log is intact; nothing to do",
            )  # fmt: skip
        if bad is not None and bad.offset == 0 and buf.startswith(SNAPSHOT_OPEN):
            rebuilt = _rebuild(core, session_id, buf, where, archived)
            if rebuilt is not None:
                aside = hold.rewrite(rebuilt[0], "corrupt")
                core.forget(session_id)
                return RepairReport(
                    session_id, "rebuilt", where, aside, rebuilt[1], len(rebuilt[0]),
                    len(buf) - rebuilt[2], bad,
                    f"{bad.kind} in the opening snapshot: {rebuilt[3]}; the original is"
                    f" at {aside}",
                )  # fmt: skip
        held = _quarantine(core, buf, cut, kept.seq or 0, kept.link or "", bad)
        saved: str | None
        if held:
            saved = hold.rewrite(buf[:cut] + held[0], "corrupt")
        else:
            saved = hold.keep_prefix(cut, "torn" if bad is None else "corrupt")
        core.forget(session_id)
    dropped = len(buf) - cut
    if bad is None:
        return RepairReport(
            session_id, "truncated", where, saved, n, cut, dropped, torn[0],
            f"truncated a torn tail of {dropped} bytes at byte {cut} (saved to {saved})",
        )  # fmt: skip
    span = (
        f"; events {held[1]}..{held[2]} are in it only (a `quarantined` record holds each"
        f" of their numbers, the next append is seq {held[2] + 1})"
        if held
        else ""
    )
    return RepairReport(
        session_id, "moved_aside", where, saved, n, cut, dropped, bad,
        f"{bad.kind} at byte {bad.offset} (seq {bad.seq}): kept {n} events"
        f" ({cut} bytes) before it; the original is at {saved}{span}",
        held[1:] if held else None,
    )  # fmt: skip


def _quarantine(
    core: SessionCore, buf: bytes, cut: int, last: int, link: str, bad: Problem | None
) -> tuple[bytes, int, int] | None:
    """The `quarantined` records standing in for the events of `buf[cut:]` that a repair
    drops from the live log (the damaged line on: the chain breaks there), chained to the
    kept prefix (last seq `last`, link `link`): one per sequence number they held, so the
    next append is numbered past all of them. (bytes, first seq, last seq); None for a
    torn tail (never acknowledged: nothing to stand in for).

    Their numbers: up to the highest seq a dropped line still claims, where that is
    one the dropped lines can hold (contiguous numbering: `last` + their count at
    most; a damaged line claiming more is not believed), else one per dropped line."""
    if bad is None:
        return None
    dropped = [line for line in buf[cut:].split(b"\n") if line.strip()]
    if not dropped:
        return None
    pieces = _pieces(buf[cut:])  # as many as the events they held, lost newlines too
    claimed = max((head.seq for head in map(_claimed, pieces) if head is not None), default=0)
    top = claimed if last < claimed <= last + len(pieces) else last + len(pieces)
    # an intact line (chained to the one before) is believed past that count (lines
    # lost), as far as the dropped bytes could hold lines (a forged one claims no more)
    top = max(top, min(_chained_seq(pieces, link), last + (len(buf) - cut) // HASH_SUFFIX_LEN))
    why = f"{bad.kind} at byte {bad.offset} (seq {bad.seq})"
    stand_in = Quarantined(
        first_seq=last + 1, last_seq=top, lines=len(dropped), bytes=len(buf) - cut, problem=why
    )
    data, _, _ = core.codec.encode_batch(
        [stand_in] * (top - last), last + 1, link, entropy.now(), None
    )
    return data, last + 1, top


def _archived_events(core: SessionCore, session_id: str) -> list[Event] | None:
    """The archived events from seq 1, each once and checked, in order (a snapshot
    standing in where history was compacted without an archive); None if the archive is
    corrupt or pruned with nothing standing in for what went (a state folded from what
    pruning kept would be passed off as the whole one), [] if there is none. An archive
    that cannot be read safely (a planted symlink, an I/O error) raises: a repair that
    went on would replace the state the damaged snapshot held by the initial one."""
    try:
        with core.engine.history(session_id) as hist:
            segments = [seg for seg in hist.segments if seg.archived]
            return [
                ev
                for ev, _ in iter_history(
                    core,
                    session_id,
                    core.codec.decoder(None),
                    exact=True,  # from seq 1: HistoryPrunedError after pruning
                    history=History(segments),
                )
            ]
    except (CorruptLogError, HistoryUnavailableError):
        return None


def _rebuild(
    core: SessionCore,
    session_id: str,
    buf: bytes,
    where: str,
    archived: list[Event] | None,
) -> tuple[bytes, int, int, str] | None:
    """A new live log for `buf`, whose opening snapshot is damaged: (bytes, events kept,
    bytes of `buf` kept after the snapshot, what was done). None when the damaged line
    does not even say which sequence number it had and there is no archive."""
    codec = core.codec
    nl = buf.find(b"\n")
    first = buf[: nl if nl >= 0 else len(buf)]
    claimed = _claimed(first)
    events = archived or []
    m = events[-1].seq if events else 0
    link = link_of(events[-1]) if events else ""
    if claimed is None and not m:
        return None
    rest = buf[nl + 1 :] if nl >= 0 else b""
    if m and (claimed is None or claimed.seq <= m):
        # the lines after the damaged snapshot chain to its base_h, the archive's link
        seq, base_h = m, link
        held = "a line after it is damaged too"
    else:
        assert claimed is not None
        # the archive cannot give the state at the damaged snapshot's seq: keep that seq
        # (and its link) so nothing is ever numbered twice, with what the archive gives
        seq, base_h = max(claimed.seq, m), claimed.base_h or link
        held = (
            "the archive cannot rebuild it (corrupt, or pruned)"
            if archived is None
            else f"the archive holds events up to seq {m} only"
        )
    # the lines after it that still chain are kept, whatever state the snapshot holds
    after = PrefixReporter()
    tail = read_lines(
        rest, codec, codec.decoder(None), where, offset=nl + 1, seq=seq, link=base_h,
        reporter=after,
    )  # fmt: skip
    kept_after, n_after = rest[: tail.end], len(tail.events)
    beyond = _highest_seq(rest[tail.end :]) if after.error is not None else 0
    if beyond > (tail.seq or seq):
        # a damaged line among them: the lines from it on are dropped (they are in the
        # original, saved aside), and the snapshot is numbered past every seq they held,
        # so the next append reuses none of them
        seq, kept_after, n_after = beyond, b"", 0
    if seq == m:
        how = f"rebuilt the snapshot at seq {m} from the archive, kept {n_after} events after it"
    else:
        how = (
            f"{held}: wrote a snapshot at seq {seq} with the state as of seq {m};"
            f" events {m + 1}..{seq} could not be recovered, kept {n_after} events after it"
        )
    states: dict[str, msgspec.Raw] = {}
    for name, proj in core.projections.items():
        state = fold(proj, proj.initial(), events)
        if stored_in_snapshot(proj, state):
            states[name] = snapshot_entry(proj, state)
    unknown = [msgspec.Raw(ev.raw) for ev in events if type(ev) is UnknownEvent]
    known = sorted(t for t in codec.types if t != "snapshot")
    # the pruning records the damaged snapshot carried, if its JSON still reads: without
    # them the pruned archive before it would read as lost
    pruned = [msgspec.Raw(raw) for _, raw in pruning_records(first + b"\n")]
    snap = Snapshot(base_h=base_h, states=states, unknown=unknown, known=known, pruned=pruned)
    cipher = core.snapshot_cipher(session_id, "rebuilding its snapshot")
    line, _ = codec.encode_snapshot(snap, seq, base_h, entropy.now(), cipher)
    return line + kept_after, 1 + n_after, nl + 1 + len(kept_after), how


def _highest_seq(data: bytes) -> int:
    """The highest sequence number a line of `data` still claims (0: none decodes)."""
    heads = (_claimed(line) for line in _pieces(data))
    return max((head.seq for head in heads if head is not None), default=0)


def _chained_seq(pieces: list[bytes], link: str) -> int:
    """The highest seq claimed by one of `pieces` (`_pieces`) whose `h` chains it to
    the piece before it (the first: to `link`, the kept prefix's): an intact line."""
    best = 0
    for piece in pieces:
        head, sh = _claimed(piece), split_hash(piece)
        if head is not None and sh is not None and hash_checks(link.encode(), piece, sh[1]):
            best = max(best, head.seq)
        if head is not None and head.type == "snapshot":
            link = head.base_h or ""
        else:
            link = sh[1] if sh is not None else ""
    return best


_LINE_END = re.compile(rb',"h":"[0-9a-f]{16}"\}')
"""How every line ends (`chain.HASH_SUFFIX_LEN`); its quotes are never in a string's
bytes (escaped there), only a nested object's own `h` field could look like it."""


def _pieces(data: bytes) -> list[bytes]:
    """The lines of damaged bytes `data`, split at each newline and also after each line
    end (`_LINE_END`) that a damaged byte, not a newline, follows: lines whose newline
    was lost count (and claim their seq) one each. (A nested object's last field named
    `h` can split a line in two: one more number held, none reused.)"""
    pieces: list[bytes] = []
    for line in data.split(b"\n"):
        start = 0
        for m in _LINE_END.finditer(line):
            pieces.append(line[start : m.end()])
            start = m.end()
        pieces.append(line[start:])
    out = []
    for piece in pieces:
        piece = piece.strip()
        if piece[1:2] == b"{" and piece[:1] != b"{":
            piece = piece[1:]  # the byte that replaced the newline before it
        if piece:
            out.append(piece)
    return out


def _claimed(line: bytes) -> LineHead | None:
    """The envelope a damaged line still carries (its seq, base_h), if it decodes."""
    try:
        return _line_head.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


_line_head = HEAD_DECODER
