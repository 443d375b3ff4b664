"""The transcript's fold cache (issue 14: cold transcript loads below SQLite's): the state
kept in MessagePack frames, read and hashed a frame at a time, written on close.

What must hold: a frame reads back exactly (a time keeps its offset, an integer past 64
bits its value: those frames are JSON); a writer that appended a megabyte leaves a cache
its next cold load folds nothing beside; a damaged, cut, lying or foreign cache is
ignored, never trusted, and the load equals the fold of the log alone; a load never
holds the whole cache at once and never writes one; a rewrite happens only once the log
has grown by an eighth.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest
from conftest import LoadSpy, log_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import rich_messages
from tuning import tune

from eventstore import (
    Message,
    Role,
    SessionStore,
)
from eventstore.core import fold_cache
from eventstore.engines.file.caches import (
    FileCacheReader,
    cache_file_name,
)
from projections import TranscriptProjection
from projections.transcript import FRAME_MESSAGES

SID = "s"
_TURN = [
    Message(role=Role.USER, content="u" * 300),
    Message(role=Role.ASSISTANT, content="a" * 1500),
]


def _cache(root: Path) -> Path:
    return log_path(root, SID).parent / cache_file_name("transcript")


def _write(root: Path, turns: int, *, load_first: bool = False) -> None:
    with SessionStore(root) as s:
        if load_first:
            s.load_transcript_messages(SID)
        for _ in range(turns):
            s.append_transcript_messages(SID, _TURN)


def _truth(root: Path) -> list[Message]:
    """The transcript folded from the log alone: no cache read, none written."""
    with SessionStore(root) as s:
        s.core.caches.cached = {}
        return s.load_transcript_messages(SID)


def _exactly(messages: list[Message]) -> bytes:
    """What tells two transcripts apart that `==` does not (a time's offset)."""
    return msgspec.json.encode(messages)


class _Spy(LoadSpy):
    """`LoadSpy`, and the largest single read of a cache."""

    def __init__(self, store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(store, monkeypatch)
        self.largest_read = 0
        real_read = FileCacheReader.read

        def read(reader: FileCacheReader, n: int) -> bytes:
            self.largest_read = max(self.largest_read, n)
            return real_read(reader, n)

        monkeypatch.setattr(FileCacheReader, "read", read)


@settings(max_examples=60, deadline=None)
@given(st.lists(rich_messages, max_size=2 * FRAME_MESSAGES + 3))
def test_frames_read_back_exactly(messages: list[Message]) -> None:
    """Every kind of message, in frames of either encoding, gives back the same
    messages, offsets and integer sizes included."""
    proj = TranscriptProjection()
    frames = proj.cache_frames(messages)
    assert len(frames) == -(-len(messages) // FRAME_MESSAGES)
    state = proj.initial()
    for frame in frames:
        state = proj.from_cache_frame(state, frame)
    assert state == messages
    assert _exactly(state) == _exactly(messages)


def test_a_time_with_an_offset_or_a_huge_integer_makes_a_json_frame() -> None:
    from datetime import UTC, datetime, timedelta, timezone

    proj = TranscriptProjection()
    plain = Message(role=Role.USER, content="x", created_at=datetime(2026, 1, 1, tzinfo=UTC))
    shifted = Message(
        role=Role.USER,
        content="x",
        created_at=datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=2))),
    )
    huge = Message(role=Role.USER, content="x", metadata={"n": 1 << 70})
    assert proj.cache_frames([plain])[0][:1] != b"["  # MessagePack
    assert proj.cache_frames([plain, shifted])[0][:1] == b"["
    assert proj.cache_frames([huge])[0][:1] == b"["
    for ms in ([shifted], [huge]):
        (frame,) = proj.cache_frames(ms)
        assert _exactly(proj.from_cache_frame([], frame)) == _exactly(ms)


def test_a_writer_that_created_the_session_leaves_a_cache_a_cold_load_folds_nothing_beside(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer never loaded the transcript: it folded it as it appended (it created
    the session) and its close keeps it. The next process reads the cache a frame at a
    time."""
    _write(root, 700)  # ~1.3 MB of log
    assert _cache(root).is_file()
    assert os.lstat(_cache(root)).st_mode & 0o777 == 0o600
    with SessionStore(root) as s:
        spy = _Spy(s, monkeypatch)
        got = s.load_transcript_messages(SID)
        assert spy.decoders == 0 and spy.folded == 0  # no tail: no decoder, no fold
        assert 0 < spy.largest_read <= 2 * FRAME_MESSAGES * 2000  # a frame, never it all
    assert got == _truth(root) and len(got) == 1400


def test_a_small_writer_leaves_no_transcript_cache(root: Path) -> None:
    _write(root, 20)  # under 64 KiB of log: folding it costs what reading a cache does
    assert not _cache(root).exists()


def test_a_writer_of_a_session_it_did_not_create_keeps_no_transcript_it_never_loaded(
    root: Path,
) -> None:
    """Only a session's creator folds its transcript as it appends: another writer (which
    never loaded it) holds no transcript, and its close leaves the cache as it was."""
    _write(root, 700)
    before = os.lstat(_cache(root))
    with SessionStore(root) as s:
        for _ in range(200):
            s.append_transcript_messages(SID, _TURN)
        assert "transcript" not in s.cache_info(SID).folds
    after = os.lstat(_cache(root))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    with SessionStore(root) as s:  # the tail after the cache is folded from the log
        assert s.load_transcript_messages(SID) == _truth(root)


def test_past_its_budget_a_store_lets_go_of_the_transcripts_it_created(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An importer creating many sessions: the transcripts it folds as it appends are
    bounded by KEPT_FROM_CREATION bytes of log a store; past it, a session's is let go
    (no cache for it on close; its next reader folds the log)."""
    tune(monkeypatch, kept_from_creation=400_000)
    with SessionStore(root) as s:
        for sid in ("a", "b", "c"):
            for _ in range(150):  # ~270 kB of log each
                s.append_transcript_messages(sid, _TURN)
        kept = {sid: "transcript" in s.cache_info(sid).folds for sid in ("a", "b", "c")}
        assert kept["a"] and not kept["c"]
        assert s.core.caches.kept_bytes <= 400_000 + 2 * 2000
    for sid in ("a", "b", "c"):
        cache = log_path(root, sid).parent / cache_file_name("transcript")
        assert cache.exists() == kept[sid]
        with SessionStore(root) as s:
            s.core.caches.cached = {}
            truth = s.load_transcript_messages(sid)
        with SessionStore(root) as s:
            assert s.load_transcript_messages(sid) == truth


def test_a_load_never_writes_the_transcript_cache_close_does(root: Path) -> None:
    _write(root, 700)
    _cache(root).unlink()
    with SessionStore(root) as s:
        s.load_transcript_messages(SID)  # folded 1.3 MB of log: a bootstrap fold would save
        assert not _cache(root).exists()
    assert _cache(root).is_file()


def test_a_cache_is_written_without_fsync(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache checks itself (a power loss costs a rebuild): saving one flushes nothing."""
    flushed: list[str] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def fsync(fd: int) -> None:
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fdatasync(fd)

    s = SessionStore(root)
    for _ in range(100):
        s.append_transcript_messages(SID, _TURN)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    s.close()
    monkeypatch.undo()
    assert _cache(root).is_file()
    assert not [p for p in flushed if "fold-" in p or "/sessions/" in p], flushed


def test_a_rewrite_waits_until_the_log_has_grown_by_an_eighth(root: Path) -> None:
    _write(root, 700)
    before = os.lstat(_cache(root))
    _write(root, 10, load_first=True)  # a few turns: the cache stays as it was
    after = os.lstat(_cache(root))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    with SessionStore(root) as s:  # its tail is folded from the log
        assert s.load_transcript_messages(SID) == _truth(root)
    _write(root, 120, load_first=True)  # past an eighth: rewritten
    assert os.lstat(_cache(root)).st_ino != before.st_ino
    with SessionStore(root) as s:
        assert s.load_transcript_messages(SID) == _truth(root)
        assert s.cache_info(SID).folds["transcript"][1] == s.last_seq(SID)  # type: ignore[union-attr]


@pytest.fixture
def cached(root: Path) -> tuple[Path, bytes, list[Message]]:
    """A store whose transcript cache spans several frames, its bytes and the truth."""
    _write(root, 1200)
    return root, _cache(root).read_bytes(), _truth(root)


def _assert_ignored(root: Path, truth: list[Message]) -> None:
    with SessionStore(root) as s:
        assert s.load_transcript_messages(SID) == truth
        assert s.cache_info(SID).folds["transcript"][1] is None  # not from the cache


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_flipped_byte_anywhere_is_ignored(
    cached: tuple[Path, bytes, list[Message]], data: st.DataObject
) -> None:
    """A flip in a frame may still decode (a letter of a message changed): the digest,
    checked once every frame is read, refuses the state."""
    root, good, truth = cached
    i = data.draw(st.integers(0, len(good) - 1), label="offset")
    bad = bytearray(good)
    bad[i] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    _cache(root).write_bytes(bytes(bad))
    _assert_ignored(root, truth)


def test_a_cache_cut_anywhere_is_ignored(cached: tuple[Path, bytes, list[Message]]) -> None:
    """Cut at every frame boundary (where a reader could mistake the end for a whole
    cache), around them, and at even steps."""
    root, good, truth = cached
    proj = TranscriptProjection()
    starts, at = [], good.index(b"\n", good.index(b"\n") + 1) + 1  # after both header lines
    while at < len(good) - 33:
        starts.append(at)
        at += 4 + int.from_bytes(good[at : at + 4], "big")
    assert len(starts) == -(-2400 // FRAME_MESSAGES) >= 3
    cuts = {n for s in starts for n in (s - 1, s, s + 1, s + 4)} | set(range(0, len(good), 9973))
    cuts |= set(range(len(good) - 40, len(good)))
    known = fold_cache.known_types(proj, {"messages_appended"})
    with SessionStore(root) as s:
        for n in sorted(cuts):
            _cache(root).write_bytes(good[:n])
            assert fold_cache.load(s.engine, SID, s.transcript, known) is None, n
    _cache(root).write_bytes(good)
    _assert_ignored_and_then_used(root, truth)


def _assert_ignored_and_then_used(root: Path, truth: list[Message]) -> None:
    with SessionStore(root) as s:
        assert s.load_transcript_messages(SID) == truth
        assert s.cache_info(SID).folds["transcript"][1] is not None  # the intact one


def test_a_frame_that_claims_more_bytes_than_there_are_is_not_read(
    cached: tuple[Path, bytes, list[Message]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, good, truth = cached
    at = good.index(b"\n", good.index(b"\n") + 1) + 1
    _cache(root).write_bytes(good[:at] + (0xFFFFFFF0).to_bytes(4, "big") + good[at + 4 :])
    with SessionStore(root) as s:
        spy = _Spy(s, monkeypatch)
        assert s.load_transcript_messages(SID) == truth
        assert spy.largest_read < 1 << 20  # the claim was refused before any read


def test_another_sessions_or_projections_cache_is_ignored(root: Path) -> None:
    """The bootstrap cache put in its place, or one whose header names another session
    (the engine's position still checks: it is this log's): neither is used."""
    _write(root, 700)
    truth = _truth(root)
    good = _cache(root).read_bytes()
    bootstrap = _cache(root).with_name(cache_file_name("bootstrap"))
    for bad in (bootstrap.read_bytes(), good.replace(b'"session":"s"', b'"session":"t"', 1)):
        assert bad != good
        _cache(root).write_bytes(bad)
        _assert_ignored(root, truth)
    _cache(root).write_bytes(good)
    _assert_ignored_and_then_used(root, truth)
