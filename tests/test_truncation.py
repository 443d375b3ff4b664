"""Crash recovery: a log cut at any byte reads as its complete batches, and the next
append truncates the torn tail (with a warning), continues the sequence and is readable."""

from __future__ import annotations

import bisect
import logging
import uuid
from pathlib import Path

import pytest
from conftest import LOGS, log_path, make_entry, make_features, make_manifest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore import (
    BootstrapState,
    CorruptLogError,
    Message,
    ProgressEntry,
    SessionStore,
)
from eventstore.engines.file.layout import SessionPaths
from eventstore.format.codec import EventCodec
from projections import (
    BootstrapProjection,
    TranscriptProjection,
    fold,
)

SID = "golden"
COMPLETE = (LOGS / "complete.jsonl").read_bytes()


def _batches(data: bytes) -> tuple[list[int], list[BootstrapState], list[list[Message]]]:
    """Independently of the store: the byte offsets where complete batches end (0 first),
    and the bootstrap state and transcript folded from the events before each."""
    decoder = EventCodec().decoder()
    ends = [0]
    states = [BootstrapState()]
    transcripts: list[list[Message]] = [[]]
    pos = 0
    pending = []
    for line in data.splitlines(keepends=True):
        pos += len(line)
        ev = decoder.decode(line)
        pending.append(ev)
        if ev.more == 0:
            ends.append(pos)
            proj = BootstrapProjection()
            states.append(fold(proj, proj.copy(states[-1]), pending))
            transcripts.append(fold(TranscriptProjection(), list(transcripts[-1]), pending))
            pending = []
    assert not pending and pos == len(data)
    return ends, states, transcripts


def test_fixture_batches_are_what_the_test_assumes() -> None:
    """The golden log has a multi-line init batch and a multi-line batch in the middle, so
    truncation covers torn lines and torn batches."""
    ends, states, _ = _batches(COMPLETE)
    lines = COMPLETE.count(b"\n")
    assert len(ends) - 1 < lines  # some batches have several lines
    assert ends[1] == COMPLETE.index(b"\n", COMPLETE.index(b'"seq":4,')) + 1
    assert states[-1].manifest is not None and len(states[-1].feature_list) == 8


@pytest.mark.slow
def test_truncated_at_every_byte_offset(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """For every prefix of the golden log: loading never fails and gives exactly the fold of
    the complete batches in the prefix; the next append warns about the torn tail (iff
    there is one), truncates it, continues the sequence without a gap, and is readable."""
    ends, states, transcripts = _batches(COMPLETE)
    root = tmp_path / "store"
    SessionStore(root).close()
    paths = SessionPaths(root, SID)
    paths.create()
    path = paths.log
    entry = ProgressEntry(
        run_id="after-crash", summary="recovered ✓", created_at=make_entry().created_at
    )
    caplog.set_level(logging.WARNING, logger="eventstore")
    warned = 0
    for k in range(len(COMPLETE) + 1):
        prefix = COMPLETE[:k]
        with open(path, "wb") as f:
            f.write(prefix)
        b = bisect.bisect_right(ends, k) - 1  # the complete batches within the prefix
        commit = ends[b]
        seq = COMPLETE[:commit].count(b"\n")

        store = SessionStore(root)
        assert store.load_bootstrap_state(SID) == states[b], k
        assert store.load_transcript_messages(SID) == transcripts[b], k
        assert store.is_initialized(SID) == (states[b].manifest is not None), k
        assert store.last_seq(SID) == seq, k

        caplog.clear()
        store.append_progress_entry(SID, entry)
        torn = [
            r for r in caplog.records if r.name == "eventstore" and r.levelno == logging.WARNING
        ]
        if commit < k:
            assert len(torn) == 1, k
            assert str(path) in torn[0].getMessage()
            warned += 1
        else:
            assert torn == [], k

        data = path.read_bytes()
        assert data[:commit] == COMPLETE[:commit], k
        tail = data[commit:]
        assert tail.count(b"\n") == 1 and tail.endswith(b"\n"), k
        assert f'"seq":{seq + 1},'.encode() in tail, k

        expected = BootstrapProjection().copy(states[b])
        expected.recent_progress.append(entry)
        assert store.load_bootstrap_state(SID) == expected, k
        reader = SessionStore(root)
        assert reader.load_bootstrap_state(SID) == expected, k
        assert reader.load_transcript_messages(SID) == transcripts[b], k
        assert reader.last_seq(SID) == seq + 1, k
    assert warned == len(COMPLETE) + 1 - len(ends)


def test_torn_last_line(install_log, root: Path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    """The torn_line fixture reads as the complete log without its last event; the next
    append replaces the torn line and takes its sequence number."""
    path = install_log("torn_line.jsonl")
    ends, states, transcripts = _batches(COMPLETE)
    store = SessionStore(root)
    assert store.load_bootstrap_state(SID) == states[-2]
    assert store.load_transcript_messages(SID) == transcripts[-2]
    n = COMPLETE.count(b"\n")
    assert store.last_seq(SID) == n - 1
    with caplog.at_level(logging.WARNING, logger="eventstore"):
        store.append_progress_entry(SID, make_entry(99))
    assert any("torn" in r.getMessage() for r in caplog.records if r.name == "eventstore")
    data = path.read_bytes()
    assert data.startswith(COMPLETE[: ends[-2]])
    assert data.count(b"\n") == n and f'"seq":{n},'.encode() in data.splitlines()[-1]
    assert SessionStore(root).load_bootstrap_state(SID).recent_progress[-1] == make_entry(99)


def test_torn_init_batch(install_log, root: Path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    """An init batch without its closing line never happened: the session is not
    initialized, and initialization succeeds (warning, torn lines cut) with seq 1..N."""
    path = install_log("torn_batch.jsonl")
    assert path.read_bytes().count(b"\n") == 3
    store = SessionStore(root)
    assert not store.is_initialized(SID)
    assert store.load_bootstrap_state(SID) == BootstrapState()
    assert store.last_seq(SID) == 0
    with caplog.at_level(logging.WARNING, logger="eventstore"):
        assert store.initialize_session_if_missing(SID, make_manifest(SID), make_features(2))
    assert [r.levelno for r in caplog.records if r.name == "eventstore"] == [logging.WARNING]
    lines = path.read_bytes().splitlines()
    assert len(lines) == 2 and b'"seq":1,' in lines[0] and b'"seq":2,' in lines[1]
    state = SessionStore(root).load_bootstrap_state(SID)
    assert state.manifest == make_manifest(SID)
    assert state.feature_list == make_features(2)


def test_reader_that_saw_a_torn_tail_catches_up(install_log, root: Path) -> None:  # type: ignore[no-untyped-def]
    """A store that loaded while the tail was torn sees the repaired log after another
    store's append (its cached position stays valid)."""
    install_log("torn_line.jsonl")
    ends, states, _ = _batches(COMPLETE)
    reader = SessionStore(root)
    assert reader.load_bootstrap_state(SID) == states[-2]
    SessionStore(root).append_progress_entry(SID, make_entry(5))
    got = reader.load_bootstrap_state(SID)
    assert got.recent_progress == [*states[-2].recent_progress, make_entry(5)]
    assert reader.last_seq(SID) == COMPLETE.count(b"\n")
    assert log_path(root, SID).read_bytes().startswith(COMPLETE[: ends[-2]])


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_hole_of_zeros_in_the_last_batch_is_a_torn_tail(
    tmp_path: Path, data: st.DataObject
) -> None:
    """A power loss mid-append may keep a batch's later blocks and not its first: a hole
    of zeros anywhere in the last batch (its closing newline kept) reads as a torn tail,
    as a partial line does: loads give the batches before it, verify warns, and the next
    writer sets it aside and takes its sequence numbers. Zeros erase the envelopes that
    say where a batch starts, so a hole counts as the last batch's when no intact line
    closing a batch lies between it and the end; a hole before such a line is corruption,
    never silently cut."""
    ends, states, _ = _batches(COMPLETE)
    b = data.draw(st.integers(1, len(ends) - 1), label="batch")
    first = data.draw(st.integers(ends[b - 1], ends[b] - 2), label="hole start")
    last = data.draw(st.integers(first + 1, ends[b] - 1), label="hole end")
    later = data.draw(st.booleans(), label="a batch after it") and b < len(ends) - 1
    prefix = COMPLETE[: ends[b + 1] if later else ends[b]]
    holed = prefix[:first] + bytes(last - first) + prefix[last:]
    root = tmp_path / uuid.uuid4().hex  # a fresh store per example (no caches of another)
    SessionStore(root).close()
    paths = SessionPaths(root, SID)
    paths.create()
    paths.log.write_bytes(holed)
    store = SessionStore(root)
    closing = COMPLETE.rindex(b"\n", 0, ends[b] - 1) + 1  # where batch b's closing line starts
    if later and last <= closing:  # batch b's closing line intact: batch b+1 is whole after it
        with pytest.raises(CorruptLogError):
            store.load_bootstrap_state(SID)
        assert not store.verify(SID).ok
        return
    assert store.load_bootstrap_state(SID) == states[b - 1]
    report = store.verify(SID)
    assert report.ok and [p.kind for p in report.problems] == ["torn_batch"]
    assert paths.log.read_bytes() == holed  # readers never write
    seq = COMPLETE[: ends[b - 1]].count(b"\n")
    store.append_progress_entry(SID, make_entry(7))
    data_after = paths.log.read_bytes()
    assert data_after.startswith(COMPLETE[: ends[b - 1]]) and b"\0" not in data_after
    assert f'"seq":{seq + 1},'.encode() in data_after.splitlines()[-1]
    assert SessionStore(root).verify(SID).ok
