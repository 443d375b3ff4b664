"""The one line reader: log bytes -> checked events, with a reporter deciding what a
problem does.

Every reader of log lines goes through `read_lines` (loads, history, verify, repair,
follow, compaction). It checks, per line: it decodes (exactly, upcasting old versions;
an unknown type is kept verbatim), it ends with its `h` and `h` is the hash of the line
chained to the previous line's link (see `eventstore.format.chain`), sequence numbers are
contiguous, a snapshot opens a log or not at all, and batches are whole. What happens
at a problem is the reporter's choice (LevelDB's log reader is the model):

- `STRICT` (loads, history reads): the first error raises `CorruptLogError` naming the
  log, the byte offset and the sequence number; warnings (an unknown type, a blank line,
  a torn tail) are not errors.
- `Collecting` (verify): every problem is recorded as a `Problem`, and reading goes on.
- `Prefix` (repair): reading stops at the first error; the result covers the complete
  batches before it.

Lines after the last complete batch (a partial last line, a batch without its closing
line) are a torn tail: never returned as events, reported as a warning. A partial last
line that is a whole line whose `h` checks, its newline replaced by another byte, is no
torn tail but a damaged committed line: an error (`damaged_newline`).

Loads take a fast path when the run is regular (one msgspec call for every line, a few
C-level checks, one hash per line) and fall back to the careful line-by-line reading,
which finds and reports the problem, when anything is irregular.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
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
    hash_checks,
    line_hash,
    link_of,
    split_hash,
    states_end,
)
from eventstore.format.codec import EventCodec
from eventstore.format.events import (
    Event,
    Snapshot,
    UnknownEvent,
)

__all__ = [
    "STRICT",
    "Collecting",
    "Lines",
    "Prefix",
    "Problem",
    "Reporter",
    "Severity",
    "read_lines",
]

Severity = Literal["error", "warning"]


class Problem(msgspec.Struct, frozen=True):
    """One finding of a reader: where (file, byte offset, sequence number) and what.

    `kind` names the check (`hash_mismatch`, `sequence`, `batch`, `undecodable`,
    `malformed`, `misplaced_snapshot`, `torn_tail`, `torn_batch`, `unknown_type`,
    `blank_line`, and verify's cross-file kinds). An "error" means the log cannot be
    trusted there; a "warning" does not (see `eventstore.ops.verify`).
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


class Prefix(Reporter):
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


@dataclass(slots=True)
class Lines:
    """What `read_lines` read.

    `events`: the events of complete batches read without error, in order. `raw`: their
    lines (without newline), when asked for. `end`: the bytes of the buffer those batches
    occupy (a torn tail, and with `Prefix` everything from the first error, lie after it).
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
    hashes: dict[int, str] = field(default_factory=dict)
    links: dict[int, str] = field(default_factory=dict)


_blake2b = hashlib.blake2b
_get_seq = attrgetter("seq")
_get_more = attrgetter("more")
_get_v = attrgetter("v")
_get_h = attrgetter("h")
_dict_decoder = msgspec.json.Decoder(dict[str, object])


def read_lines(
    buf: bytes | memoryview,
    codec: EventCodec,
    decoder: msgspec.json.Decoder[Event],
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
    decoder: msgspec.json.Decoder[Event],
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
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
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
    if lines is not None and not hashes_checked and not _chain_checks(lines, events, first, link):
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


def _decode_lines(
    decoder: msgspec.json.Decoder[Event], region: bytes | memoryview, offset: int
) -> list[Event]:
    """`decoder.decode_lines(region)`, where a long snapshot opening the log is decoded
    by its layout: its states are cut from the line as `Raw` at the ranges the layout
    gives (once `states_end` finds the line shaped as it says), not scanned by msgspec
    (a tenth of a cold load after compaction). Same events either way; any other shape
    is decoded whole."""
    if offset == 0 and len(region) >= _LONG_SNAPSHOT and region[:_OPEN] == SNAPSHOT_OPEN:
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
                    return [snap, *decoder.decode_lines(view[head.length + 1 :])]
    return decoder.decode_lines(region)


def _restates(rest: memoryview) -> bool:
    """Whether `rest` may hold a `states` key (then the line is decoded whole)."""
    data = rest.tobytes()  # the fields after the states: a few hundred bytes
    return b'"states"' in data or b"\\u" in data


_LONG_SNAPSHOT = 64 << 10  # below it, a snapshot line costs little to decode whole
_HEADER_MAX = 16 << 10  # a snapshot's header (envelope, length, layout) is far shorter
_OPEN = len(SNAPSHOT_OPEN)


def _chain_checks(lines: list[bytes], events: list[Event], first: int, link: str) -> bool:
    """Whether every line ends with its `h` and each `h` chains its line to the one
    before: h = blake2b(link of the line before + the line up to `,"h":"` + "}"). An
    opening snapshot (`first`) chains to its own base_h, and so does the line after it."""
    hs = list(map(_get_h, events))
    if first:
        prev = events[0].base_h.encode()  # type: ignore[attr-defined]
        if not hash_checks(prev, lines[0], hs[0]):
            return False
    else:
        prev = link.encode()
    for line, h in zip(lines[first:], hs[first:], strict=True):
        # inlined hash_checks: this loop is the cost of checking on every load
        if line[-24:-18] != b',"h":"':
            return False
        digest = _blake2b(prev, digest_size=8)
        digest.update(memoryview(line)[:-24])  # the body, not copied
        digest.update(b"}")
        if digest.hexdigest() != h:
            return False
        prev = line[-18:-2]
    return True


def _read_careful(
    buf: bytes,
    codec: EventCodec,
    decoder: msgspec.json.Decoder[Event],
    where: str,
    offset: int,
    seq: int | None,
    link: str | None,
    reporter: Reporter,
    keep_raw: bool,
    keep_links: bool,
) -> Lines:
    """Line by line, every check, every problem to the reporter."""
    events: list[Event] = []
    raw: list[bytes] = []
    hashes: dict[int, str] = {}
    links: dict[int, str] = {}
    # what the last closing line left: the result when what follows is torn or bad
    c_events = c_raw = c_end = 0
    c_seq, c_link, c_h = seq, link, ""
    prev_seq = seq
    more = 0
    batch_start = 0
    stopped = False
    pos = 0
    n = len(buf)
    errors = 0

    def report(
        off: int,
        s: int | None,
        kind: str,
        msg: str,
        sev: Severity = "error",
        expected: int | None = None,
    ) -> None:
        nonlocal errors
        errors += sev == "error"
        reporter.report(Problem(where, offset + off, s, kind, msg, sev), expected)

    while pos < n:
        nl = buf.find(b"\n", pos)
        want = None if prev_seq is None else prev_seq + 1
        if nl < 0 and link is not None and damaged_newline(buf[pos:], link):
            report(
                pos,
                want,
                "damaged_newline",
                f"the last line ({n - pos} bytes) is complete and its h checks, but its"
                " newline was replaced by another byte: a committed line was damaged, not"
                " torn by a crash",
            )
            break
        if nl < 0:
            report(
                pos,
                want,
                "torn_tail",
                f"partial last line of {n - pos} bytes (no newline): a crash or a writer"
                " mid-append; readers ignore it, the next writer sets it aside",
                "warning",
            )
            break
        line = buf[pos:nl]
        off = pos
        pos = nl + 1
        if not line.strip():
            report(off, want, "blank_line", "a blank line (it holds no event)", "warning")
            if not more:
                c_end = pos
            continue
        before = errors
        decoded = _decode(codec, decoder, line, offset + off, where)
        ev: Event | None = None
        if isinstance(decoded, CorruptLogError):
            report(off, decoded.seq or want, "undecodable", decoded.reason)
        else:
            ev = decoded
        sh = split_hash(line)
        if sh is None:
            report(off, want, "malformed", 'the line does not end with its "h" field')
        if ev is None:
            if reporter.stops:
                stopped = True
                break
            # keep the sequence and the chain going from what the line claims
            prev_seq, more = _envelope_guess(line, want)
            link = sh[1] if sh is not None else None
            continue
        s = ev.seq
        if type(ev) is Snapshot:
            if offset + off != 0 or events:
                report(off, s, "misplaced_snapshot", "a snapshot after the first line")
            link = ev.base_h
        elif want is not None and s != want:
            if prev_seq == 0:
                report(off, s, "sequence", f"the log starts at sequence {s}, not 1", expected=want)
            else:
                msg = f"sequence {s} where {want} was expected"
                report(off, s, "sequence", msg, expected=want)
        if sh is not None and link is not None:
            expect = line_hash(link, sh[0])
            if expect != sh[1]:
                report(
                    off,
                    s,
                    "hash_mismatch",
                    f"h is {sh[1]} but the line and the link before it hash to {expect}: the"
                    " line was edited, or a line before it was dropped, inserted or reordered",
                )
        if more and ev.more != more - 1:
            report(
                off, s, "batch", f"batch broken: 'more' is {ev.more} where {more - 1} was expected"
            )
        if type(ev) is UnknownEvent:
            report(
                off,
                s,
                "unknown_type",
                f"event type {ev.type_name!r} is unknown to this reader (hash checked,"
                " payload not)",
                "warning",
            )
        if errors > before and reporter.stops:
            stopped = True
            break
        if not more:
            batch_start = off
        prev_seq = s
        more = ev.more
        if sh is None:
            link = None
        elif type(ev) is not Snapshot:
            link = sh[1]  # an unknown event's link is its h, like every line's but a snapshot's
        if keep_links and sh is not None and link is not None:
            hashes[s] = sh[1]
            links[s] = link
        events.append(ev)
        if keep_raw:
            raw.append(line)
        if not more:
            c_events, c_raw, c_end = len(events), len(raw), pos
            c_seq, c_link, c_h = s, link, ev.h
    if more and not stopped:
        report(
            batch_start,
            None if c_seq is None else c_seq + 1,
            "torn_batch",
            "the last batch has no closing line (a crash mid-append); readers ignore it,"
            " the next writer sets it aside",
            "warning",
        )
    del events[c_events:]
    del raw[c_raw:]
    return Lines(events, c_end, c_seq, c_link, c_h, raw if keep_raw else None, hashes, links)


def _decode(
    codec: EventCodec, decoder: msgspec.json.Decoder[Event], line: bytes, at: int, where: str
) -> Event | CorruptLogError:
    """One line, exactly (an old version upcast, an unknown type kept verbatim), or the
    error saying why it does not decode."""
    try:
        try:
            ev = decoder.decode_lines(line + b"\n")[0]
        except (msgspec.DecodeError, msgspec.ValidationError, IndexError):
            return codec.decode_line(line, at, where)
        if ev.v != type(ev).VERSION and not type(ev).SKIPPED:
            return codec.decode_line(line, at, where)
        return ev
    except CorruptLogError as exc:
        return exc


def _envelope_guess(line: bytes, want: int | None) -> tuple[int | None, int]:
    """The seq and `more` an unreadable line claims, so reading can go on after it."""
    try:
        data = _dict_decoder.decode(line)
    except msgspec.DecodeError:
        return want, 0
    s = data.get("seq")
    m = data.get("more", 0)
    return (s if isinstance(s, int) else want), (m if isinstance(m, int) else 0)
