"""Lines found by their seq (`eventstore.ops.seek.events_by_seq`): a few small reads of a
log of any length and any mix of line sizes (or one read by seq, on PostgreSQL and
Redis) find exactly the event a fold reads at that seq, on every engine that can; a
line that does not check, a seq the live log does not hold, a log that opens with a
snapshot, bytes past the committed size and an engine that reads neither ranges nor
seqs are never answered from."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from engines import EngineCase, WholeLogsOnly
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore import SessionStore
from eventstore.engines.base import Engine
from eventstore.engines.file.layout import SessionPaths
from eventstore.engines.memory import MemoryEngine
from eventstore.errors import CorruptLogError
from eventstore.format.events import ProgressAppended
from eventstore.ops.seek import can_seek, events_by_seq
from eventstore.records import ProgressEntry

SID = "s"
TAGS = frozenset({"progress_appended"})
# most lines short, some longer than any one read of the search
SIZES = st.one_of(st.integers(1, 400), st.integers(400, 5_000), st.integers(60_000, 200_000))


def _batches(most: int) -> st.SearchStrategy[list[list[int]]]:
    """Up to `most` appends of 1 to 4 lines of drawn sizes each."""
    return st.lists(st.lists(SIZES, min_size=1, max_size=4), min_size=1, max_size=most)


def _fill(store: SessionStore, batches: list[list[int]]) -> list[Any]:
    """One append per batch, a progress entry per size (its summary that long); the
    events as a fold reads them."""
    n = 0
    for sizes in batches:
        events = []
        for size in sizes:
            n += 1
            events.append(ProgressAppended(entry=ProgressEntry(f"r{n}", chr(97 + n % 26) * size)))
        store.append(SID, events)
    return list(store.read_events(SID))


@contextmanager
def _seek(root: Path | str | Engine) -> Any:
    with SessionStore(root) as s, events_by_seq(s, SID, TAGS) as event_at:
        yield event_at


def _whole_logs_only(url: str) -> bool:
    """Whether the store's engine reads neither byte ranges nor lines by seq."""
    with SessionStore(url) as s:
        return not can_seek(s)


def _written(
    case: EngineCase, tmp_path_factory: Any, data: st.DataObject, batches: int
) -> tuple[str, list[Any]]:
    """A store of `case`'s engine whose session holds up to `batches` appends of drawn
    line lengths."""
    url = case.fresh(tmp_path_factory.mktemp("seek"))
    with SessionStore(url) as s:
        return url, _fill(s, data.draw(_batches(batches)))


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_every_seq_is_found_in_any_order_as_the_fold_reads_it(
    case: EngineCase, tmp_path_factory: Any, data: st.DataObject
) -> None:
    url, events = _written(case, tmp_path_factory, data, 25)
    seqs = data.draw(st.permutations(range(1, len(events) + 1)))
    with _seek(url) as event_at:
        if event_at is None:
            assert _whole_logs_only(url)
            return
        if data.draw(st.booleans()):
            event_at.want(seqs[: len(seqs) // 2])  # some read together first
        for seq in seqs:
            assert event_at(seq) == events[seq - 1]
        assert event_at(0) is None and event_at(len(events) + 1) is None


def _edited(data: bytes, seq: int) -> bytes:
    """`data` with one letter of the summary of the line of `seq` changed (its JSON
    stays valid)."""
    out = bytearray(data)
    at = out.index(b'"seq":%d,' % seq)
    i = out.index(b'"summary":"', at) + len('"summary":"')
    out[i] = ord("z") if out[i] != ord("z") else ord("y")
    return bytes(out)


def test_a_line_that_does_not_check_is_not_answered(case: EngineCase, url: str) -> None:
    with SessionStore(url) as s:
        events = _fill(s, [[100, 70_000], [300], [5, 6, 7]])
        case.rewrite(s, SID, lambda data: _edited(data, 3))
    with _seek(url) as event_at:
        if event_at is None:
            assert _whole_logs_only(url)
            return
        assert event_at(3) is None
        # the lines around it still check: each against the `h` ending the line before
        assert [event_at(seq) for seq in (1, 2, 4, 5, 6)] == [events[i] for i in (0, 1, 3, 4, 5)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_an_edited_log_answers_its_original_events_or_nothing(
    tmp_path_factory: Any, data: st.DataObject
) -> None:
    """Whatever an outsider does to the log's bytes (seqs rewritten, lines copied or
    dropped, newlines and digits planted), a seq is answered with the event first
    written at it or not at all, and every search ends."""
    root = tmp_path_factory.mktemp("seek")
    with SessionStore(root) as s:
        events = _fill(s, data.draw(_batches(12)))
    log = SessionPaths(root, SID).log
    lines = log.read_bytes().split(b"\n")[:-1]
    for _ in range(data.draw(st.integers(1, 3))):
        j = data.draw(st.integers(0, len(lines) - 1))
        edit = data.draw(st.sampled_from(["seq", "copy", "drop", "bytes"]))
        if edit == "seq":
            lines[j] = lines[j].replace(b'"seq":', b'"seq":9', 1)
        elif edit == "copy":
            lines.insert(data.draw(st.integers(0, len(lines))), lines[j])
        elif edit == "drop" and len(lines) > 1:
            del lines[j]
        else:
            at = data.draw(st.integers(0, len(lines[j])))
            planted = data.draw(st.sampled_from([b"\n", b'{"type":"x","seq":3,', b"7"]))
            lines[j] = lines[j][:at] + planted + lines[j][at:]
    log.write_bytes(b"\n".join(lines) + b"\n")
    with SessionStore(root) as s:
        try:
            s.engine.head(SID)
        except CorruptLogError:
            return  # the engine refuses the log's end: nothing to search
        with events_by_seq(s, SID, TAGS) as event_at:
            if event_at is None:
                return
            first = {e.seq: e for e in events}
            for seq in range(len(events) + 3):
                got = event_at(seq)
                assert got is None or got == first.get(seq)


def test_bytes_past_the_committed_size_are_never_read(tmp_path: Path) -> None:
    with SessionStore(tmp_path) as s:
        events = _fill(s, [[10, 20], [30]])
    with SessionPaths(tmp_path, SID).log.open("ab") as f:  # a torn append
        f.write(b'{"type":"progress_appended","seq":4,"ts":"2026-01-01T00:00:00Z","entry":{"r')
    with _seek(tmp_path) as event_at:
        assert [event_at(seq) for seq in (3, 1, 2)] == [events[2], events[0], events[1]]
        assert event_at(4) is None


def test_a_log_that_opens_with_a_snapshot_is_not_searched(url: str) -> None:
    with SessionStore(url) as s:
        _fill(s, [[10, 20]])
        assert s.compact(SID, force=True).compacted
        later = _fill(s, [[30], [40]])
    with _seek(url) as event_at:
        # files: nothing; by seq: the lines after the snapshot's first (its link is the
        # snapshot's, which is no line)
        answered = None if event_at is None else [event_at(seq) for seq in range(6)]
        assert answered in (None, [None, None, None, None, later[-1], None])


def test_lines_of_other_types_are_not_answered(url: str) -> None:
    with SessionStore(url) as s:
        events = _fill(s, [[10]])
        s.append_progress_entry(SID, ProgressEntry("r", "x"))
        with events_by_seq(s, SID, frozenset({"manifest_set"})) as at:
            if at is None:
                assert not can_seek(s)
                return
            assert at(1) is None
    with _seek(url) as event_at:
        assert event_at(1) == events[0]


def test_an_encrypted_line_is_not_answered(url: str) -> None:
    """Its payload is sealed: only a fold, which holds the key, reads it."""
    pytest.importorskip("cryptography")
    from eventstore import KeyRing

    keys = KeyRing({"m1": bytes(range(32))})
    with SessionStore(url, keys=keys) as s:
        events = _fill(s, [[10, 20]])
        with events_by_seq(s, SID, TAGS) as event_at:
            assert [e.seq for e in events] == [1, 2]  # the fold reads them
            assert event_at is None or [event_at(1), event_at(2)] == [None, None]
            assert (event_at is None) is not can_seek(s)


def test_an_engine_without_a_ranged_view_answers_nothing() -> None:
    engine = MemoryEngine()
    with SessionStore(engine) as s:
        events = _fill(s, [[10, 20]])
    with _seek(engine) as event_at:
        assert event_at is not None and event_at(2) == events[1]  # the memory engine's view
    with _seek(WholeLogsOnly(engine)) as event_at:
        assert event_at is None
