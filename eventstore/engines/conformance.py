"""The engine conformance suite: the test cases every storage engine passes, shipped with
the package so that an engine written outside it can prove the same contract
(`eventstore.engines.base`) the built-in ones do.

Using it for your engine: subclass `EngineConformance` in a test module, under a name
pytest collects (`Test...`), and say how to make a fresh, empty store of your engine:

    from eventstore.engines.conformance import EngineConformance
    from my_package import MyEngine

    class TestMyEngine(EngineConformance):
        def make_engine(self) -> MyEngine:
            return MyEngine(self.tmp / "store")  # a new, empty store on every call

and run pytest. Every `test_*` method then runs against your engine: the required
contract always (appends and expected heads, batches, reads, pieces and positions, resets
after a snapshot install, installs with and without history, history as one picture,
wait, listing and removing sessions, the repair hold, a forked child), and the tests of
each capability (`CachingEngine`, `RangedEngine`, `SeqEngine`, `PruningEngine`, `FeedEngine`,
`KeyEngine`) only when the engine subclasses that interface; they skip otherwise. A
handful of tests go through the session API on top of the engine (`make_store`, by default
`SessionStore(engine)`): what a user sees behaves the same on every engine.

Hooks a subclass may set or override:

    make_engine()       (required) a fresh, empty store; `self.tmp` is a fresh directory
    make_store(engine)  the `SessionStore` over an engine (options of your choosing)
    timeout             seconds a test waits for a `wait` to wake (default 5)

The engines this suite makes are closed, and `self.tmp` removed, after each test.

`corrupt(engine, sid, edit)` is the documented way for tests to plant a damaged log on
any engine: it replaces the session's live log by `edit(bytes)` through the engine's own
repair hold (`RepairHold.rewrite`), as a bad tool or an attacker would, with no check.

The module needs no test framework to import; it skips through pytest when pytest is
there (imported on first skip), else `unittest.SkipTest`.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import msgspec

from eventstore import SessionStore
from eventstore.engines.base import (
    EMPTY_HEAD,
    CachingEngine,
    EncodedBatch,
    Engine,
    FeedEngine,
    Head,
    HeadMovedError,
    IndexEntry,
    IndexingEngine,
    KeyEngine,
    PruningEngine,
    RangedEngine,
    ReadResult,
    SeqEngine,
)
from eventstore.format.chain import hash_checks
from eventstore.format.codec import EventCodec
from eventstore.format.depth import HEAD_DECODER
from eventstore.format.events import (
    LineHead,
    ProgressAppended,
    Snapshot,
)
from eventstore.records import ProgressEntry

__all__ = ["EngineConformance", "corrupt", "in_forked_child", "wait_child"]

SID = "s"
_codec = EventCodec()
_line_head = HEAD_DECODER


def corrupt(engine: Engine, session_id: str, edit: Callable[[bytes], bytes]) -> None:
    """Replace the session's live log by `edit(its bytes)`, with no check of what `edit`
    returns (a test hook: how tests plant a damaged log on any engine). Goes through the
    engine's repair hold, so the original is saved aside as a repair's would be."""
    with engine.hold(session_id) as hold:
        hold.rewrite(edit(hold.data), "tampered")


def _skip(reason: str) -> NoReturn:
    try:
        import pytest
    except ImportError:  # pragma: no cover - run without pytest
        import unittest

        raise unittest.SkipTest(reason) from None
    pytest.skip(reason)


def _batch(head: Head, n: int = 1, tag: str = "x", key: str | None = None) -> EncodedBatch:
    """`n` progress events encoded as one batch chained to `head`, as the face encodes."""
    events = [
        ProgressAppended(entry=ProgressEntry(run_id=tag, summary=f"{tag} {head.seq + i + 1}"))
        for i in range(n)
    ]
    data, stamped, link = _codec.encode_batch(
        events, head.seq + 1, head.link, datetime.now(UTC), key
    )
    return EncodedBatch(
        data, stamped[0].seq, stamped[-1].seq, tuple(e.h for e in stamped), link, key
    )


def _snapshot_line(covers: Head) -> bytes:
    """A snapshot line covering `covers` (its state is no matter to an engine)."""
    states = {"conformance": msgspec.Raw(b'{"version":1,"state":null}')}
    line, _ = _codec.encode_snapshot(
        Snapshot(base_h=covers.link, states=states), covers.seq, covers.link, datetime.now(UTC)
    )
    return line


def _heads(data: bytes | memoryview) -> list[LineHead]:
    return [_line_head.decode(line) for line in bytes(data).split(b"\n")[:-1]]


def _seqs(data: bytes | memoryview) -> list[int]:
    return [h.seq for h in _heads(data)]


class EngineConformance:
    """The test cases: subclass it and define `make_engine` (see the module docstring)."""

    timeout = 5.0
    tmp: Path

    # -- hooks ------------------------------------------------------------------------

    def make_engine(self) -> Engine:
        """A fresh, empty store of the engine under test (required)."""
        raise NotImplementedError("define make_engine() in your subclass")

    def make_store(self, engine: Engine) -> SessionStore:
        """The session API over `engine` (for the tests of what users see)."""
        return SessionStore(engine)

    # -- fixtures (pytest's xunit-style hooks) ------------------------------------------

    def setup_method(self, method: object = None) -> None:
        """A fresh directory (`self.tmp`) and no engine yet."""
        self.tmp = Path(tempfile.mkdtemp(prefix="eventstore-conformance-"))
        self._opened: list[Engine | SessionStore] = []

    def teardown_method(self, method: object = None) -> None:
        """Close what the test opened, then remove `self.tmp`."""
        for thing in reversed(self._opened):
            thing.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def engine(self) -> Engine:
        """`make_engine()`, closed after the test."""
        engine = self.make_engine()
        self._opened.append(engine)
        return engine

    def store(self, engine: Engine | None = None) -> SessionStore:
        """`make_store` over `engine` (a fresh one when None), closed after the test."""
        store = self.make_store(engine if engine is not None else self.engine())
        self._opened.append(store)
        return store

    def append(self, engine: Engine, n: int = 1, size: int = 1, sid: str = SID) -> Head:
        """`n` batches of `size` lines each, appended to the session's head."""
        head = engine.head(sid)
        for _ in range(n):
            head = engine.append(sid, _batch(head, size), head)
        return head

    # -- appends and expected heads ------------------------------------------------------

    def test_an_unknown_session_is_empty(self) -> None:
        engine = self.engine()
        got = engine.read(SID, None)
        assert (bytes(got.data), got.head, got.reset) == (b"", EMPTY_HEAD, False)
        assert engine.head(SID) == EMPTY_HEAD
        assert engine.list_sessions() == []
        with engine.history(SID) as hist:
            assert hist.segments == [] and hist.live is None
        assert engine.remove_session(SID) is False

    def test_appends_read_back_in_order_with_chained_heads(self) -> None:
        engine = self.engine()
        batches = []
        head = EMPTY_HEAD
        for size in (1, 3, 2):
            batch = _batch(head, size)
            new = engine.append(SID, batch, head)
            assert (new.seq, new.link, new.h) == (batch.last_seq, batch.link, batch.hashes[-1])
            assert new.size == head.size + len(batch.data) and new.base_seq == 1
            batches.append(batch)
            head = new
        got = engine.read(SID, None)
        assert bytes(got.data) == b"".join(b.data for b in batches)
        assert got.head == head == engine.head(SID) and not got.reset
        assert _seqs(got.data) == list(range(1, 7))
        assert [h.more for h in _heads(got.data)] == [0, 2, 1, 0, 1, 0]

    def test_a_read_from_a_position_returns_what_follows_it(self) -> None:
        engine = self.engine()
        first = self.append(engine, 2, 2)
        after = engine.read(SID, None).head
        assert after == first
        last = self.append(engine, 1, 3)
        got = engine.read(SID, first.position)
        assert not got.reset and got.offset == first.size
        assert _seqs(got.data) == [5, 6, 7] and got.head == last
        again = engine.read(SID, got.head.position)
        assert (bytes(again.data), again.head, again.reset) == (b"", last, False)

    def test_a_batch_is_written_as_one_unit(self) -> None:
        engine = self.engine()
        head = self.append(engine, 1, 2)
        batch = _batch(head, 4)
        new = engine.append(SID, batch, head)
        assert new.seq == 6
        assert bytes(engine.read(SID, head.position).data) == batch.data
        assert batch.lines() == bytes(engine.read(SID, head.position).data).split(b"\n")[:-1]

    def test_a_stale_expected_head_is_refused_and_nothing_is_written(self) -> None:
        engine = self.engine()
        stale = self.append(engine, 2)
        moved = self.append(engine, 1)
        before = bytes(engine.read(SID, None).data)
        try:
            engine.append(SID, _batch(stale), stale)
        except HeadMovedError as exc:
            assert exc.actual.seq == moved.seq and exc.actual.link == moved.link
        else:
            raise AssertionError("an append to a moved head was not refused")
        assert bytes(engine.read(SID, None).data) == before
        try:  # the first append of a session expects the empty head
            engine.append(SID, _batch(EMPTY_HEAD), EMPTY_HEAD)
        except HeadMovedError:
            pass
        else:
            raise AssertionError("an append expecting an empty session was not refused")
        assert engine.append("other", _batch(EMPTY_HEAD), EMPTY_HEAD).seq == 1

    def test_threads_appending_at_once_each_land_once_in_one_chain(self) -> None:
        engine = self.engine()
        errors: list[BaseException] = []

        def write(k: int) -> None:
            try:
                for _ in range(15):
                    while True:
                        head = engine.head(SID)
                        try:
                            engine.append(SID, _batch(head, 2, tag=f"w{k}"), head)
                            break
                        except HeadMovedError:
                            continue
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        heads = _heads(engine.read(SID, None).data)
        assert [h.seq for h in heads] == list(range(1, 121))
        _assert_chained(bytes(engine.read(SID, None).data))

    def test_read_some_returns_whole_batches_in_pieces(self) -> None:
        engine = self.engine()
        for size in (1, 5, 2, 7, 1, 3):
            self.append(engine, 3, size)
        whole = bytes(engine.read(SID, None).data)
        pieces, position, more = [], None, True
        while more:
            got, more = engine.read_some(SID, position, 200)
            piece = bytes(got.data)
            assert piece.endswith(b"\n") and _heads(piece)[-1].more == 0
            pieces.append(piece)
            position = got.head.position
        assert b"".join(pieces) == whole
        assert engine.read(SID, position).head == engine.head(SID)

    def test_a_removed_or_replaced_log_resets_a_reader(self) -> None:
        engine = self.engine()
        head = self.append(engine, 3)
        engine.remove_session(SID)
        got = engine.read(SID, head.position)
        assert got.reset and bytes(got.data) == b"" and got.head == EMPTY_HEAD
        assert engine.append(SID, _batch(EMPTY_HEAD), EMPTY_HEAD).seq == 1

    # -- snapshots -----------------------------------------------------------------------

    def test_a_snapshot_install_keeps_the_head_and_resets_readers(self) -> None:
        engine = self.engine()
        covers = self.append(engine, 3, 2)
        old = bytes(engine.read(SID, None).data)
        line = _snapshot_line(covers)
        done = engine.install_snapshot(SID, line, covers, keep_history=True)
        assert (done.head.seq, done.head.link) == (covers.seq, covers.link)
        assert (done.head.base_seq, done.head.size) == (covers.seq, len(line))
        assert (done.before, done.after) == (len(old), len(line))
        assert isinstance(done.archived, str) and done.archived
        got = engine.read(SID, covers.position)
        assert got.reset and bytes(got.data) == line and got.head == done.head
        assert engine.head(SID) == done.head
        with engine.history(SID) as hist:
            assert [s.archived for s in hist] == [True, False]
            assert hist.segments[0].read() == old
            assert hist.live is not None and hist.live.read() == line
        # an append encoded against the head before the install chains on after it
        assert engine.append(SID, _batch(covers), covers).seq == covers.seq + 1

    def test_a_snapshot_install_without_history_keeps_none(self) -> None:
        engine = self.engine()
        covers = self.append(engine, 4)
        line = _snapshot_line(covers)
        done = engine.install_snapshot(SID, line, covers, keep_history=False)
        assert done.archived is None
        with engine.history(SID) as hist:
            assert [s.archived for s in hist] == [False]
            assert hist.segments[0].read() == line

    def test_lines_appended_after_what_a_snapshot_covers_stay_live(self) -> None:
        engine = self.engine()
        covers = self.append(engine, 3)
        head = self.append(engine, 2, 2)
        later = bytes(engine.read(SID, covers.position).data)
        line = _snapshot_line(covers)
        done = engine.install_snapshot(SID, line, covers, keep_history=True)
        assert (done.head.seq, done.head.link, done.head.h) == (head.seq, head.link, head.h)
        assert bytes(engine.read(SID, None).data) == line + later
        with engine.history(SID) as hist:
            seen = [seq for seg in hist for seq in _seqs(seg.read())]
        assert set(seen) >= set(range(1, head.seq + 1))
        assert engine.append(SID, _batch(done.head), done.head).seq == head.seq + 1

    def test_a_snapshot_of_a_point_no_longer_in_the_live_log_is_refused(self) -> None:
        engine = self.engine()
        covers = self.append(engine, 3)
        engine.install_snapshot(SID, _snapshot_line(covers), covers, keep_history=False)
        after = bytes(engine.read(SID, None).data)
        try:
            engine.install_snapshot(SID, _snapshot_line(covers), covers, keep_history=True)
        except HeadMovedError:
            pass
        else:
            raise AssertionError("a snapshot of a replaced log was installed")
        assert bytes(engine.read(SID, None).data) == after
        engine.remove_session(SID)
        try:
            engine.install_snapshot(SID, _snapshot_line(covers), covers, keep_history=True)
        except HeadMovedError:
            pass
        else:
            raise AssertionError("a snapshot of a removed session was installed")
        assert engine.list_sessions() == []

    def test_history_across_snapshots_holds_every_line(self) -> None:
        engine = self.engine()
        for _ in range(3):
            covers = self.append(engine, 2, 2)
            engine.install_snapshot(SID, _snapshot_line(covers), covers, keep_history=True)
        self.append(engine, 1)
        with engine.history(SID) as hist:
            assert [s.archived for s in hist] == [True, True, True, False]
            held: set[int] = set()
            for seg in hist:
                data = seg.read()
                assert seg.size == len(data)
                events = [h.seq for h in _heads(data) if h.type != "snapshot"]
                if seg.archived and seg.first_seq is not None:
                    assert seg.first_seq <= min(_seqs(data))
                    assert seg.last_seq == max(_seqs(data))
                held.update(events)
        assert held == set(range(1, 14))

    def test_history_is_one_picture_beside_installs(self) -> None:
        engine = self.engine()
        self.append(engine, 2)
        stop = threading.Event()
        errors: list[BaseException] = []

        def churn() -> None:
            try:
                while not stop.is_set():
                    head = self.append(engine, 1)
                    engine.install_snapshot(SID, _snapshot_line(head), head, keep_history=True)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        t = threading.Thread(target=churn)
        t.start()
        try:
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                with engine.history(SID) as hist:
                    seqs = {
                        h.seq for seg in hist for h in _heads(seg.read()) if h.type != "snapshot"
                    }
                    live = hist.live
                    assert live is not None
                    top = _heads(live.read())[-1].seq
                assert seqs == set(range(1, top + 1)), "a segment missing from the picture"
        finally:
            stop.set()
            t.join()
        assert errors == []

    # -- waiting, sessions ---------------------------------------------------------------

    def test_wait_wakes_on_an_append_and_times_out_without_one(self) -> None:
        engine = self.engine()
        head = self.append(engine, 1)
        assert engine.wait(SID, head.position, 0.05) is False
        timer = threading.Timer(0.05, lambda: self.append(engine, 1))
        timer.start()
        try:
            assert engine.wait(SID, head.position, self.timeout) is True
        finally:
            timer.join()

    def test_sessions_are_listed_by_id_and_removed_with_all_they_keep(self) -> None:
        engine = self.engine()
        for sid in ("b", "a", "ünï/cødé", ".dot"):
            self.append(engine, 2, sid=sid)
        covers = engine.head("a")
        engine.install_snapshot("a", _snapshot_line(covers), covers, keep_history=True)
        assert engine.list_sessions() == sorted(["b", "a", "ünï/cødé", ".dot"])
        assert engine.remove_session("a") is True
        assert engine.remove_session("a") is False
        assert engine.list_sessions() == sorted(["b", "ünï/cødé", ".dot"])
        with engine.history("a") as hist:
            assert hist.segments == []
        assert engine.head("a") == EMPTY_HEAD
        assert engine.append("a", _batch(EMPTY_HEAD), EMPTY_HEAD).seq == 1

    def test_a_child_forked_while_a_thread_appends_can_use_the_engine(self) -> None:
        if not hasattr(os, "fork"):
            _skip("no fork on this platform")
        engine = self.engine()
        self.append(engine, 1)
        stop = threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                head = engine.head(SID)
                try:
                    engine.append(SID, _batch(head, 3, tag="parent"), head)
                except HeadMovedError:
                    pass

        t = threading.Thread(target=hammer)
        t.start()
        try:
            for _ in range(5):
                # locks another thread held at the fork must not be inherited held
                code = in_forked_child(lambda: self.append(engine, 1, sid="child"), 30.0)
                assert code is not None, "the forked child hung on a lock held at the fork"
                assert code == 0, "the forked child failed to append"
        finally:
            stop.set()
            t.join()
        _assert_chained(bytes(engine.read(SID, None).data))

    # -- the repair hold -----------------------------------------------------------------

    def test_keep_prefix_replaces_the_live_log_by_a_prefix_and_saves_it(self) -> None:
        engine = self.engine()
        first = self.append(engine, 2, 2)
        self.append(engine, 1, 3)
        whole = bytes(engine.read(SID, None).data)
        with engine.hold(SID) as hold:
            assert hold.data == whole and hold.where
            assert hold.keep_prefix(len(whole), "test") is None
            saved = hold.keep_prefix(first.size, "test")
            assert isinstance(saved, str) and "test" in saved
        got = engine.read(SID, None)
        assert bytes(got.data) == whole[: first.size]
        assert (got.head.seq, got.head.link) == (first.seq, first.link)
        assert engine.append(SID, _batch(got.head), got.head).seq == first.seq + 1

    def test_rewrite_replaces_the_live_log_and_saves_the_original(self) -> None:
        engine = self.engine()
        first = self.append(engine, 1, 2)
        self.append(engine, 2)
        kept = bytes(engine.read(SID, None).data)[: first.size]
        with engine.hold(SID) as hold:
            saved = hold.rewrite(kept, "test")
            assert isinstance(saved, str) and "test" in saved
        got = engine.read(SID, first.position)
        assert got.reset and bytes(got.data) == kept
        assert (got.head.seq, got.head.link) == (first.seq, first.link)
        assert engine.append(SID, _batch(got.head), got.head).seq == first.seq + 1

    def test_a_hold_excludes_writers(self) -> None:
        engine = self.engine()
        self.append(engine, 1)
        landed = threading.Event()

        def write() -> None:
            self.append(engine, 1)
            landed.set()

        with engine.hold(SID) as hold:
            t = threading.Thread(target=write)
            t.start()
            assert not landed.wait(0.2), "an append landed while a repair held the session"
            assert _seqs(hold.data) == [1]
        t.join(self.timeout)
        assert landed.is_set() and engine.head(SID).seq == 2

    # -- capabilities --------------------------------------------------------------------

    def caching(self) -> CachingEngine:
        """A fresh engine, if it keeps caches (else the test skips)."""
        engine = self.engine()
        if not isinstance(engine, CachingEngine):
            _skip(f"{type(engine).__name__} keeps no caches (not a CachingEngine)")
        return engine

    def test_caches_round_trip_while_their_head_is_in_the_live_log(self) -> None:
        engine = self.caching()
        assert engine.load_cache(SID, "fold") is None
        engine.store_cache(SID, "fold", EMPTY_HEAD, [b"nothing"])
        assert engine.load_cache(SID, "fold") is None  # no log: nothing kept
        head = self.append(engine, 2, 2)
        engine.store_cache(SID, "fold", head, [b"abc", b"def\n"])
        engine.store_cache(SID, "other name", head, [b"x"])
        found = engine.load_cache(SID, "fold")
        assert found is not None and found[1] == b"abcdef\n"
        assert (found[0].seq, found[0].link, found[0].h) == (head.seq, head.link, head.h)
        assert found[0].position == head.position
        opened = engine.open_cache(SID, "fold")
        assert opened is not None
        with opened[1] as reader:
            assert reader.size == 7
            assert reader.read(4) + reader.read(100) == b"abcdef\n"
        assert engine.load_cache(SID, "other name") == (found[0], b"x")
        self.append(engine, 1)  # the head stays a point of the live log
        again = engine.load_cache(SID, "fold")
        assert again is not None and again[1] == b"abcdef\n" and again[0].seq == head.seq

    def test_a_read_from_an_opened_cache_sees_every_append_before_it(self) -> None:
        engine = self.caching()
        head = self.append(engine, 2)
        engine.store_cache(SID, "fold", head, [b"state"])
        later = self.append(engine, 2)  # after the cache was kept, before it is opened
        for appended in (0, 1, 2):  # appends between the open and the read
            opened = engine.open_cache(SID, "fold")
            assert opened is not None
            opened[1].close()
            later = self.append(engine, appended) if appended else later
            got = engine.read(SID, opened[0].position)
            assert got.head == later and not got.reset
            assert _seqs(got.data) == list(range(head.seq + 1, later.seq + 1))
        other = self.append(engine, 1, sid="other")
        opened = engine.open_cache(SID, "fold")  # a read of another session between
        assert opened is not None and engine.read("other", None).head == other
        assert _seqs(engine.read(SID, opened[0].position).data)[-1] == later.seq

    def test_a_caches_read_on_is_the_read_from_its_head(self) -> None:
        engine = self.caching()
        head = self.append(engine, 2)
        engine.store_cache(SID, "fold", head, [b"state"])
        later = self.append(engine, 3, 2)
        opened = engine.open_cache(SID, "fold")
        assert opened is not None
        with opened[1] as reader:
            got = reader.read_on  # None: the engine does not read on with the cache
        want = engine.read(SID, opened[0].position)
        assert want.head == later and _seqs(want.data) == list(range(head.seq + 1, later.seq + 1))
        if got is not None:
            assert (bytes(got.data), got.head, got.reset) == (bytes(want.data), want.head, False)
            assert (got.where, got.offset) == (want.where, want.offset)

    def test_a_cold_start_is_the_cache_else_the_mark_and_the_read_from_the_start(self) -> None:
        engine = self.caching()
        for name in ("fold", None):  # no session yet: nothing, and the read of nothing
            cold = engine.open_cold(SID, name, "mark")
            assert (cold.cache, cold.mark) == (None, None)
            self._same_read(engine, cold.read_on, None)
        head = self.append(engine, 3, 2)
        engine.store_cache(SID, "mark", head, [b"prefix"])
        later = self.append(engine, 2)
        for name in ("fold", None):  # no cache: the mark, and the log from its start
            cold = engine.open_cold(SID, name, "mark")
            assert cold.cache is None and cold.mark == engine.load_cache(SID, "mark")
            assert cold.mark is not None and cold.mark[1] == b"prefix"
            self._same_read(engine, cold.read_on, None)
            assert engine.open_cold(SID, name, None).mark is None  # not asked for
        engine.store_cache(SID, "fold", later, [b"state"])
        last = self.append(engine, 1)
        cold = engine.open_cold(SID, "fold", "mark")  # a cache: it alone, read on from it
        assert cold.cache is not None and cold.mark is None and cold.read_on is None
        with cold.cache[1] as reader:
            assert reader.read(reader.size) == b"state" and cold.cache[0] == later
            self._same_read(engine, reader.read_on, later)
        assert engine.read(SID, later.position).head == last

    def _same_read(self, engine: Engine, got: ReadResult | None, at: Head | None) -> None:
        """`got`, if the engine read it, is what a read from `at` gives now."""
        if got is None:
            return
        want = engine.read(SID, None if at is None else at.position)
        assert (bytes(got.data), got.head, got.reset) == (bytes(want.data), want.head, False)
        assert (got.where, got.offset) == (want.where, want.offset)

    def test_a_later_read_from_an_opened_caches_head_sees_appends_since(self) -> None:
        engine = self.caching()
        head = self.append(engine, 2)
        engine.store_cache(SID, "fold", head, [b"state"])
        opened = engine.open_cache(SID, "fold")  # no read from it (as when it does not check)
        assert opened is not None and opened[0].position == head.position
        opened[1].close()
        writer = threading.Thread(target=lambda: self.append(engine, 1))
        writer.start()
        writer.join()
        got = engine.read(SID, head.position)  # the same point, reached by another read
        assert _seqs(got.data) == [head.seq + 1]

    def test_a_cache_at_the_opening_snapshot_opens_as_any_other(self) -> None:
        """A cache kept at the head a snapshot opened the live log with (its head checked
        against the snapshot's line) opens with its bytes, and reads on from there."""
        engine = self.caching()
        covers = self.append(engine, 3)
        engine.install_snapshot(SID, _snapshot_line(covers), covers, keep_history=True)
        head = engine.head(SID)
        engine.store_cache(SID, "fold", head, [b"state"])
        later = head
        for appended in (0, 2):
            later = self.append(engine, appended) if appended else later
            opened = engine.open_cache(SID, "fold")
            assert opened is not None and opened[0] == head
            with opened[1] as reader:
                assert reader.read(reader.size) == b"state"
                self._same_read(engine, reader.read_on, head)
            got = engine.read(SID, head.position)
            assert got.head == later and _seqs(got.data) == list(range(head.seq + 1, later.seq + 1))

    def test_caches_are_dropped_when_their_head_leaves_the_live_log(self) -> None:
        engine = self.caching()
        head = self.append(engine, 3)
        engine.store_cache(SID, "fold", head, [b"state"])
        engine.install_snapshot(SID, _snapshot_line(head), head, keep_history=True)
        assert engine.load_cache(SID, "fold") is None  # the log it was folded from is gone
        head = engine.head(SID)
        engine.store_cache(SID, "fold", head, [b"state"])
        with engine.hold(SID) as hold:
            hold.rewrite(hold.data, "test")
        assert engine.load_cache(SID, "fold") is None  # a repair replaced the log
        head = engine.head(SID)
        engine.store_cache(SID, "fold", head, [b"state"])
        assert engine.load_cache(SID, "fold") is not None
        engine.remove_session(SID)
        assert engine.load_cache(SID, "fold") is None
        self.append(engine, 3)  # the same seq again, another log
        assert engine.load_cache(SID, "fold") is None

    def test_cache_parts_past_a_start_are_removed_and_nothing_else(self) -> None:
        engine = self.caching()
        if not engine.keeps_cache_parts:
            _skip(f"{type(engine).__name__} keeps no cache parts (keeps_cache_parts)")
        head = self.append(engine, 2)
        names = ["fold", "fold#0", "fold#1", "fold#12", "fold#x", "fold#", "fold_a#3", "fol#3"]
        for name in names:
            engine.store_cache(SID, name, head, [name.encode()])
        engine.remove_cache_parts(SID, "fold", 1)
        kept = [n for n in names if engine.load_cache(SID, n) is not None]
        assert kept == ["fold", "fold#0", "fold#x", "fold#", "fold_a#3", "fol#3"]
        engine.remove_cache_parts(SID, "fold", 0)
        engine.remove_cache_parts("no such session", "fold", 0)  # nothing to remove
        assert engine.load_cache(SID, "fold#0") is None
        found = engine.load_cache(SID, "fold")
        assert found is not None and found[1] == b"fold"

    def test_cache_parts_open_in_order_each_at_its_head(self) -> None:
        engine = self.caching()
        if not engine.keeps_cache_parts:
            _skip(f"{type(engine).__name__} keeps no cache parts (keeps_cache_parts)")
        assert list(engine.open_cache_parts(SID, "fold", 2)) == [None, None]  # no log
        first = self.append(engine, 2)
        engine.store_cache(SID, "fold#0", first, [b"part", b" 0"])
        second = self.append(engine, 3)
        for name in ("fold#1", "fold#3", "fold", "fold_a#2", "fol#2"):
            engine.store_cache(SID, name, second, [name.encode()])
        self.append(engine, 1)  # their heads stay points of the live log
        got: list[tuple[int, str, str, bytes] | None] = []
        for found in engine.open_cache_parts(SID, "fold", 5):
            if found is None:
                got.append(None)
                continue
            head, reader = found
            with reader:
                assert reader.size == len(data := reader.read(reader.size))
            got.append((head.seq, head.link, head.h, data))
        at = [(h.seq, h.link, h.h) for h in (first, second)]
        assert got == [(*at[0], b"part 0"), (*at[1], b"fold#1"), None, (*at[1], b"fold#3"), None]
        assert list(engine.open_cache_parts(SID, "fold", 0)) == []
        assert list(engine.open_cache_parts("no such session", "fold", 2)) == [None, None]
        parts = engine.open_cache_parts(SID, "fold", 4)  # a caller may stop early
        found = next(parts)
        assert found is not None
        found[1].close()
        engine.remove_cache_parts(SID, "fold", 1)
        assert [p is None for p in engine.open_cache_parts(SID, "fold", 2)] == [False, True]

    def test_ranged_reads_see_one_picture_of_the_live_log(self) -> None:
        engine = self.engine()
        if not isinstance(engine, RangedEngine):
            _skip(f"{type(engine).__name__} reads whole logs only (not a RangedEngine)")
        with engine.live_view(SID) as view:
            assert view.head == EMPTY_HEAD
        head = self.append(engine, 3, 2)
        whole = bytes(engine.read(SID, None).data)
        with engine.live_view(SID) as view:
            assert view.head == head and view.head.size == len(whole) and view.where
            assert view.read_span(0, view.head.size) == whole
            assert view.read_span(5, 17) == whole[5:17]
            covers = self.append(engine, 1)  # after the view was taken
            engine.install_snapshot(SID, _snapshot_line(covers), covers, keep_history=False)
            assert view.read_span(0, view.head.size) == whole  # still the same picture
        with engine.live_view(SID) as view:
            assert view.head == engine.head(SID)
            assert view.read_span(0, view.head.size) == bytes(engine.read(SID, None).data)

    def test_lines_by_seq_are_the_live_logs_with_the_end_of_the_line_before(self) -> None:
        engine = self.engine()
        if not isinstance(engine, SeqEngine):
            _skip(f"{type(engine).__name__} reads no line by its seq (not a SeqEngine)")
        assert engine.lines_at(SID, [1]) == {} and engine.where(SID)
        self.append(engine, 3, 2)
        whole = bytes(engine.read(SID, None).data)
        starts = [0] + [i + 1 for i, b in enumerate(whole) if b == 10]
        got = engine.lines_at(SID, [6, 1, 4, 9, 0])  # any order; 9 and 0 are not lines
        assert sorted(got) == [1, 4, 6]
        for seq, found in got.items():
            at, end = starts[seq - 1], starts[seq] - 1
            assert (found.line, found.offset) == (whole[at:end], at)
            assert found.before == whole[max(0, at - 25) : at]
        covers = self.append(engine, 1)
        engine.install_snapshot(SID, _snapshot_line(covers), covers, keep_history=True)
        assert engine.lines_at(SID, [2, covers.seq]) == {}  # archived: not the live log
        later = self.append(engine, 1, 2)
        after = engine.lines_at(SID, [later.seq - 1, later.seq])
        assert list(after) == [later.seq]  # the first after the snapshot has no line before
        live = bytes(engine.read(SID, None).data)
        found = after[later.seq]
        assert live[found.offset :] == found.line + b"\n"  # at its offset in the live log

    def test_a_line_after_one_too_short_to_end_a_line_is_never_read_as_a_first(
        self,
    ) -> None:
        """Attack: a live log rewritten from outside to a line too short to end with an
        `h`, then a line chained to "" as a log's first is (`tail`'s answer: what a cold
        write judges the session on): the second line's `before` came back b"", the
        end of nothing, and a reader of lines by seq checked it against "" and took it
        (a fold refuses the log). `before` is the bytes before the line, or it is left
        out."""
        engine = self.engine()
        if not isinstance(engine, SeqEngine):
            _skip(f"{type(engine).__name__} reads no line by its seq (not a SeqEngine)")
        self.append(engine, 2, 2)
        event = ProgressAppended(entry=ProgressEntry(run_id="forged", summary="forged"))
        forged, _, _ = _codec.encode_batch([event], 2, "", datetime.now(UTC), None)
        corrupt(engine, SID, lambda _: b"x\n" + forged)
        whole = bytes(engine.read(SID, None).data)
        head, tail = engine.tail(SID, 2)
        assert head.seq == 2
        for found in (*tail.values(), *engine.lines_at(SID, [1, 2]).values()):
            at = found.offset
            assert whole[at:].startswith(found.line + b"\n")
            assert found.before == whole[max(0, at - 25) : at], found

    def test_a_tail_is_the_head_with_its_newest_lines_by_seq(self) -> None:
        engine = self.engine()
        if not isinstance(engine, SeqEngine):
            _skip(f"{type(engine).__name__} reads no line by its seq (not a SeqEngine)")
        assert engine.tail(SID, 4) == (EMPTY_HEAD, {})
        self.append(engine, 3, 2)
        for count in (1, 4, 6, 50):
            head, lines = engine.tail(SID, count)
            newest = range(max(1, head.seq - count + 1), head.seq + 1)
            assert head == engine.head(SID) and lines == engine.lines_at(SID, newest)
            assert sorted(lines) == list(newest)
        covers = self.append(engine, 1)
        engine.install_snapshot(SID, _snapshot_line(covers), covers, keep_history=True)
        later = self.append(engine, 2)  # the first after the snapshot has no line before
        head, lines = engine.tail(SID, 10)
        assert head == engine.head(SID) == later and list(lines) == [later.seq]

    def test_pruning_removes_only_segments_wholly_before_a_seq(self) -> None:
        engine = self.engine()
        if not isinstance(engine, PruningEngine):
            _skip(f"{type(engine).__name__} cannot prune history (not a PruningEngine)")
        assert engine.prune_history(SID, 100) == []
        bounds = []
        for _ in range(3):
            covers = self.append(engine, 2)
            engine.install_snapshot(SID, _snapshot_line(covers), covers, keep_history=True)
            bounds.append(covers.seq)
        live = bytes(engine.read(SID, None).data)
        gone = engine.prune_history(SID, bounds[1])  # the first segment ends before it
        assert [(g.first_seq, g.last_seq) for g in gone] == [(1, bounds[0])]
        assert all(g.where and g.size > 0 for g in gone)
        with engine.history(SID) as hist:
            assert [s.archived for s in hist] == [True, True, False]
            assert min(_seqs(hist.segments[0].read())) > bounds[0] - 1
        assert bytes(engine.read(SID, None).data) == live  # the live log is never touched
        assert engine.prune_history(SID, bounds[1]) == []

    def test_the_feed_gives_every_sessions_lines_in_one_order(self) -> None:
        engine = self.engine()
        if not isinstance(engine, FeedEngine):
            _skip(f"{type(engine).__name__} keeps no global feed (not a FeedEngine)")
        self.append(engine, 2, sid="a")
        self.append(engine, 1, 2, sid="b")
        self.append(engine, 1, sid="a")
        entries = _feed_until(engine, None, 5, self.timeout)
        assert [(e.session_id, e.seq) for e in entries] == [
            ("a", 1), ("a", 2), ("b", 1), ("b", 2), ("a", 3),
        ]  # fmt: skip
        lines = {sid: bytes(engine.read(sid, None).data).split(b"\n")[:-1] for sid in ("a", "b")}
        for e in entries:
            assert e.line.rstrip(b"\n") == lines[e.session_id][e.seq - 1]
        self.append(engine, 1, sid="b")
        later = _feed_until(engine, entries[-1].position, 1, self.timeout)
        assert [(e.session_id, e.seq) for e in later] == [("b", 3)]
        assert [e.seq for e in engine.feed(entries[1].position, limit=2)] == [1, 2]

    def test_key_slots_are_replaced_only_when_they_hold_the_expected_bytes(self) -> None:
        engine = self.engine()
        if not isinstance(engine, KeyEngine):
            _skip(f"{type(engine).__name__} keeps no key slots (not a KeyEngine)")
        dk, live, forgotten, rewrapped = "0123456789abcdef0123", b"live", b"gone", b"new"
        assert not engine.replace_key_slot(dk, rewrapped, live)  # no slot: none is made
        assert engine.load_key_slot(dk) is None
        assert engine.create_key_slot(dk, live)
        assert engine.replace_key_slot(dk, forgotten)  # (no `expected`: always replaced)
        assert not engine.replace_key_slot(dk, rewrapped, live)  # stale: nothing changes
        assert engine.load_key_slot(dk) == forgotten
        assert engine.replace_key_slot(dk, rewrapped, forgotten)
        assert engine.load_key_slot(dk) == rewrapped and engine.list_key_slots() == [dk]

    def test_the_index_follows_appends_installs_repairs_and_removals(self) -> None:
        engine = self.engine()
        if not isinstance(engine, IndexingEngine):
            _skip(f"{type(engine).__name__} keeps no session index (not an IndexingEngine)")

        def entries(**kw: Any) -> dict[str, IndexEntry]:
            return {
                e.session_id: e for e in engine.index_page(order="id", after=None, limit=None, **kw)
            }

        assert entries() == {}
        self.append(engine, 2, sid="a")
        head = engine.head("b")
        batch = msgspec.structs.replace(_batch(head), ts_us=1_000_000, labels={"k": "v"})
        engine.append("b", batch, head)
        self.append(engine, 1, 3, sid="b")
        a, b = entries()["a"], entries()["b"]
        assert (a.last_seq, a.events, a.bytes, a.labels) == (2, 2, engine.head("a").size, {})
        assert (b.created_us, b.last_seq, b.events, b.labels) == (1_000_000, 4, 4, {"k": "v"})
        assert b.updated_us > b.created_us  # the second batch carried no time: the engine's
        assert list(entries(labels={"k": "v"})) == ["b"]
        assert list(entries(prefix="a")) == ["a"]
        covers = engine.head("b")
        engine.install_snapshot("b", _snapshot_line(covers), covers, keep_history=True)
        moved = entries()["b"]
        assert (moved.last_seq, moved.events, moved.bytes) == (4, 1, engine.head("b").size)
        assert (moved.created_us, moved.updated_us, moved.labels) == (
            b.created_us, b.updated_us, b.labels,
        )  # fmt: skip
        corrupt(engine, "a", lambda data: data.split(b"\n", 1)[0] + b"\n")
        assert (entries()["a"].last_seq, entries()["a"].events) == (1, 1)
        assert engine.remove_session("a") is True
        assert list(entries()) == ["b"]
        # pages: keyset after the last entry, newest first for times
        for i in range(5):
            self.append(engine, 1, sid=f"p{i}")
        newest = engine.index_page(order="updated", after=None, limit=None)
        assert [e.updated_us for e in newest] == sorted(
            (e.updated_us for e in newest), reverse=True
        )
        first = engine.index_page(order="updated", after=None, limit=2)
        rest = engine.index_page(order="updated", after=first[-1], limit=None)
        assert first + rest == newest
        # a rebuild's entries replace older ones (not newer ones: a higher last_seq)
        engine.replace_index([msgspec.structs.replace(moved, labels={"r": "1"})], 2**62)
        assert entries()["b"].labels == {"r": "1"}
        engine.replace_index([msgspec.structs.replace(moved, last_seq=1, labels={})], 2**62)
        assert entries()["b"].labels == {"r": "1"}

    def test_sessions_pages_agree_with_the_logs(self) -> None:
        store = self.store()
        for i in range(6):
            store.append_progress_entry(f"s{i}", ProgressEntry(f"r{i}", "step"))
        store.set_labels("s2", {"team": "red"})
        store.append_progress_entry("s0", ProgressEntry("r", "again"))
        store.compact("s0", force=True)
        assert sorted(i.session_id for i in store.sessions()) == store.list_sessions()
        assert store.list_sessions("s1") == ["s1"]
        infos = store.sessions()
        assert infos[0].session_id == "s0"  # the newest write (compaction is not one)
        assert [i.updated for i in infos] == sorted((i.updated for i in infos), reverse=True)
        assert all(i.created <= i.updated for i in infos)
        by_id = {i.session_id: i for i in infos}
        assert by_id["s0"].last_seq == 2 and by_id["s0"].events == 1
        assert by_id["s2"].labels == {"team": "red"} and by_id["s1"].labels == {}
        assert [i.session_id for i in store.sessions(labels={"team": "red"})] == ["s2"]
        walked: list[str] = []
        after = None
        while page := store.sessions(limit=2, after=after, order="id"):
            walked += [i.session_id for i in page]
            after = page[-1]
        assert walked == store.list_sessions()
        assert store.delete_session("s3") is True  # a tombstone: listed as deleted
        assert [i.deleted for i in store.sessions("s3")] == [True]
        assert store.delete_session("s4", purge=True) is True  # no trace: not listed
        assert "s4" not in [i.session_id for i in store.sessions()]
        # (a tombstone's log no longer holds the times its index entry kept: left out)
        before = {i.session_id: i for i in store.sessions() if not i.deleted}
        indexed = isinstance(store.engine, IndexingEngine)
        assert store.rebuild_index() == (len(before) + 1 if indexed else 0)
        after_rebuild = {i.session_id: i for i in store.sessions() if not i.deleted}
        assert after_rebuild == before  # the logs say what the index kept

    # -- what users see (through the session API) ---------------------------------------

    def test_a_session_initializes_once_however_many_stores_race(self) -> None:
        from eventstore import FeatureRecord, SessionManifest

        engine = self.engine()
        stores = [self.store(engine) for _ in range(4)]
        results: list[bool] = []
        barrier = threading.Barrier(len(stores))
        manifest = SessionManifest(SID, "main", "conformance")
        features = [FeatureRecord("f1", "c", "d", [], False)]

        def run(s: SessionStore) -> None:
            barrier.wait()
            results.append(s.initialize_session_if_missing(SID, manifest, features))

        threads = [threading.Thread(target=run, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [False, False, False, True]
        assert stores[0].load_bootstrap_state(SID).manifest == manifest

    def test_a_compacted_session_reads_and_verifies_the_same(self) -> None:
        store = self.store()
        for i in range(12):
            store.append_progress_entry(SID, ProgressEntry(f"r{i}", f"step {i}"))
            if i % 5 == 4:
                store.compact(SID, force=True)
        state = store.load_bootstrap_state(SID)
        assert [e.summary for e in state.recent_progress] == [f"step {i}" for i in range(12)]
        assert [e.seq for e in store.read_events(SID)] == list(range(1, 13))
        report = store.verify(SID)
        assert report.ok, report.problems

    def test_an_edited_line_is_found_by_verify_and_refused_by_loads(self) -> None:
        from eventstore import CorruptLogError

        engine = self.engine()
        store = self.store(engine)
        for i in range(5):
            store.append_progress_entry(SID, ProgressEntry(f"r{i}", f"step {i}"))
        corrupt(engine, SID, lambda b: b.replace(b"step 3", b"step X", 1))
        fresh = self.store(engine)
        assert not fresh.verify(SID).ok
        try:
            fresh.load_bootstrap_state(SID)
        except CorruptLogError as exc:
            assert exc.seq == 4
        else:
            raise AssertionError("a load returned an edited line")

    def test_repair_rebuilds_a_damaged_snapshot_from_the_archive(self) -> None:
        from eventstore.ops.repair import repair

        engine = self.engine()
        store = self.store(engine)
        for i in range(6):
            store.append_progress_entry(SID, ProgressEntry(f"r{i}", f"step {i}"))
        store.compact(SID, force=True)
        store.append_progress_entry(SID, ProgressEntry("r6", "step 6"))
        corrupt(engine, SID, lambda b: b.replace(b'"step 2"', b'"step X"', 1))
        fresh = self.store(engine)
        assert not fresh.verify(SID).ok
        report = repair(fresh, SID)
        assert report.action == "rebuilt" and report.moved_to, report.message
        state = fresh.load_bootstrap_state(SID)
        assert [e.summary for e in state.recent_progress] == [f"step {i}" for i in range(7)]
        assert fresh.verify(SID).ok
        fresh.append_progress_entry(SID, ProgressEntry("r7", "step 7"))
        assert [e.seq for e in fresh.read_events(SID)] == list(range(1, 9))


def _assert_chained(data: bytes) -> None:
    """Every line's hash links it to the line before (what verify checks, in short)."""
    link = ""
    for head, line in zip(_heads(data), data.split(b"\n")[:-1], strict=True):
        assert hash_checks(link.encode(), line, head.h), f"seq {head.seq} does not chain"
        link = head.h


def wait_child(pid: int, seconds: float) -> int | None:
    """The exit code of forked child `pid`, or None if it had not ended after `seconds`
    (it is then killed): a hung child fails its test instead of hanging the suite."""
    deadline = time.monotonic() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.01)


def in_forked_child(work: Callable[[], object], seconds: float) -> int | None:
    """Fork; the child runs `work` (no test machinery) and exits 0 when it returns
    anything but False, 2 when it returns False, 1 when it raises; the parent returns
    that exit code, or None if the child had not ended after `seconds` (`wait_child`).
    For an engine's own fork tests, beside the suite's."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            code = 2 if work() is False else 0
        finally:
            os._exit(code)
    return wait_child(pid, seconds)


def _feed_until(engine: FeedEngine, after: Any, n: int, timeout: float) -> list[Any]:
    """The feed after `after` once it holds at least `n` lines (a feed may hold a line
    back until older transactions end), or what it holds after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        entries = list(engine.feed(after))
        if len(entries) >= n or time.monotonic() > deadline:
            return entries
        time.sleep(0.05)
