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

import errno
import json
import logging
import os
import random
import shutil
import signal
import socket
import threading
import time
import traceback
import tracemalloc
import zlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import oracle
import pytest
from conftest import LoadSpy, cache_path, in_forked_child, log_path, wait_child
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
from eventstore.core.cache_policy import FRAME_LOOK
from eventstore.core.tuning import Tuning
from eventstore.engines.base import CachingEngine
from eventstore.engines.file.caches import FileCacheReader
from eventstore.format.events import Event
from eventstore.records import (
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from projections import (
    Retention,
    StructProjection,
    TranscriptProjection,
)
from projections.transcript import FRAME_MESSAGES

SID = "s"
_TURN = [
    Message(role=Role.USER, content="u" * 300),
    Message(role=Role.ASSISTANT, content="a" * 1500),
]


def _write(root: Path, turns: int, *, load_first: bool = False) -> None:
    with SessionStore(root) as s:
        if load_first:
            s.load_transcript_messages(SID)
        for _ in range(turns):
            s.append_transcript_messages(SID, _TURN)


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


@pytest.mark.slow
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
    assert got == oracle.truth(root, SID).transcript and len(got) == 1400


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
        assert s.load_transcript_messages(SID) == oracle.truth(root, SID).transcript


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
        cache = cache_path(root, sid, "transcript")
        assert cache.exists() == kept[sid]
        truth = oracle.truth(root, sid).transcript
        with SessionStore(root) as s:
            assert s.load_transcript_messages(sid) == truth


@pytest.mark.parametrize("let_go", ["delete", "compact", "forget"])
def test_a_session_let_go_gives_its_share_of_the_budget_back(
    root: Path, monkeypatch: pytest.MonkeyPatch, let_go: str
) -> None:
    """A session the store deletes, compacts or forgets no longer counts against the
    budget of transcripts kept from creation: the next session it creates is kept."""
    tune(monkeypatch, kept_from_creation=400_000)
    with SessionStore(root) as s:
        for _ in range(200):  # ~360 kB: most of the budget
            s.append_transcript_messages("a", _TURN)
        assert "transcript" in s.cache_info("a").folds
        if let_go == "delete":
            s.delete_session("a", purge=True)
        elif let_go == "compact":
            s.compact("a")
        else:
            s.forget_cached_state("a")
        for _ in range(150):  # ~270 kB: past what was left, within what was given back
            s.append_transcript_messages("b", _TURN)
        assert "transcript" in s.cache_info("b").folds


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


def _stamps(paths: list[Path]) -> list[tuple[int, int]]:
    return [(os.lstat(p).st_ino, os.lstat(p).st_mtime_ns) for p in paths]


def test_a_close_rewrites_only_the_last_frame_never_a_complete_one(root: Path) -> None:
    """Issue 34: a close costs the frame its appends left partial, not the transcript.
    The complete frames are chunk caches written once each (by the append that
    completes them); a writer that loaded the cache and appended a few turns leaves
    every chunk as it was and rewrites only the small cache listing them; one whose
    appends complete a frame adds that chunk alone. Every cold load equals the log's."""
    _write(root, 700)  # 1,400 messages: two complete frames, and 376
    parts = _parts(root)
    assert len(parts) == 1400 // FRAME_MESSAGES == 2
    before = _stamps(parts)
    own = os.lstat(_cache(root))
    assert own.st_size < sum(os.lstat(p).st_size for p in parts) / 2
    _write(root, 10, load_first=True)  # a few turns: the chunks stay as they were
    assert _stamps(_parts(root)) == before and os.lstat(_cache(root)).st_ino != own.st_ino
    with SessionStore(root) as s:
        assert s.load_transcript_messages(SID) == oracle.truth(root, SID).transcript
        assert s.cache_info(SID).folds["transcript"][1] == s.last_seq(SID)
    _write(root, 120, load_first=True)  # 1,660 messages: a third frame completes
    assert len(_parts(root)) == 3 and _stamps(_parts(root))[:2] == before
    with SessionStore(root) as s:
        assert s.load_transcript_messages(SID) == oracle.truth(root, SID).transcript
        assert s.cache_info(SID).folds["transcript"][1] == s.last_seq(SID)


@pytest.fixture
def cached(root: Path) -> tuple[Path, bytes, list[Message]]:
    """A store whose transcript cache spans several frames, its bytes and the truth."""
    _write(root, 1200)
    return root, _cache(root).read_bytes(), oracle.truth(root, SID).transcript


@pytest.mark.slow
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
    """Cut the cache, or its first or last chunk, at its frame's boundaries (where a
    reader could mistake the end for a whole cache), around them, and at even steps."""
    root, _, truth = cached
    proj = TranscriptProjection()
    parts = _parts(root)
    assert len(parts) == 2400 // FRAME_MESSAGES == 4
    known = fold_cache.known_types(proj, {"messages_appended"})
    with SessionStore(root) as s:
        for path in (_cache(root), parts[0], parts[-1]):
            good = path.read_bytes()
            start = _headers(good)[2]
            assert len(_frames(good)) == 1
            cuts = {start - 1, start, start + 1, start + 4} | set(range(0, len(good), 9973))
            cuts |= set(range(len(good) - 40, len(good)))
            for n in sorted(cuts):
                path.write_bytes(good[:n])
                assert fold_cache.load(s.engine, SID, s.transcript, known) is None, (path, n)
            path.write_bytes(good)
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
    truth = oracle.truth(root, SID).transcript
    kept = _keep_caches(root)
    good = _cache(root).read_bytes()
    bootstrap = cache_path(root, SID, "bootstrap")
    for bad in (bootstrap.read_bytes(), good.replace(b'"session":"s"', b'"session":"t"', 1)):
        assert bad != good
        _cache(root).write_bytes(bad)
        _assert_ignored(root, truth)
        _put_back(root, kept)  # (the load's close wrote its own caches)
    _assert_ignored_and_then_used(root, truth)


# -- attacks: the cache damaged, planted, swapped, raced, killed, faulted -------------
#
# Every load is compared with the oracle (tests/oracle.py: the log folded by a store that
# reads and writes no fold cache). Five promises were found broken and fixed here: a
# projection whose decoding raised other than a msgspec/ValueError/TypeError escaped the
# load (any Exception now means "does not decode"), and a planted file behind a copied
# genuine header was read whole or decoded frame by frame (the header now binds the
# frames' byte count, and the transcript refuses an empty frame).


def _turn(i: int) -> list[Message]:
    """Turn `i`: two messages (~1.9 kB of log), their text naming the turn."""
    return [
        Message(role=Role.USER, content=f"m{i} u " + "u" * 300),
        Message(role=Role.ASSISTANT, content=f"m{i} a " + "a" * 1500),
    ]


def _expected(turns: int) -> list[Message]:
    return [m for i in range(turns) for m in _turn(i)]


def _cache(root: Path, name: str = "transcript", sid: str = SID) -> Path:
    return cache_path(root, sid, name)


def _write_numbered(root: Path, turns: int, *, start: int = 0, load_first: bool = False) -> None:
    with SessionStore(root) as s:
        if load_first:
            s.load_transcript_messages(SID)
        for i in range(start, start + turns):
            s.append_transcript_messages(SID, _turn(i))


def _cold(root: Path, sid: str = SID) -> tuple[list[Message], bool]:
    """A cold load by a fresh store, and whether it started from the fold cache."""
    with SessionStore(root) as s:
        got = s.load_transcript_messages(sid)
        f = s.cache_info(sid).folds.get("transcript")
        return got, f is not None and f[1] is not None


def _assert_ignored(root: Path, truth: list[Message]) -> None:
    got, used = _cold(root)
    assert _exactly(got) == _exactly(truth)
    assert not used


def _headers(data: bytes) -> tuple[bytes, bytes, int]:
    """The engine's line, the face header line (with the list of chunks, if any), and
    where the frames start."""
    a = data.index(b"\n") + 1
    b = data.index(b"\n", a) + 1
    if json.loads(data[a:b])["chunks"]:
        b = data.index(b"\n", b) + 1
    return data[:a], data[a:b], b


def _frames(data: bytes) -> list[bytes]:
    _, _, at = _headers(data)
    out = []
    while at < len(data) - 33:
        n = int.from_bytes(data[at : at + 4], "big")
        out.append(data[at + 4 : at + 4 + n])
        at += 4 + n
    return out


def _parts(root: Path, sid: str = SID) -> list[Path]:
    """The files of the transcript cache's chunks (one complete frame each), in order."""
    found = {
        int(p.name.split(".")[1]): p
        for p in _cache(root, sid=sid).parent.glob("fold-transcript.*.cache")
    }
    assert sorted(found) == list(range(len(found)))
    return [found[k] for k in sorted(found)]


def _all_frames(root: Path, sid: str = SID) -> list[bytes]:
    """Every frame of the transcript cache: its chunks', then its own."""
    parts = [p.read_bytes() for p in [*_parts(root, sid), _cache(root, sid=sid)]]
    return [f for data in parts for f in _frames(data)]


def _keep_caches(root: Path, sid: str = SID) -> dict[Path, bytes]:
    """The session's cache files and their bytes (`_put_back` restores them all)."""
    return {p: p.read_bytes() for p in _cache(root, sid=sid).parent.glob("fold-*.cache")}


def _put_back(root: Path, kept: dict[Path, bytes], sid: str = SID) -> None:
    """The session's cache files exactly as `_keep_caches` found them (a store closed
    since may have written others)."""
    for p in _cache(root, sid=sid).parent.glob("fold-*.cache"):
        if p not in kept:
            p.unlink()
    for p, data in kept.items():
        p.write_bytes(data)


def _line_ends(log: Path) -> list[tuple[int, int, str]]:
    """(offset after the line, seq, h) of every line of a log of plain lines."""
    out, at = [], 0
    for line in log.read_bytes().splitlines(keepends=True):
        at += len(line)
        d = json.loads(line)
        out.append((at, d["seq"], d["h"]))
    return out


def _is_prefix(got: list[Message]) -> bool:
    """Whether `got` is the first messages of turns 0, 1, 2, ... (whole turns)."""
    if len(got) % 2:
        return False
    return got == _expected(len(got) // 2)


@pytest.fixture
def three_frames(root: Path) -> tuple[bytes, list[Message]]:
    """A session of 700 turns (1.3 MB) whose close left a transcript cache of three
    frames; its bytes and the truth."""
    _write_numbered(root, 700)
    assert _cache(root).is_file()
    return _cache(root).read_bytes(), oracle.truth(root, SID).transcript


def test_cold_loads_equal_the_log_through_appends_compactions_retention_and_eviction(
    root: Path,
) -> None:
    """Promise 1. Attack: walk one session through every way a cache gets written or
    left behind (close after a megabyte, a tail the cache does not hold, a rewrite past
    an eighth, compaction with and without retention, an eviction by `cached_sessions`)
    and compare every cold load, from the cache or not, with the log folded alone."""
    _write_numbered(root, 700)
    got, used = _cold(root)
    assert used and got == oracle.truth(root, SID).transcript == _expected(700)
    _write_numbered(root, 20, start=700, load_first=True)  # tail < 1/8: the cache stays at 700
    got, used = _cold(root)
    assert used and got == oracle.truth(root, SID).transcript == _expected(720)
    exp = _expected(720)
    pages: list[tuple[dict[str, int], list[Message]]] = [
        ({"start": 1399, "limit": 3}, exp[1399:1402]),
        ({"start": 1000}, exp[1000:]),
        ({"limit": 5}, exp[:5]),
        ({"last": 7}, exp[-7:]),
    ]
    for page, want in pages:  # pages of cold stores (`start`/`limit` fold from the cache)
        with SessionStore(root) as s:
            assert s.load_transcript_messages(SID, **page) == want  # type: ignore[arg-type]
    _write_numbered(root, 150, start=720, load_first=True)  # past 1/8: rewritten
    assert _cold(root) == (oracle.truth(root, SID).transcript, True)
    with SessionStore(root) as s:
        assert s.compact(SID, force=True).compacted
    assert _cold(root) == (oracle.truth(root, SID).transcript, True)
    with SessionStore(root) as s:
        s.append_transcript_messages(SID, _turn(870))
        assert s.compact(SID, force=True, retention=Retention(messages=301)).compacted
    got, used = _cold(root)
    assert used and got == oracle.truth(root, SID).transcript and len(got) == 301
    with SessionStore(root, cached_sessions=1) as s:
        for i in range(871, 1500):
            s.append_transcript_messages(SID, _turn(i))
        s.load_transcript_messages(SID)
        os.unlink(_cache(root))
        s.load_transcript_messages("other")  # evicts SID: its caches are saved
        assert _cache(root).is_file()
    got, used = _cold(root)
    assert used and got == oracle.truth(root, SID).transcript


def test_an_edit_in_the_tail_after_the_cached_position_is_caught(root: Path) -> None:
    """Promise 1. Attack: the cache holds turns 0-699; 20 turns appended after it, then
    one letter of turn 710 edited in place (and, apart, the `h` of the last line the
    cache covers). The fold of the log alone raises CorruptLogError for the tail edit;
    so must the cold load that starts from the cache (it checks what it folds on top).
    The edited `h` is not the cache's position any more: the cache is ignored and the
    load reports what the log alone reports."""
    from eventstore.errors import CorruptLogError

    _write_numbered(root, 700)
    _write_numbered(root, 20, start=700)  # no load: the close keeps the cache at 700
    kept = _keep_caches(root)
    with SessionStore(root) as s:  # a cold load starts from it
        assert s.load_transcript_messages(SID) == _expected(720)
        assert s.cache_info(SID).folds["transcript"][1] == 700  # type: ignore[union-attr]
    _put_back(root, kept)  # (its close saved the cache at 720)
    log = log_path(root, SID)
    data = log.read_bytes()
    good = data
    at = data.index(b"m710 a ") + 7
    log.write_bytes(data[:at] + b"A" + data[at + 1 :])
    with pytest.raises(CorruptLogError):
        oracle.truth(root, SID)
    with SessionStore(root) as s, pytest.raises(CorruptLogError):
        s.load_transcript_messages(SID)
    off, _, h = _line_ends(log)[699]
    at = off - len(h) - 3
    assert good[at : at + len(h)] == h.encode()
    other = b"1" if good[at : at + 1] == b"0" else b"0"  # (an edit: never the same digit)
    log.write_bytes(good[:at] + other + good[at + 1 :])
    with pytest.raises(CorruptLogError):
        oracle.truth(root, SID)
    with SessionStore(root) as s, pytest.raises(CorruptLogError):
        s.load_transcript_messages(SID)


def test_a_session_id_with_the_longest_escaped_header_is_cached_and_checked(root: Path) -> None:
    """Promise 1. Attack: a session id of 1,024 control characters (each escaped to six
    bytes in the header) and one of non-BMP characters: the cache is read and used;
    the other id's cache put in its place is ignored, and so is its own cache whose
    header names an id one character off."""
    ids = ["\x01" * 1024, "\U0001f600" * 256]
    with SessionStore(root) as s:
        for sid in ids:
            for i in range(700):
                s.append_transcript_messages(sid, _turn(i))
    for sid in ids:
        got, used = _cold(root, sid)
        assert used and got == oracle.truth(root, sid).transcript == _expected(700)
    a, b = (_cache(root, sid=sid) for sid in ids)
    a_bytes = a.read_bytes()
    off_by_one = msgspec.json.encode("\x01" * 1023 + "\x02")
    assert msgspec.json.encode(ids[0]) in a_bytes
    for bad in (b.read_bytes(), a_bytes.replace(msgspec.json.encode(ids[0]), off_by_one)):
        a.write_bytes(bad)
        got, used = _cold(root, ids[0])
        assert not used and got == _expected(700)


def test_chunks_swapped_missing_stale_damaged_or_of_another_cache_are_ignored(
    root: Path, three_frames: tuple[bytes, list[Message]]
) -> None:
    """Promise 2. Attack: the chunks a cache lists (each a whole, intact cache of one
    frame) rearranged: two swapped, one repeated, one missing, one damaged (a byte of a
    message changed and its own CRC fixed), one of another session with the same
    messages, and each mixed with the chunks another writer of the same log wrote at
    other heads (a fold from the log saved whole by its close). The cache is refused
    whole, never used in part, and the load equals the log's."""
    good, truth = three_frames
    kept = _keep_caches(root)
    a, b = (p.read_bytes() for p in _parts(root))
    p0, p1 = _parts(root)
    with SessionStore(root) as s:  # another session, the same turns
        for i in range(700):
            s.append_transcript_messages("t", _turn(i))
    theirs = _parts(root, "t")[1].read_bytes()
    engine, face, at = _headers(b)
    body = bytearray(b[at:-9])
    i = body.index(b"m300 a ")
    body[i + 1 : i + 4] = b"301"  # another turn's text, the same length
    damaged = engine + face + bytes(body) + b"%08x\n" % zlib.crc32(face + body)
    for first, second in ((b, a), (a, a), (b, b), (a, None), (a, damaged), (a, theirs)):
        _put_back(root, kept)
        p0.write_bytes(first)
        if second is None:
            p1.unlink()
        else:
            p1.write_bytes(second)
        _assert_ignored(root, truth)
    # the same log's chunks as another writer wrote them: all at its close's head
    _put_back(root, kept)
    for p in [*_parts(root), _cache(root)]:
        p.unlink()
    with SessionStore(root) as s:
        assert s.load_transcript_messages(SID) == truth
    other = _keep_caches(root)
    assert [other[p] != kept[p] for p in (p0, p1, _cache(root))] == [True, True, True]
    for mix in ({p0: other[p0]}, {p1: other[p1]}, {_cache(root): other[_cache(root)]}):
        _put_back(root, {**kept, **mix})
        _assert_ignored(root, truth)
    for whole in (kept, other):
        _put_back(root, whole)
        assert _cold(root) == (truth, True)


def test_a_lying_engine_line_or_header_is_ignored(
    root: Path, three_frames: tuple[bytes, list[Message]]
) -> None:
    """Promise 2. Attack: the cache (state at seq 700) made to say it is the state at
    an earlier line (offset, seq and `h` of line 100, each of them the log's own), in
    the engine's line only, in the face header only, and in both consistently; and the
    engine's line pointed at the log's true end with a foreign `h`. Trusted, the state
    at 700 plus the tail after 100 would repeat 600 turns."""
    good, truth = three_frames
    engine, face, at = _headers(good)
    ends = _line_ends(log_path(root, SID))
    off, seq, h = ends[99]
    e = json.loads(engine)
    lying_engine = (
        json.dumps({**e, "offset": off, "seq": seq, "link": h, "h": h}, separators=(",", ":"))
        + "\n"
    ).encode()
    f = json.loads(face.split(b"\n")[0])
    lying_face = (
        json.dumps({**f, "seq": seq, "link": h, "h": h}, separators=(",", ":")) + "\n"
    ).encode() + face[face.index(b"\n") + 1 :]
    body = good[at:]
    foreign = engine.replace(e["h"].encode(), b"0123456789abcdef")
    kept = _keep_caches(root)
    for bad in (
        lying_engine + face + body,
        engine + lying_face + body,
        lying_engine + lying_face + body,
        foreign + face + body,
    ):
        _put_back(root, kept)
        _cache(root).write_bytes(bad)
        _assert_ignored(root, truth)


def _cold_warned(root: Path, truth: list[Message], path: Path) -> bool:
    """Whether a cold load ignores the cache, equals `truth`, and logs a warning that
    names `path` (the file put in a cache's place)."""
    warned: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warned.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("eventstore")
    logger.addHandler(handler)
    try:
        got = _cold(root)
    finally:
        logger.removeHandler(handler)
    return got == (truth, False) and any(str(path) in w and "ignored" in w for w in warned)


@pytest.mark.parametrize("where", ["cache", "chunk"])
def test_a_symlink_fifo_directory_socket_or_unreadable_file_in_its_place(
    root: Path, three_frames: tuple[bytes, list[Message]], tmp_path: Path, where: str
) -> None:
    """Promise 2. Attack: where the cache lives, or its chunk 0 (opened without the
    live-log check), a symlink to a copy of the valid file (never followed, and the
    close after it replaces the link, not its target), a FIFO with no writer (must not
    hang), a directory, a socket and a file of mode 000. Each is ignored with a
    warning naming it."""
    good, truth = three_frames
    path = _cache(root) if where == "cache" else _parts(root)[0]
    good = path.read_bytes()
    outside = tmp_path / "elsewhere.cache"
    outside.write_bytes(good)
    path.unlink()
    path.symlink_to(outside)
    assert _cold_warned(root, truth, path)
    assert outside.read_bytes() == good and not path.is_symlink()  # close replaced the link
    for plant in ("fifo", "dir", "socket", "mode000"):
        path.unlink()
        if plant == "fifo":
            os.mkfifo(path)
        elif plant == "dir":
            path.mkdir()
        elif plant == "socket":
            sock = socket.socket(socket.AF_UNIX)
            sock.bind(str(path))
            sock.close()
        else:
            path.write_bytes(good)
            path.chmod(0)
        code = in_forked_child(lambda: _cold_warned(root, truth, path), 10)
        assert code == 0 or (plant == "mode000" and os.geteuid() == 0 and code == 2), plant
        if path.is_dir():
            path.rmdir()
            path.touch()


def test_a_huge_planted_file_is_not_read_whole(
    root: Path, three_frames: tuple[bytes, list[Message]]
) -> None:
    """Promise 2. Attack: sparse files where the cache lives: 2 GiB behind the genuine
    engine line and header (over the engine's 1 GiB cap), 512 MiB of zeros, and 512 MiB
    of zeros behind the genuine two header lines (the position and header check out,
    then the first frame's length is 0). None is read past a few kilobytes."""
    good, truth = three_frames
    engine, face, _ = _headers(good)
    path = _cache(root)
    for head, size in ((engine + face, 2 << 30), (b"", 512 << 20), (engine + face, 512 << 20)):
        with open(path, "wb") as f:
            f.write(head)
            f.truncate(size)
        tracemalloc.start()
        try:
            with SessionStore(root) as s:
                got = s.load_transcript_messages(SID)
                _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert got == truth
        assert peak < 24 << 20, (size, peak)


def test_a_huge_file_behind_a_copied_genuine_header_is_not_read_whole(
    root: Path, three_frames: tuple[bytes, list[Message]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Promise 2 ("never reads a huge planted file whole"). Attack: copy the valid
    cache's engine line and face header (they check out against the live log), then
    one frame length claiming the rest of a 64 MiB sparse file of zeros."""
    good, truth = three_frames
    engine, face, _ = _headers(good)
    size = 64 << 20
    with open(_cache(root), "wb") as f:
        f.write(engine + face)
        f.write((size - len(engine) - len(face) - 4 - 33).to_bytes(4, "big"))
        f.truncate(size)
    largest = 0
    real = FileCacheReader.read

    def read(reader: FileCacheReader, n: int) -> bytes:
        nonlocal largest
        largest = max(largest, n)
        return real(reader, n)

    monkeypatch.setattr(FileCacheReader, "read", read)
    assert _cold(root) == (truth, False)
    assert largest < 4 << 20, f"one read of {largest >> 20} MiB of a planted 64 MiB file"


def test_a_planted_cache_of_countless_empty_frames_is_refused_at_once(
    root: Path, three_frames: tuple[bytes, list[Message]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Promise 2 ("never hangs"). Attack: a 1 MB plant of 200,000 empty frames behind
    a genuine engine line and a header whose frame count says so."""
    good, truth = three_frames
    engine, face, _ = _headers(good)
    n = 200_000
    _cache(root).write_bytes(
        engine
        + face.replace(b'"frames":3', b'"frames":%d' % n)
        + b"\x00\x00\x00\x01\x90" * n
        + b"0" * 32
        + b"\n"
    )
    calls = 0
    real = TranscriptProjection.from_cache_frame

    def counting(self: TranscriptProjection, state: list[Message], frame: bytes) -> Any:
        nonlocal calls
        calls += 1
        return real(self, state, frame)

    monkeypatch.setattr(TranscriptProjection, "from_cache_frame", counting)
    assert _cold(root) == (truth, False)
    assert calls <= 64, f"{calls} frames decoded from a planted file before refusing it"


def _replace_log_with_copy(root: Path) -> None:
    log = log_path(root, SID)
    tmp = log.with_name("other")
    shutil.copyfile(log, tmp)
    os.replace(tmp, log)


def _replace_log_with_shorter(root: Path) -> None:
    log = log_path(root, SID)
    off = _line_ends(log)[399][0]
    log.write_bytes(log.read_bytes()[:off])  # same inode, cut below the cached offset


def _replace_log_with_foreign(root: Path) -> None:
    """Another process puts a log of the same shape (same seqs, other bytes) in place."""
    other = root.parent / "other"
    with SessionStore(other) as s:
        for i in range(900):
            s.append_transcript_messages(SID, _turn(i + 1))
    os.replace(log_path(other, SID), log_path(root, SID))


@pytest.mark.parametrize(
    "history",
    ["compact", "compact-retain", "repair", "recreate", "copy", "shorter", "foreign"],
)
def test_a_stale_cache_planted_back_is_ignored(root: Path, history: str) -> None:
    """Promise 2. Attack: save the cache, then move the log on (a compaction, one with
    retention, a repair that cut a bad middle line and regrowth, delete_session and the
    same id re-created, the log replaced by a copy of itself, cut in place below the
    cached offset, replaced by another log of the same seqs), plant the old cache back,
    and its engine line rewritten to the live lock file's generation: the load equals
    the truth. The copy of the log is the same log: its cache serves it (since caches
    are bound to the generation and the log's bytes, not to its inode)."""
    _write_numbered(root, 700)
    stale = _cache(root).read_bytes()
    with SessionStore(root) as s:
        if history == "compact":
            assert s.compact(SID, force=True).compacted
        elif history == "compact-retain":
            assert s.compact(SID, force=True, retention=Retention(messages=10)).compacted
        elif history == "repair":
            from eventstore.ops.repair import repair

            log = log_path(root, SID)
            data = log.read_bytes()
            cut = data.index(b'"seq":300,')
            log.write_bytes(data[:cut] + b"X" + data[cut + 1 :])
            s.close()
            s = SessionStore(root)
            repair(s, SID)
        elif history == "recreate":
            assert s.delete_session(SID, purge=True)
    if history == "copy":
        _replace_log_with_copy(root)
    elif history == "shorter":
        _replace_log_with_shorter(root)
    elif history == "foreign":
        _replace_log_with_foreign(root)
    if history in ("repair", "recreate", "shorter"):
        with SessionStore(root) as s:
            for i in range(900):
                s.append_transcript_messages(SID, _turn(5000 + i))
    truth = oracle.truth(root, SID).transcript
    # the lock file's first 8 bytes: the generation (docs/log-format.md)
    gen = int.from_bytes(log_path(root, SID).with_name("log.lock").read_bytes()[:8], "big")
    engine, face, at = _headers(stale)
    e = json.loads(engine)
    reused = (json.dumps({**e, "gen": gen}, separators=(",", ":")) + "\n").encode()
    for plant in (stale, reused + face + stale[at:]):
        _cache(root).write_bytes(plant)
        got, used = _cold(root)
        assert _exactly(got) == _exactly(truth), history
        # the copy of the same log is the one case where the cache still describes it
        assert used == (history == "copy"), history


def _run_child(work: Callable[[], object]) -> int:
    """Fork; the child runs `work` and exits 0, or 1 (its traceback on stderr)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            work()
            code = 0
        except BaseException:  # noqa: BLE001 - reported by the exit code
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def _loads_beside(pid: int, root: Path, check: Callable[[list[Message]], None]) -> tuple[int, int]:
    """Cold loads (a fresh store each), each handed to `check`, until child `pid` ends
    (it must exit 0, within 30 s); returns how many loads were made, and how many of
    them started from the fold cache."""
    deadline = time.monotonic() + 30
    loads, cached, done = 0, 0, False
    try:
        while True:
            reaped, status = os.waitpid(pid, os.WNOHANG)
            if reaped:
                done = True
                assert os.waitstatus_to_exitcode(status) == 0
                return loads, cached
            assert time.monotonic() < deadline, "the child did not end"
            with SessionStore(root) as s:
                check(s.load_transcript_messages(SID))
                f = s.cache_info(SID).folds.get("transcript")
                cached += f is not None and f[1] is not None
            loads += 1
    finally:
        if not done:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


@pytest.mark.slow
def test_cold_loads_beside_a_writer_that_compacts_and_saves_caches(root: Path) -> None:
    """Promise 3. Attack: another process appends 100 turns a round, loads and closes
    (saving the cache when the log grew by an eighth), and compacts every third round,
    for ~1.5 s, while this one cold-loads in a loop (a fresh store each, most loads
    from the cache) and loads with one long-lived store between them: every load is
    whole turns in order, never fewer than that reader's load before, nothing raises."""
    _write_numbered(root, 600)

    def writer() -> None:
        k, r = 600, 0
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            with SessionStore(root) as s:
                s.load_transcript_messages(SID)
                for _ in range(100):
                    s.append_transcript_messages(SID, _turn(k))
                    k += 1
                if r % 3 == 2:
                    s.compact(SID, force=True, archive=r % 2 == 0)
            r += 1

    seen = 0

    warm = SessionStore(root)  # a reader that keeps its state between loads
    warm_seen = 0

    def check(got: list[Message]) -> None:
        nonlocal seen, warm_seen
        assert len(got) >= seen and _is_prefix(got), (len(got), seen)
        seen = len(got)
        again = warm.load_transcript_messages(SID)
        assert len(again) >= warm_seen and _is_prefix(again), (len(again), warm_seen)
        warm_seen = len(again)

    try:
        loads, cached = _loads_beside(_run_child(writer), root, check)
    finally:
        warm.close()
    assert loads >= 5 and cached >= 1
    got, _ = _cold(root)
    assert got == oracle.truth(root, SID).transcript and len(got) >= seen


@pytest.mark.slow
def test_cold_loads_beside_a_process_that_deletes_and_recreates_the_session(
    root: Path,
) -> None:
    """Promise 3. Attack: another process deletes the session and writes it again (600
    turns, a close that saves the cache) in a loop while this one cold-loads: each load
    is whole turns from the first (a prefix of one of the generations), never raises."""
    _write_numbered(root, 600)

    def recreator() -> None:
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            with SessionStore(root) as s:
                s.delete_session(SID, purge=True)
                for i in range(600):
                    s.append_transcript_messages(SID, _turn(i))

    def check(got: list[Message]) -> None:
        assert _is_prefix(got), len(got)

    loads, cached = _loads_beside(_run_child(recreator), root, check)
    assert loads >= 5 and cached >= 1
    assert _cold(root)[0] == oracle.truth(root, SID).transcript == _expected(600)


def _close_on(root: Path, turns: int, start: int, ready: Path, go: Path) -> None:
    """Fold the transcript, append `turns` turns from `start`, say so (`ready`), and
    close (saving the cache) once `go` exists."""
    s = SessionStore(root)
    s.load_transcript_messages(SID)
    for i in range(start, start + turns):
        s.append_transcript_messages(SID, _turn(i))
    ready.touch()
    while not go.exists():
        time.sleep(0.0005)
    s.close()


@pytest.mark.slow
def test_two_processes_closing_at_once_leave_a_valid_or_ignored_cache(root: Path) -> None:
    """Promise 3. Attack: two processes that both folded the transcript (one at an
    older head, one after 150 more turns) close at the same instant, both saving the
    cache (atomic renames racing); then the same while this process cold-loads. What is
    left is used only if it is some valid state; every load equals the truth."""
    _write_numbered(root, 700)
    turn = 700
    for rnd in range(4):
        _cache(root).unlink(missing_ok=True)
        go = root / f"go-{rnd}"
        ready = [root / f"ready-{rnd}-{j}" for j in range(2)]

        pids = [_run_child(partial(_close_on, root, 0, turn, ready[0], go))]
        while not ready[0].exists():
            time.sleep(0.001)
        pids.append(_run_child(partial(_close_on, root, 150, turn, ready[1], go)))
        while not all(r.exists() for r in ready):
            time.sleep(0.001)
        turn += 150
        go.touch()
        if rnd % 2:
            for _ in range(5):
                got, _ = _cold(root)
                assert _is_prefix(got)
        assert [wait_child(p, 20) for p in pids] == [0, 0]
        truth = oracle.truth(root, SID).transcript
        assert truth == _expected(turn)
        # the last rename's: either closer's head (each a point of the live log)
        assert json.loads(_headers(_cache(root).read_bytes())[0])["seq"] in (turn - 150, turn)
        assert _cold(root) == (truth, True)


@pytest.mark.parametrize("stage", ["mid-write", "before-rename", "after-rename"])
def test_a_close_killed_while_writing_the_cache_leaves_nothing_trusted_wrongly(
    root: Path, stage: str
) -> None:
    """Promise 4. Attack: a process that appended 150 turns (past an eighth) closes and
    is killed (os._exit) while writing the transcript cache: after half its bytes, with
    the temporary file whole but not renamed (the old cache already let go: a cache
    only saves time, and renaming onto a free name costs a tenth of a rename over a
    file on ext4), and right after the rename (a cache is written without fsync, so
    nothing follows it). The load equals the truth; the debris is never read."""
    _write_numbered(root, 700)
    old = _cache(root).read_bytes()

    def child() -> None:
        s = SessionStore(root)
        s.load_transcript_messages(SID)
        for i in range(700, 850):
            s.append_transcript_messages(SID, _turn(i))
        real_write, real_replace = os.write, os.replace
        if stage == "mid-write":

            def write(fd: int, data: Any) -> int:
                if len(data) > 100_000:  # (the last frame: 164 messages)
                    real_write(fd, bytes(data[: len(data) // 2]))
                    os._exit(9)
                return real_write(fd, data)

            os.write = write
        elif stage == "before-rename":

            def replace(src: Any, dst: Any) -> None:
                if "fold-transcript" in str(dst):
                    os._exit(9)
                real_replace(src, dst)

            os.replace = replace
        else:

            def replace_then_die(src: Any, dst: Any) -> None:
                real_replace(src, dst)
                if "fold-transcript" in str(dst):
                    os._exit(9)

            os.replace = replace_then_die
        s.close()

    pid = _run_child(child)
    assert wait_child(pid, 20) == 9
    debris = [n for n in os.listdir(_cache(root).parent) if ".tmp-" in n]
    assert bool(debris) == (stage != "after-rename")
    truth = oracle.truth(root, SID).transcript
    assert truth == _expected(850)
    if stage == "after-rename":
        assert _cache(root).read_bytes() != old
    else:
        assert _cache(root).exists() == (stage == "mid-write")
        assert not _cache(root).exists() or _cache(root).read_bytes() == old
    got, used = _cold(root)
    assert got == truth and used == (stage != "before-rename")


@pytest.mark.slow
def test_sigkill_at_random_moments_of_closes_leaves_loads_equal_to_the_log(root: Path) -> None:
    """Promise 4. Attack: ten processes, each folds the transcript, appends 150 turns
    and closes (which writes a 1.6-3.5 MB cache, ~7 ms), SIGKILLed at a random moment
    of its close; after each, cold loads equal the truth."""
    _write_numbered(root, 700)
    rng = random.Random(7)
    turns = 700
    for rnd in range(10):
        ready = root / f"ready-{rnd}"

        def child(start: int = turns, ready: Path = ready) -> None:
            s = SessionStore(root)
            s.load_transcript_messages(SID)
            for i in range(start, start + 150):
                s.append_transcript_messages(SID, _turn(i))
            ready.touch()
            s.close()
            time.sleep(5)

        pid = _run_child(child)
        while not ready.exists():
            time.sleep(0.0005)
        time.sleep(rng.uniform(0, 0.01))
        os.kill(pid, signal.SIGKILL)
        assert wait_child(pid, 10) == -9
        turns += 150
        truth = oracle.truth(root, SID).transcript
        assert truth == _expected(turns)
        assert _cold(root)[0] == truth


def test_a_child_forked_while_a_cold_load_reads_frames_does_not_deadlock(
    root: Path, three_frames: tuple[bytes, list[Message]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Promise 5. Attack: fork from inside a cold load, as it reads a ~1 MB frame (the
    load holds the session lock, the collector paused, the cache's descriptor open);
    the child loads with the inherited store and a new one within 10 s. Then fork from
    the main thread while another thread cold-loads in a loop."""
    _, truth = three_frames
    shared = SessionStore(root)
    codes: list[int | None] = []
    real_read = FileCacheReader.read
    parent = os.getpid()

    def child() -> bool:
        with SessionStore(root) as fresh:
            a = fresh.load_transcript_messages(SID)
        return a == truth and shared.load_transcript_messages(SID) == truth

    def read(reader: FileCacheReader, n: int) -> bytes:
        data = real_read(reader, n)
        if os.getpid() == parent and len(codes) < 2 and n > 100_000:
            codes.append(None)
            codes[-1] = in_forked_child(child, 10)
        return data

    monkeypatch.setattr(FileCacheReader, "read", read)
    try:
        assert shared.load_transcript_messages(SID) == truth
        assert shared.cache_info(SID).folds["transcript"][1] is not None
        assert codes == [0, 0]
        monkeypatch.setattr(FileCacheReader, "read", real_read)
        stop = threading.Event()
        errors: list[BaseException] = []

        def loop() -> None:
            try:
                while not stop.is_set():
                    shared.forget_cached_state()
                    assert shared.load_transcript_messages(SID) == truth
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        t = threading.Thread(target=loop)
        t.start()
        try:
            for _ in range(6):
                time.sleep(0.004)
                assert in_forked_child(child, 10) == 0
        finally:
            stop.set()
            t.join()
        assert not errors
    finally:
        shared.close()


_faults: list[str] = []  # the faults injected so far (a test asserts one was)


def _enospc(*a: object, **k: object) -> Any:
    _faults.append("ENOSPC")
    raise OSError(errno.ENOSPC, "No space left on device")


def _half_then_enospc() -> Callable[[int, Any], int]:
    real = os.write
    calls = 0

    def write(fd: int, data: Any) -> int:
        nonlocal calls
        calls += 1
        if calls == 1 and len(data) > 1:
            return real(fd, bytes(data[: len(data) // 2]))
        return _enospc()  # type: ignore[no-any-return]

    return write


@pytest.mark.parametrize("fault", ["write", "half-write", "replace", "first-cache"])
def test_disk_errors_while_saving_never_fail_close_nor_leave_a_trusted_cache(
    root: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """Promise 6. Attack: a close that saves the transcript cache (150 turns past an
    eighth; and a first cache, none before) meets ENOSPC from os.write (at once, or
    after half the bytes) or from the rename (a cache is written without fsync): close
    returns, no temporary file is left, and the next cold load equals the truth (from
    the old cache, or none: a rename that failed let the old go first, as
    `test_a_close_killed_while_writing_the_cache_leaves_nothing_trusted_wrongly`
    says why)."""
    _write_numbered(root, 700)
    if fault == "first-cache":
        _cache(root).unlink()
    old = _cache(root).read_bytes() if _cache(root).exists() else None
    s = SessionStore(root)
    s.load_transcript_messages(SID)
    for i in range(700, 850):
        s.append_transcript_messages(SID, _turn(i))
    _faults.clear()
    with monkeypatch.context() as m:
        if fault in ("write", "first-cache"):
            m.setattr(os, "write", _enospc)
        elif fault == "half-write":
            m.setattr(os, "write", _half_then_enospc())
        else:
            m.setattr(os, "replace", _enospc)
        s.close()  # never raises
    assert _faults  # the save was tried, and failed
    assert not [n for n in os.listdir(_cache(root).parent) if ".tmp-" in n]
    kept = old if fault != "replace" else None
    assert (_cache(root).read_bytes() if _cache(root).exists() else None) == kept
    truth = oracle.truth(root, SID).transcript
    assert truth == _expected(850)
    assert _cold(root)[0] == truth


def test_disk_errors_while_an_eviction_saves_fail_no_call(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Promise 6. Attack: ENOSPC on every os.write while `cached_sessions=1` evicts a
    session with a folded transcript (its caches saved by the load of another session):
    the load that evicted it returns, and loads equal the truth."""
    _write_numbered(root, 700)
    _cache(root).unlink()
    with SessionStore(root, cached_sessions=1) as s:
        s.load_transcript_messages(SID)
        _faults.clear()
        with monkeypatch.context() as m:
            m.setattr(os, "write", _enospc)
            assert s.load_transcript_messages("other") == []
        assert _faults
        assert not _cache(root).exists()
    assert _cold(root)[0] == oracle.truth(root, SID).transcript == _expected(700)


def _rich(i: int) -> list[Message]:
    """Turn `i` of rich messages: every block kind, nested JSON, integers at the 64-bit
    edges (past them from turn 1,300 on, every 7th), floats at theirs, NUL and non-BMP
    text, times in UTC (before turn 1,100) and with offsets (from it on)."""
    edges: dict[str, Any] = {"u64": (1 << 64) - 1, "i64": -(1 << 63), "u63": 1 << 63}
    if i >= 1300 and i % 7 == 0:
        edges.update({"past": 1 << 64, "neg": -(1 << 63) - 1, "n": 12345678901234567890123})
    nested = {
        "a": [1, -0.0, 5e-324, 1.7976931348623157e308, None, True, "\u00fc\x00\U0010ffff"],
        "b": {"c": {"d": [[], {}, ""]}, "\U0001f389": "\U0001f600"},
    }
    utc = [
        None,
        datetime(2026, 3, 1, 9, 30, 0, 123456, tzinfo=UTC),
        datetime(1900, 1, 2, tzinfo=UTC),
    ]
    shifted = [
        datetime(2026, 3, 1, 9, 30, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        datetime(2199, 12, 30, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-23))),
        datetime(2026, 3, 1, tzinfo=UTC),
    ]
    return [
        Message(
            role=Role.ASSISTANT,
            content=f"r{i} \x00 \U0001f600 \U0010ffff " + "x" * 200,
            name="tool\x00name",
            blocks=[
                TextBlock(text="t\x00\U0001f600"),
                ThinkingBlock(thinking="th", signature="sig\U0010ffff"),
                ThinkingBlock(thinking=""),
                ImageBlock(source="sha256:00", media_type="image/png"),
                ImageBlock(source="file:///x"),
                ToolUseBlock(id=f"c{i}", name="run", input={"nested": nested, **edges}),
                ToolResultBlock(tool_use_id=f"c{i}", content="ok", is_error=True),
                ToolResultBlock(
                    tool_use_id=f"c{i}",
                    content=[TextBlock(text="a"), ImageBlock(source="s", media_type=None)],
                ),
            ],
            created_at=(shifted if i >= 1100 else utc)[i % 3],
            metadata={"nested": nested, "i": i, **edges},
        ),
        Message(role=Role.USER, content=f"plain {i}", created_at=utc[1]),
    ]


def test_rich_messages_read_back_exactly_from_a_cache_of_both_encodings(root: Path) -> None:
    """Promise 7. Attack: 1,400 turns of messages with every block kind, nested JSON
    metadata, integers at and past the 64-bit edges, floats at their edges, times in
    UTC and with offsets (some frames all UTC, so MessagePack; others JSON), NUL and
    non-BMP text; saved on close, then read back by a cold load: the same bytes as the
    log folded alone, and the cache held frames of both encodings."""
    with SessionStore(root) as s:
        for i in range(1400):
            s.append_transcript_messages(SID, _rich(i))
    frames = _all_frames(root)
    kinds = {f[:1] == b"[" for f in frames}
    assert len(frames) == -(-2800 // FRAME_MESSAGES) and kinds == {True, False}
    truth = oracle.truth(root, SID).transcript
    got, used = _cold(root)
    assert used and _exactly(got) == _exactly(truth)
    assert got == [m for i in range(1400) for m in _rich(i)]


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(rich_messages, min_size=1, max_size=40), st.integers(0, 600))
def test_any_rich_messages_read_back_exactly_through_the_store(
    tmp_path: Path, messages: list[Message], pad: int
) -> None:
    """Promise 7. Attack: hypothesis' rich messages (any offsets, any JSON values)
    after `pad` padding messages (so they fall anywhere across a frame boundary), saved
    on the close of a store that loaded them, read back by a cold load."""
    root = tmp_path / f"h{time.monotonic_ns()}"
    with SessionStore(root) as s:
        for i in range(pad):
            s.append_transcript_messages(
                SID, [Message(role=Role.USER, content=f"p{i} " + "p" * 100)]
            )
        s.append_transcript_messages(SID, messages)
        s.append_transcript_messages(SID, [Message(role=Role.USER, content="z" * 70_000)])
        s.load_transcript_messages(SID)
    assert _cache(root).is_file()
    truth = oracle.truth(root, SID).transcript
    got, used = _cold(root)
    assert used and _exactly(got) == _exactly(truth)
    shutil.rmtree(root)


class _Seqs(StructProjection[list[int]]):
    """A framed user projection: the seqs of every event, in frames of 100."""

    name = "seqs"
    version = 1
    event_types = None
    state_type = list[int]
    cache_folds = True

    def initial(self) -> list[int]:
        return []

    def apply(self, state: list[int], event: Event) -> list[int]:
        state.append(event.seq)  # type: ignore[attr-defined]
        return state

    def cache_frames(self, state: list[int]) -> Any:
        return [msgspec.json.encode(state[i : i + 100]) for i in range(0, len(state), 100)]

    def from_cache_frame(self, state: list[int], frame: bytes) -> list[int]:
        state.extend(msgspec.json.decode(frame, type=list[int]))
        return state


class _FramesRaise(_Seqs):
    def cache_frames(self, state: list[int]) -> Any:
        raise RuntimeError("cache_frames failed")


class _FramesOfStr(_Seqs):
    def cache_frames(self, state: list[int]) -> Any:
        return [f.decode() for f in super().cache_frames(state)]


class _FramesNone(_Seqs):
    def cache_frames(self, state: list[int]) -> Any:
        return None


class _FramesOfInts(_Seqs):
    def cache_frames(self, state: list[int]) -> Any:
        return [1, 2, 3]


class _FramesGenerator(_Seqs):
    def cache_frames(self, state: list[int]) -> Any:
        return (f for f in super().cache_frames(state))


class _FramesOfWideViews(_Seqs):
    def cache_frames(self, state: list[int]) -> Any:
        import array

        return [memoryview(array.array("i", state))]  # len() counts ints, not bytes


class _DecodeValueError(_Seqs):
    def from_cache_frame(self, state: list[int], frame: bytes) -> list[int]:
        raise ValueError("no")


class _DecodeRuntimeError(_Seqs):
    def from_cache_frame(self, state: list[int], frame: bytes) -> list[int]:
        raise RuntimeError("from_cache_frame failed")


class _DecodeReturnsNone(_Seqs):
    def from_cache_frame(self, state: list[int], frame: bytes) -> list[int]:
        state.extend(msgspec.json.decode(frame, type=list[int]))
        return None  # type: ignore[return-value]  # forgot to return the state


class _Zipped(_Seqs):
    """Compressed frames: sound, until a byte of the cache is damaged."""

    damage = True

    def cache_frames(self, state: list[int]) -> Any:
        return [zlib.compress(f) for f in super().cache_frames(state)]

    def from_cache_frame(self, state: list[int], frame: bytes) -> list[int]:
        return super().from_cache_frame(state, zlib.decompress(frame))


def _fill_seqs(root: Path, proj: _Seqs, *, load: bool) -> list[int]:
    """600 turns (1.1 MB: past the megabyte after which a close folds what it has not)
    with the projection loaded before close, or not."""
    with SessionStore(root, projections=[proj]) as s:
        for i in range(600):
            s.append_transcript_messages(SID, _turn(i))
        if load:
            assert s.load(SID, "seqs") == list(range(1, 601))
    return list(range(1, 601))


@pytest.mark.parametrize(
    "proj",
    [
        _FramesRaise(),
        _FramesOfStr(),
        _FramesNone(),
        _FramesOfInts(),
        _FramesGenerator(),
        _FramesOfWideViews(),
        _DecodeValueError(),
    ],
    ids=lambda p: type(p).__name__,
)
@pytest.mark.parametrize("load", [True, False], ids=["loaded", "folded-on-close"])
def test_a_framed_user_projection_that_encodes_badly_fails_no_load_nor_close(
    root: Path, proj: _Seqs, load: bool
) -> None:
    """Promise 8. Attack: a user projection with `cache_folds = True` whose
    `cache_frames` raises or returns str, None, ints, a generator, or a memoryview whose
    len() is not its byte count (a cache whose frame lengths lie), or whose
    `from_cache_frame` raises ValueError; its state loaded before close, or left for
    the close to fold (the store appended a megabyte). Neither close nor the next two
    cold loads fail, and each equals the fold of the log."""
    want = _fill_seqs(root, proj, load=load)
    for _ in range(2):
        with SessionStore(root, projections=[type(proj)()]) as s:
            assert s.load(SID, "seqs") == want


@pytest.mark.parametrize(
    "proj",
    [_DecodeRuntimeError(), _DecodeReturnsNone(), _Zipped()],
    ids=lambda p: type(p).__name__,
)
def test_a_framed_user_projection_whose_decoding_raises_fails_no_load(
    root: Path, proj: _Seqs
) -> None:
    """Promise 8 (and 2: a damaged cache never raises). Attack: a user projection with
    `cache_folds = True` whose `from_cache_frame` raises RuntimeError, or returns None
    (so the next frame's call raises AttributeError), or decompresses zlib frames of a
    cache with one damaged byte: the cold load must ignore the cache and fold the log."""
    want = _fill_seqs(root, proj, load=True)
    assert _cache(root, "seqs").is_file()
    if isinstance(proj, _Zipped):
        data = bytearray(_cache(root, "seqs").read_bytes())
        data[_headers(bytes(data))[2] + 4 + 6] ^= 0xFF  # inside the first frame
        _cache(root, "seqs").write_bytes(bytes(data))
    with SessionStore(root, projections=[type(proj)()]) as s:
        assert s.load(SID, "seqs") == want


# -- chunks: a close writes only the frames its appends left (issue 34) -----------------


def _numbered(start: int, n: int, width: int = 40) -> list[Message]:
    return [
        Message(role=Role.USER, content=f"n{i} " + "x" * width) for i in range(start, start + n)
    ]


_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 400)),
        st.tuples(st.just("reopen"), st.booleans()),  # load first, or not
        st.tuples(st.just("compact"), st.none() | st.integers(0, 900)),  # retention
    ),
    min_size=1,
    max_size=9,
)


@pytest.mark.slow
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=_STEPS)
def test_close_then_a_cold_load_equals_the_fold_of_the_log_on_every_engine(
    case: Any, tmp_path: Path, steps: list[tuple[str, Any]]
) -> None:
    """Promise 1, for chunks. Attack: any sequence of appends (frames completing at any
    point), closes and reopenings (with a load first or not), compactions with and
    without retention; after each close a cold load by a fresh store (from the chunks
    and the cache listing them) equals the log folded by a store without caches."""
    url = case.fresh(tmp_path / f"h{len(os.listdir(tmp_path))}")
    tun = Tuning(cache_on_close=0)

    def check() -> None:
        with oracle.bare_store(url) as bare, SessionStore(url, tuning=tun) as cold:
            assert cold.load_transcript_messages(SID) == bare.load_transcript_messages(SID)

    n = 0
    s = SessionStore(url, tuning=tun)
    try:
        for step, arg in steps:
            if step == "append":
                s.append_transcript_messages(SID, _numbered(n, arg))
                n += arg
            elif step == "reopen":
                s.close()
                check()
                s = SessionStore(url, tuning=tun)
                if arg:
                    s.load_transcript_messages(SID)
            elif n:
                retention = None if arg is None else Retention(messages=arg)
                s.compact(SID, force=True, retention=retention)
        s.close()
        check()
    finally:
        s.close()


def test_a_close_stores_no_complete_frame_on_every_caching_engine(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34. What a writer's close hands its engine (spied on `store_cache`, the
    engine's public method) after 1,400 messages: no chunk, and for the transcript
    less than a frame's bytes; each chunk was stored once, by the append that completed
    its frame. The next cold load starts from the cache and equals the log."""
    s = SessionStore(url)
    stored: list[tuple[str, int]] = []
    engine = s.engine
    if not isinstance(engine, CachingEngine):
        s.close()
        pytest.skip(f"{type(engine).__name__} keeps no caches")
    real = engine.store_cache

    def spy(session_id: str, name: str, head: Any, data: list[bytes]) -> None:
        stored.append((name, sum(map(len, data))))
        real(session_id, name, head, data)

    monkeypatch.setattr(engine, "store_cache", spy)
    for i in range(0, 1400, 7):
        s.append_transcript_messages(SID, _numbered(i, 7))
    assert [n for n, _ in stored] == ["transcript#0", "transcript#1"]
    frame = stored[0][1]
    stored.clear()
    s.close()
    assert "transcript" in dict(stored) and not [n for n, _ in stored if "#" in n]
    assert dict(stored)["transcript"] < frame  # 376 of 512 messages, and the list
    with oracle.bare_store(url) as bare, SessionStore(url) as cold:
        assert cold.load_transcript_messages(SID) == bare.load_transcript_messages(SID)
        assert cold.cache_info(SID).folds["transcript"][1] == cold.last_seq(SID)


@pytest.mark.parametrize("parts", ["engine's", "default"])
def test_a_cold_load_checks_the_live_log_once_not_once_a_chunk(
    url: str, monkeypatch: pytest.MonkeyPatch, parts: str
) -> None:
    """Issue 34. A cold load of 1,400 messages (two chunks and the cache listing them),
    spied on the engine's public `open_cold`, `open_cache` and `open_cache_parts`: the
    listing is opened with the live-log check (`open_cold`, or `open_cache`) once, its
    two chunks by one call of `open_cache_parts`. With the interface's default
    `open_cache_parts` (an engine that does not override it: `open_cache` a part) the
    load uses the cache just the same.
    Both loads start from the cache and equal the log."""
    with SessionStore(url) as s:
        if not isinstance(s.engine, CachingEngine):
            pytest.skip(f"{type(s.engine).__name__} keeps no caches")
        s.append_transcript_messages(SID, _numbered(0, 1400))
    opened: list[str] = []
    with oracle.bare_store(url) as bare, SessionStore(url) as cold:
        engine = cold.engine
        assert isinstance(engine, CachingEngine)
        real_open, real_parts = engine.open_cache, engine.open_cache_parts
        real_cold = engine.open_cold
        if parts == "default":
            real_parts = partial(CachingEngine.open_cache_parts, engine)
        cold_start = []  # inside `open_cold`: its `open_cache`, if it calls it, is its own

        def open_cold(session_id: str, name: str | None, mark: str | None) -> Any:
            opened.extend([name] if name else [])
            cold_start.append(1)
            try:
                return real_cold(session_id, name, mark)
            finally:
                cold_start.pop()

        def open_cache(session_id: str, name: str) -> Any:
            opened.extend([] if cold_start else [name])
            return real_open(session_id, name)

        def open_cache_parts(session_id: str, name: str, count: int) -> Any:
            opened.append(f"{name}: {count} parts")
            return real_parts(session_id, name, count)

        monkeypatch.setattr(engine, "open_cache", open_cache)
        monkeypatch.setattr(engine, "open_cold", open_cold)
        monkeypatch.setattr(engine, "open_cache_parts", open_cache_parts)
        assert cold.load_transcript_messages(SID) == bare.load_transcript_messages(SID)
        assert cold.cache_info(SID).folds["transcript"][1] == cold.last_seq(SID)
    chunks = ["transcript#0", "transcript#1"] if parts == "default" else []
    assert [n for n in opened if n.startswith("transcript")] == [
        "transcript", "transcript: 2 parts", *chunks
    ]  # fmt: skip


def _another_historys_chunk(root: Path, mine: bytes) -> tuple[bytes, bytes, bytes]:
    """Chunk 0 of a copy of the session whose log has other messages (the same length,
    lines and seqs: each line's `h` differs; `mine`: this session's chunk 0): as it is,
    with its engine line made to name the head of `mine`, and with the engine line and
    the header made to name it and its CRC made to match."""
    mine_engine, mine_face, _ = _headers(mine)
    other = root.parent / "other"
    with SessionStore(other) as s:
        for i in range(700):
            s.append_transcript_messages(SID, _turn(i + 1000))  # m1000...: same lengths
    theirs = _parts(other)[0].read_bytes()
    t_engine, t_face, at = _headers(theirs)
    assert json.loads(t_engine)["seq"] == json.loads(mine_engine)["seq"]
    assert json.loads(t_engine)["h"] != json.loads(mine_engine)["h"]
    lying = mine_engine + theirs[len(t_engine) :]
    body = theirs[at:-9]
    relabelled = mine_engine + mine_face + body + b"%08x\n" % zlib.crc32(mine_face + body)
    return theirs, lying, relabelled


def test_a_chunk_of_another_history_at_the_listed_seq_is_refused(
    root: Path, three_frames: tuple[bytes, list[Message]]
) -> None:
    """Issue 34: chunks are opened without the live-log check. Attack: chunk 0 of a
    copy of the session whose log has other messages (the same length, lines and seqs:
    each line's `h` differs) put in place of this session's chunk 0: as it is (its
    engine line and header name the other history's head), with its engine line made
    to name the listed head, and with the engine line and the header made to name it
    and its CRC made to match. Each is refused (another head than listed, another
    checksum than listed) and the load equals the log."""
    good, truth = three_frames
    kept = _keep_caches(root)
    p0 = _parts(root)[0]
    theirs, lying, relabelled = _another_historys_chunk(root, kept[p0])
    for bad in (theirs, lying, relabelled):
        _put_back(root, {**kept, p0: bad})
        _assert_ignored(root, truth)
    _put_back(root, kept)
    assert _cold(root) == (truth, True)


def test_a_chunk_forged_without_the_cache_key_is_refused(root: Path) -> None:
    """Promise 2, keyed. Attack: a store with a cache key lists its chunks by their
    HMAC. The same log's chunks written at the same heads by a store with another key
    (every byte the same but the MAC), and one of its own chunks edited with its MAC
    left as it was, each put in place: refused, and the load equals the log."""
    key, other_key = b"k" * 32, b"o" * 32
    _write_numbered(root, 700)
    for p in [*_parts(root), _cache(root)]:
        p.unlink()
    with SessionStore(root, cache_key=key) as s:  # its close keeps every chunk at one head
        s.load_transcript_messages(SID)
    mine = _keep_caches(root)
    copy = root.parent / "copy"
    shutil.copytree(root, copy)
    for p in [*_parts(copy), _cache(copy)]:
        p.unlink()
    with SessionStore(copy, cache_key=other_key) as s:
        s.load_transcript_messages(SID)
    theirs = _parts(copy)[1].read_bytes()
    p1 = _parts(root)[1]
    assert theirs != mine[p1] and len(theirs) == len(mine[p1])
    edited = mine[p1].replace(b"m300 a ", b"m301 a ")
    truth = oracle.truth(root, SID).transcript
    for bad in (theirs, edited):
        _put_back(root, {**mine, p1: bad})
        with SessionStore(root, cache_key=key) as s:
            assert s.load_transcript_messages(SID) == truth
            assert s.cache_info(SID).folds["transcript"][1] is None
    _put_back(root, mine)
    with SessionStore(root, cache_key=key) as s:
        assert s.load_transcript_messages(SID) == truth
        assert s.cache_info(SID).folds["transcript"][1] == s.last_seq(SID)


@pytest.mark.parametrize("order", ["old-first", "new-first"])
@pytest.mark.parametrize("old_appends", [False, True], ids=["old-idle", "old-appends"])
def test_two_writers_either_side_of_a_compaction_with_retention_never_mix_chunks(
    root: Path, order: str, old_appends: bool
) -> None:
    """Promise 3, for chunks. Attack: writer A holds a transcript of 1,100 messages (two
    chunks written); writer B compacts it keeping 300 messages (no archive): no chunk of
    the dropped messages is left. B loads and appends until a frame of the new history
    completes (its chunk 0: other messages under the same name); A appends (catching up
    on the new log first) or not; both close, in either order. Every cold load equals
    the log, and a later writer's chunks are used."""
    a = SessionStore(root)
    for i in range(0, 1100, 100):  # (each batch past FRAME_LOOK: A looks after every one)
        a.append_transcript_messages(SID, _numbered(i, 100, width=FRAME_LOOK // 100))
    assert len(_parts(root)) == 2
    b = SessionStore(root)
    b.load_transcript_messages(SID)
    assert b.compact(SID, force=True, archive=False, retention=Retention(messages=300)).compacted
    assert _parts(root) == []
    dropped = [f"n{i} ".encode() for i in range(0, 800, 7)]
    assert not [p for p, data in _keep_caches(root).items() if any(d in data for d in dropped)]
    b.load_transcript_messages(SID)
    b.append_transcript_messages(SID, _numbered(1100, 300))
    assert len(_parts(root)) == 1
    if old_appends:
        a.append_transcript_messages(SID, _numbered(1400, 5))
    for s in [a, b] if order == "old-first" else [b, a]:
        s.close()
        got, _ = _cold(root)
        assert got == oracle.truth(root, SID).transcript
    with SessionStore(root) as s:
        s.load_transcript_messages(SID)
        s.append_transcript_messages(SID, _numbered(1405, 600))
    got, used = _cold(root)
    assert used and got == oracle.truth(root, SID).transcript


@pytest.mark.parametrize("order", ["older-first", "newer-first"])
def test_two_writers_that_folded_without_a_cache_never_replace_each_others_chunks(
    url: str, order: str
) -> None:
    """Promise 3, for chunks. Attack: a writer keeps two chunks and no cache (its close
    finds the log too short to cache); writer A folds the transcript from the log (two
    complete frames) and writer B folds it and appends 300 messages (its appends keep
    complete frames as chunks); they close in either order, on every caching engine.
    Neither writes a chunk over one kept already: whichever cache is left is used, and
    equals the log."""
    with SessionStore(url, tuning=Tuning(cache_on_close=1 << 40)) as s:
        for i in range(700):
            s.append_transcript_messages(SID, _turn(i))
        engine = s.engine
        if not isinstance(engine, CachingEngine):
            pytest.skip(f"{type(engine).__name__} keeps no caches")
        assert engine.load_cache(SID, "transcript") is None
        kept = [engine.load_cache(SID, f"transcript#{k}") for k in range(2)]
    a, b = SessionStore(url), SessionStore(url)
    assert a.load_transcript_messages(SID) == b.load_transcript_messages(SID)
    for i in range(700, 850):
        b.append_transcript_messages(SID, _turn(i))
    for s in [a, b] if order == "older-first" else [b, a]:
        s.close()
    with oracle.bare_store(url) as bare, SessionStore(url) as cold:
        truth = bare.load_transcript_messages(SID)
        assert truth == _expected(850)
        assert cold.load_transcript_messages(SID) == truth
        assert cold.cache_info(SID).folds["transcript"][1] is not None
        engine = cold.engine
        assert isinstance(engine, CachingEngine)
        assert [engine.load_cache(SID, f"transcript#{k}") for k in range(2)] == kept


def test_a_writer_behind_a_chunk_kept_at_a_later_head_leaves_it_and_keeps_the_frame_itself(
    root: Path,
) -> None:
    """Promise 3, for chunks. Attack: with the cache and its chunks gone, writer A folds
    the transcript from the log; writer B folds it and appends one turn, which keeps
    chunk 0 at B's head, past A's. A closes first: its cache cannot list that chunk
    (past its head), and must not write its own over it (B's cache will list it); each
    close leaves a cache that is used and equals the log."""
    _write_numbered(root, 700)
    for p in [*_parts(root), _cache(root)]:
        p.unlink()
    a, b = SessionStore(root), SessionStore(root)
    assert a.load_transcript_messages(SID) == b.load_transcript_messages(SID)
    b.append_transcript_messages(SID, _turn(700))
    b_chunk = _parts(root)[0].read_bytes()
    a.close()
    assert _parts(root)[0].read_bytes() == b_chunk
    assert _cold(root) == (oracle.truth(root, SID).transcript, True)
    b.close()
    assert _parts(root)[0].read_bytes() == b_chunk
    assert _cold(root) == (oracle.truth(root, SID).transcript, True)


def test_a_compaction_with_retention_beside_a_writer_leaves_no_chunk_of_the_dropped_messages(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Promise 3, for chunks. Attack: a transcript of 2,100 messages kept in four chunks
    is compacted keeping 1,100 (no archive); a writer folds the new log and appends
    while the compaction keeps its caches, so chunk 0 is the writer's, at a head past
    the compaction's. The compaction leaves that chunk alone, but no chunk of the old
    history, holding messages it dropped, stays beside the state that dropped them;
    every cold load equals the log and the writer's cache is used."""
    with SessionStore(root) as s:
        for i in range(0, 2100, 100):
            s.append_transcript_messages(SID, _numbered(i, 100, width=FRAME_LOOK // 100))
    assert len(_parts(root)) == 4
    x, w = SessionStore(root), SessionStore(root)
    engine = x.engine
    assert isinstance(engine, CachingEngine)
    real_open = engine.open_cache
    raced: list[str] = []

    def open_cache(session_id: str, name: str) -> Any:
        if name == "transcript#0" and not raced:  # the compaction keeping its chunks
            raced.append(name)
            w.load_transcript_messages(SID)
            w.append_transcript_messages(SID, _numbered(2100, 5))
        return real_open(session_id, name)

    monkeypatch.setattr(engine, "open_cache", open_cache)
    retention = Retention(messages=1100)
    assert x.compact(SID, force=True, archive=False, retention=retention).compacted
    assert raced
    x.close()
    dropped = [f"n{i} ".encode() for i in range(1000)]
    assert not [p for p, data in _keep_caches(root).items() if any(d in data for d in dropped)]
    got, _ = _cold(root)
    assert got == oracle.truth(root, SID).transcript
    w.close()
    assert _cold(root) == (oracle.truth(root, SID).transcript, True)


def test_a_writer_never_lists_a_chunk_of_another_history_planted_at_a_live_head(
    root: Path, three_frames: tuple[bytes, list[Message]]
) -> None:
    """Promise 3, for chunks. Attack: a writer lists a chunk kept already instead of
    writing its own (`_chunk_kept`). With the cache gone, chunk 0 of a log of other
    messages is planted, as it is, naming this log's head, and with its header naming
    it and its CRC made to match; so is this log's own chunk 0 with one message other
    (the same size) and its CRC made to match. A writer folds the log and closes: it
    writes its own chunk over each, and the next cold load starts from its cache,
    equals the log and holds no planted message."""
    _, truth = three_frames
    p0 = _parts(root)[0]
    mine = p0.read_bytes()
    engine_line, face, at = _headers(mine)
    body = mine[at:-9].replace(b"m100 a ", b"m999 a ", 1)
    other = engine_line + face + body + b"%08x\n" % zlib.crc32(face + body)
    assert len(other) == len(mine) and other != mine
    for bad in (*_another_historys_chunk(root, mine), other):
        for p in [*_parts(root), _cache(root)]:
            p.unlink()
        p0.write_bytes(bad)
        with SessionStore(root) as s:
            assert s.load_transcript_messages(SID) == truth
        assert _frames(p0.read_bytes()) == _frames(mine)  # its own frame, at its head
        assert _cold(root) == (truth, True)
