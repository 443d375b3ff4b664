"""The batch level of the one line reader: log bytes -> checked events, with a reporter
deciding what a problem does.

Every reader of log lines goes through `read_lines` (loads, history, verify, repair,
follow, compaction). Each line is checked on its own by the line level
(`eventstore.format.lines`: it decodes, exactly, upcasting old versions and keeping an
unknown type verbatim; it ends with its `h`, and `h` is the hash of the line chained to
the previous line's link, see `eventstore.format.chain`); here, across lines: sequence
numbers are contiguous, a snapshot opens a log or not at all, and batches are whole.
What happens at a problem is the reporter's choice (LevelDB's log reader is the model):

- `STRICT` (loads, history reads): the first error raises `CorruptLogError` naming the
  log, the byte offset and the sequence number; warnings (an unknown type, a blank line,
  a torn tail) are not errors.
- `Collecting` (verify): every problem is recorded as a `Problem`, and reading goes on.
- `PrefixReporter` (repair): reading stops at the first error; the result covers the
  complete batches before it.

Lines after the last complete batch (a partial last line, a batch without its closing
line) are a torn tail: never returned as events, reported as a warning. A partial last
line that is a whole line whose `h` checks, its newline replaced by another byte, is no
torn tail but a damaged committed line: an error (`damaged_newline`).

Loads take a fast path when the run is regular (one msgspec call for every line, a few
C-level checks, one hash per line) and fall back to the careful line-by-line reading,
which finds and reports the problem, when anything is irregular.
"""

from __future__ import annotations

from itertools import compress
from operator import attrgetter
from typing import Literal

import msgspec

from eventstore.errors import CorruptLogError
from eventstore.format.chain import (
    SNAPSHOT_OPEN,
    STATES_OPEN,
    damaged_newline,
    find_snapshot_head,
    link_of,
    states_end,
)
from eventstore.format.codec import EventCodec, LineDecoder
from eventstore.format.events import (
    Event,
    Snapshot,
    UnknownEvent,
)
from eventstore.format.lines import (
    CheckedLine,
    chain_checks,
    check_line,
    envelope_guess,
    split_lines,
)
from eventstore.format.tail import committed_end

__all__ = [
    "LONG_SNAPSHOT",
    "STRICT",
    "Collecting",
    "Lines",
    "PrefixReporter",
    "Problem",
    "Reporter",
    "Severity",
    "read_lines",
]

Severity = Literal["error", "warning", "info"]


class Problem(msgspec.Struct, frozen=True):
    """One finding of a reader: where (file, byte offset, sequence number) and what.

    `kind` names the check (`hash_mismatch`, `sequence`, `batch`, `undecodable`,
    `malformed`, `misplaced_snapshot`, `torn_tail`, `torn_batch`, `unknown_type`,
    `blank_line`, and verify's cross-file kinds). An "error" means the log cannot be
    trusted there; a "warning" does not; an "info" is a fact worth saying, no fault
    (see `eventstore.ops.verify`).
    """

    file: str
    offset: int
    seq: int | None
    kind: str
    message: str
    severity: Severity = "error"


class Reporter:
    """What a problem does: the base records nothing and lets reading go on."""

    stops = False  # True: reading ends at the first error

    def report(self, problem: Problem, expected_seq: int | None = None) -> None:
        """Called for every problem found, in file order. `problem.seq` is the line's own
        sequence number; `expected_seq` the one it should have had, when they differ."""


class _Strict(Reporter):
    """Raise CorruptLogError at the first error; warnings pass. The error names the
    sequence number the line should have had (what a reader was looking for)."""

    def report(self, problem: Problem, expected_seq: int | None = None) -> None:
        if problem.severity == "error":
            seq = problem.seq if expected_seq is None else expected_seq
            raise CorruptLogError(problem.file, problem.offset, seq, problem.message)


STRICT: Reporter = _Strict()
"""The reporter of loads and history reads (the default of `read_lines`)."""


class Collecting(Reporter):
    """Record every problem (verify)."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def report(self, problem: Problem, expected_seq: int | None = None) -> None:
        self.problems.append(problem)


class PrefixReporter(Reporter):
    """Stop at the first error and remember it (repair); warnings are recorded too."""

    stops = True

    def __init__(self) -> None:
        self.error: Problem | None = None
        self.warnings: list[Problem] = []

    def report(self, problem: Problem, expected_seq: int | None = None) -> None:
        if problem.severity == "error":
            if self.error is None:
                self.error = problem
        else:
            self.warnings.append(problem)


class Lines(msgspec.Struct):
    """What `read_lines` read.

    `events`: the events of complete batches read without error, in order. `raw`: their
    lines (without newline), when asked for. `end`: the bytes of the buffer those batches
    occupy (a torn tail, and with `PrefixReporter` everything from the first error, lie after it).
    `seq`, `link`, `h`: of the last of them (the values given when there is none).
    `hashes`/`links`: each read line's `h` and the link the next line chains to, by seq
    (when asked for: verify compares them across files).
    """

    events: list[Event]
    end: int
    seq: int | None
    link: str | None
    h: str
    raw: list[bytes] | None = None
    hashes: dict[int, str] = msgspec.field(default_factory=dict)
    links: dict[int, str] = msgspec.field(default_factory=dict)


_get_seq = attrgetter("seq")
_get_more = attrgetter("more")
_get_v = attrgetter("v")


def read_lines(
    buf: bytes | memoryview,
    codec: EventCodec,
    decoder: LineDecoder,
    where: str,
    *,
    offset: int = 0,
    seq: int | None = 0,
    link: str | None = "",
    reporter: Reporter = STRICT,
    keep_raw: bool = False,
    keep_links: bool = False,
    hashes_checked: bool = False,
) -> Lines:
    """Read the lines of `buf`, which starts at byte `offset` of the log named `where`.

    `seq` and `link`: the sequence number and link of the line before `buf` (0 and "" at
    the start of a session's history; None: unknown, any first line accepted). At offset
    0 a snapshot may open the log. `decoder` decodes the types the caller needs (others
    come back as bare envelopes, see `EventCodec.decoder`). Problems go to `reporter`.
    `hashes_checked`: the caller vouches that these exact bytes passed the hash-chain
    check before (`eventstore.core.checked_prefix` proves it with a digest of them), so the
    regular path skips the per-line hashes; every other check still runs. A memoryview
    (a piece of `Engine.read_some`) is decoded in place when no line needs splitting
    out (checked bytes, no raw lines kept), else copied to bytes first.
    """
    if isinstance(buf, memoryview):
        regular = hashes_checked and reporter is STRICT and not (keep_raw or keep_links)
        if regular and buf and buf[-1] == 10:  # ends with a newline: whole lines
            fast = _read_regular(buf, decoder, offset, seq, link, False, True)
            if fast is not None:
                return fast
            # the same bytes would fail the fast path again: the careful way, once
            return _read_careful(
                buf.tobytes(), codec, decoder, where, offset, seq, link, reporter, False, False
            )
        buf = buf.tobytes()
    end = buf.rfind(b"\n") + 1
    region = buf if end == len(buf) else buf[:end]
    # a partial last line goes the careful way, which tells a torn line from a damaged one
    if reporter is STRICT and not keep_links and end == len(buf) and end:
        fast = _read_regular(region, decoder, offset, seq, link, keep_raw, hashes_checked)
        if fast is not None:
            return fast  # a partial last line after `end` is a torn tail: loads ignore it
    return _read_careful(
        buf, codec, decoder, where, offset, seq, link, reporter, keep_raw, keep_links
    )


def _read_regular(
    region: bytes | memoryview,
    decoder: LineDecoder,
    offset: int,
    seq: int | None,
    link: str | None,
    keep_raw: bool,
    hashes_checked: bool = False,
) -> Lines | None:
    """The fast path: the whole region in one msgspec call, checked with a few C-level
    passes and one hash per line (none when `hashes_checked`). None when anything is
    irregular (an undecodable or old line, a blank line, a gap, a broken batch, a hash
    that does not check): the careful reader then finds and reports it."""
    try:
        events = _decode_lines(decoder, region, offset)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None  # (a line nested too deep: the careful path names it)
    n = len(events)
    # the lines themselves are needed for their hashes; without those, a count will do
    lines: list[bytes] | None = None
    if not hashes_checked or keep_raw:
        lines = bytes(region).split(b"\n")[:-1]
        if n != len(lines):
            return None  # blank lines, which msgspec skips: the careful path warns
    # (bytes that passed the checks before may hold blank lines: the careful path
    # returned the same events then, skipping them)
    if not n or seq is None or link is None:
        return None  # nothing to check against
    seqs = list(map(_get_seq, events))
    first = 1 if offset == 0 and type(events[0]) is Snapshot else 0
    expected = seqs[0] + 1 if first else seq + 1
    if seqs[first:] != list(range(expected, expected + n - first)):
        return None
    types: set[type[Event]] = set(map(type, events[first:]))
    if Snapshot in types:
        return None
    # a line not at version 1 is fine if it is at its type's current version (an older
    # one needs upcasting, a newer one is refused: the careful path does both)
    if (
        set(map(_get_v, events)) != {1} or any(t.VERSION != 1 and not t.SKIPPED for t in types)
    ) and any(ev.v != type(ev).VERSION and not type(ev).SKIPPED for ev in events[first:]):
        return None
    mores = list(map(_get_more, events))
    for i in compress(range(n), mores):  # only lines of multi-event batches: few
        m = mores[i]
        if i + 1 < n and mores[i + 1] != m - 1:
            return None
        if i and mores[i - 1] and mores[i - 1] != m + 1:
            return None
    commit = n
    while commit and mores[commit - 1]:
        commit -= 1  # a torn batch at the end
    if lines is not None and not hashes_checked and not chain_checks(lines, events, first, link):
        return None
    if commit < n:
        del events[commit:]
        if lines is None:
            lines = bytes(region).split(b"\n")[:-1]  # (bytes: no copy; a view: copied)
        del lines[commit:]
        end = sum(map(len, lines)) + len(lines)
    else:
        end = len(region)
    if not events:
        return Lines([], 0, seq, link, "", [] if keep_raw else None)
    last = events[-1]
    return Lines(events, end, last.seq, link_of(last), last.h, lines if keep_raw else None)


def _decode_lines(decoder: LineDecoder, region: bytes | memoryview, offset: int) -> list[Event]:
    """`decoder.decode_lines(region)`, where a long snapshot opening the log is decoded
    by its layout: its states are cut from the line as `Raw` at the ranges the layout
    gives (once `states_end` finds the line shaped as it says), not scanned by msgspec
    (a tenth of a cold load after compaction). Same events either way; any other shape
    is decoded whole. (The fast path's one decode of many lines: it stays at this level,
    which knows a snapshot may open the log at offset 0 only.)"""
    if offset == 0 and len(region) >= LONG_SNAPSHOT and region[:_OPEN] == SNAPSHOT_OPEN:
        view = memoryview(region)  # the states are views of it: no copy
        found = find_snapshot_head(lambda n: bytes(view[: min(n, _HEADER_MAX)]))
        head, header = found if found is not None else (None, b"")
        if head is not None and 0 < head.length < len(view) and view[head.length] == 0x0A:
            end = states_end(view, head, len(header) + len(STATES_OPEN))
            # the fields after the states must not name `states` again (a decoder keeps
            # the last of two equal keys; an escape like "st\u0061tes" spells it too)
            if end is not None and end < head.length and not _restates(view[end + 1 : head.length]):
                # the line without its states' entries: a few hundred bytes to decode
                try:
                    snap = decoder.decode(header + b',"states":{}' + view[end + 1 : head.length])
                except (msgspec.DecodeError, msgspec.ValidationError):
                    snap = None  # decoded whole below, which fails the same way
                if type(snap) is Snapshot and not snap.states:
                    snap.states = {n: msgspec.Raw(view[a:b]) for n, (a, b) in head.layout.items()}
                    decoder.decrypt_snapshot(snap)
                    return [snap, *decoder.decode_lines(view[head.length + 1 :])]
    return decoder.decode_lines(region)


def _restates(rest: memoryview) -> bool:
    """Whether `rest` may hold a `states` key (then the line is decoded whole)."""
    data = rest.tobytes()  # the fields after the states: a few hundred bytes
    return b'"states"' in data or b"\\u" in data


LONG_SNAPSHOT = 64 << 10
"""From this many bytes, a snapshot line opening a region is decoded by its layout (its
states cut out and decoded only for the projections asked); below it, a snapshot costs
little to decode whole. A tuning knob, and a test hook: set to 0, every snapshot takes
the cut path; set past any line, none does."""
_HEADER_MAX = 16 << 10  # a snapshot's header (envelope, length, layout) is far shorter
_OPEN = len(SNAPSHOT_OPEN)


def _read_careful(
    buf: bytes,
    codec: EventCodec,
    decoder: LineDecoder,
    where: str,
    offset: int,
    seq: int | None,
    link: str | None,
    reporter: Reporter,
    keep_raw: bool,
    keep_links: bool,
) -> Lines:
    """Line by line, every check, every problem to the reporter."""
    batches = _Batches(where, offset, seq, link, reporter, keep_raw, keep_links)
    holed = _holed_batch(buf, where, offset)
    for off, line, complete in split_lines(buf if holed is None else buf[:holed]):
        if not complete:
            batches.tail(off, line)
            break
        if not line.strip():
            batches.blank(off, off + len(line) + 1)
            continue
        checked = check_line(codec, decoder, line, offset + off, where, batches.link)
        if not batches.take(off, line, checked):
            break
    else:
        if holed is not None:
            batches.holed(holed, len(buf) - holed)
    return batches.result()


def _holed_batch(buf: bytes, where: str, offset: int) -> int | None:
    """Where a last batch holding a NUL byte starts (None: no such batch): torn, as the
    engines' `committed_end` says, not a damaged committed line."""
    if b"\0" not in buf:
        return None
    try:
        end, _ = committed_end(buf, where, offset)
    except CorruptLogError:
        return None  # an undecodable line without a hole: the careful reading reports it
    return end if b"\0" in buf[end : buf.rfind(b"\n") + 1] else None


class _Batches:
    """The careful reading's batch level: the lines the line level checked, taken in
    order, against the sequence, the batches and a snapshot's place; every problem to
    the reporter. What the last closing line left (`c_*`) is the result when what
    follows is torn or bad."""

    def __init__(
        self,
        where: str,
        offset: int,
        seq: int | None,
        link: str | None,
        reporter: Reporter,
        keep_raw: bool,
        keep_links: bool,
    ) -> None:
        self.where, self.offset, self.reporter = where, offset, reporter
        self.keep_raw, self.keep_links = keep_raw, keep_links
        self.link = link  # what the next line chains to (None: unknown)
        self.prev_seq = seq
        self.more = 0  # the `more` of the line before: lines of its batch still to come
        self.batch_start = 0
        self.stopped = False
        self.errors = 0
        self.events: list[Event] = []
        self.raw: list[bytes] = []
        self.hashes: dict[int, str] = {}
        self.links: dict[int, str] = {}
        self.c_events = self.c_raw = self.c_end = 0
        self.c_seq, self.c_link, self.c_h = seq, link, ""

    def report(
        self,
        off: int,
        s: int | None,
        kind: str,
        msg: str,
        sev: Severity = "error",
        expected: int | None = None,
    ) -> None:
        self.errors += sev == "error"
        self.reporter.report(Problem(self.where, self.offset + off, s, kind, msg, sev), expected)

    @property
    def want(self) -> int | None:
        """The sequence number the next line should have (None: any)."""
        return None if self.prev_seq is None else self.prev_seq + 1

    def tail(self, off: int, tail: bytes) -> None:
        """The bytes after the last newline: a torn line, or a damaged committed one."""
        n = len(tail)
        if self.link is not None and damaged_newline(tail, self.link):
            self.report(
                off,
                self.want,
                "damaged_newline",
                f"the last line ({n} bytes) is complete and its h checks, but its"
                " newline was replaced by another byte: a committed line was damaged, not"
                " torn by a crash",
            )
        else:
            self.report(
                off,
                self.want,
                "torn_tail",
                f"partial last line of {n} bytes (no newline): a crash or a writer"
                " mid-append; readers ignore it, the next writer sets it aside",
                "warning",
            )

    def holed(self, off: int, n: int) -> None:
        """The last batch (`n` bytes from `off`) holds a hole of zeros: a power loss kept
        its later blocks and not its first (an acknowledged batch is in its journal,
        which readers consult and the next writer copies back)."""
        self.report(
            off,
            self.want,
            "torn_batch",
            f"the last batch ({n} bytes) holds a hole of zero bytes (a power loss"
            " mid-append); readers ignore it, the next writer sets it aside",
            "warning",
        )

    def blank(self, off: int, end: int) -> None:
        """A blank line (ending at `end`): it holds no event, and closes no batch."""
        self.report(off, self.want, "blank_line", "a blank line (it holds no event)", "warning")
        if not self.more:
            self.c_end = end

    def take(self, off: int, line: bytes, checked: CheckedLine) -> bool:
        """Take one checked line; False when reading stops there."""
        want = self.want
        before = self.errors
        ev = checked.event
        if checked.error is not None:
            self.report(off, checked.error.seq or want, "undecodable", checked.error.reason)
        if checked.h is None:
            self.report(off, want, "malformed", 'the line does not end with its "h" field')
        if ev is None:
            if self.reporter.stops:
                self.stopped = True
                return False
            # keep the sequence and the chain going from what the line claims
            self.prev_seq, self.more = envelope_guess(line, want)
            self.link = checked.link
            return True
        self._check_place(off, ev, want, checked)
        if self.errors > before and self.reporter.stops:
            self.stopped = True
            return False
        self._add(off, line, ev, checked)
        return True

    def _check_place(self, off: int, ev: Event, want: int | None, checked: CheckedLine) -> None:
        """The checks of a decoded line among the others, reported in line order."""
        s = ev.seq
        if type(ev) is Snapshot:
            if self.offset + off != 0 or self.events:
                self.report(off, s, "misplaced_snapshot", "a snapshot after the first line")
        elif want is not None and s != want:
            if self.prev_seq == 0:
                msg = f"the log starts at sequence {s}, not 1"
            else:
                msg = f"sequence {s} where {want} was expected"
            self.report(off, s, "sequence", msg, expected=want)
        if checked.expected_h is not None:
            self.report(
                off,
                s,
                "hash_mismatch",
                f"h is {checked.h} but the line and the link before it hash to"
                f" {checked.expected_h}: the line was edited, or a line before it was"
                " dropped, inserted or reordered",
            )
        if self.more and ev.more != self.more - 1:
            self.report(
                off,
                s,
                "batch",
                f"batch broken: 'more' is {ev.more} where {self.more - 1} was expected",
            )
        if type(ev) is UnknownEvent:
            self.report(
                off,
                s,
                "unknown_type",
                f"event type {ev.type_name!r} is unknown to this reader (hash checked,"
                " payload not)",
                "warning",
            )

    def _add(self, off: int, line: bytes, ev: Event, checked: CheckedLine) -> None:
        """Keep a line that read without stopping; commit its batch when it closes one."""
        if not self.more:
            self.batch_start = off
        s = self.prev_seq = ev.seq
        self.more = ev.more
        self.link = link = checked.link
        if self.keep_links and checked.h is not None and link is not None:
            self.hashes[s] = checked.h
            self.links[s] = link
        self.events.append(ev)
        if self.keep_raw:
            self.raw.append(line)
        if not self.more:
            self.c_events, self.c_raw, self.c_end = (
                len(self.events),
                len(self.raw),
                off + len(line) + 1,
            )
            self.c_seq, self.c_link, self.c_h = s, link, ev.h

    def result(self) -> Lines:
        """The complete batches read; a batch left open at the end is torn (a warning)."""
        if self.more and not self.stopped:
            self.report(
                self.batch_start,
                None if self.c_seq is None else self.c_seq + 1,
                "torn_batch",
                "the last batch has no closing line (a crash mid-append); readers ignore it,"
                " the next writer sets it aside",
                "warning",
            )
        del self.events[self.c_events :]
        del self.raw[self.c_raw :]
        raw = self.raw if self.keep_raw else None
        return Lines(
            self.events, self.c_end, self.c_seq, self.c_link, self.c_h, raw, self.hashes, self.links
        )
