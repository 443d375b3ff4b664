"""The engine conformance suite, run on every engine of this package.

The engine's own contract is the suite that ships with the package
(`eventstore.engines.conformance.EngineConformance`): it runs below once per engine
(file, memory, PostgreSQL when `EVENTSTORE_TEST_POSTGRES_URL` names a server, Redis
when `EVENTSTORE_TEST_REDIS_URL` does), as a
third-party engine would run it.

The tests after it run once per engine of `tests/engines.py`, through the session API
(what users see must behave the same on every engine): ordering, expected-seq conflicts,
idempotent replays, concurrent writers (threads everywhere, processes where the engine
is shared across processes), snapshot install beside live writers, history across
snapshots, follow exactly once, verify finding edited/dropped/inserted/reordered lines,
session listing and removal, and repair never destroying a byte.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import in_forked_child, make_entry, make_features, make_manifest
from engines import POSTGRES_URL, REDIS_URL, EngineCase, fresh_postgres, fresh_redis

from eventstore import (
    ConcurrencyError,
    CorruptLogError,
    HistoryUnavailableError,
    InvalidRecordError,
    Message,
    ProgressAppended,
    Quarantined,
    Role,
    SessionStore,
    Snapshot,
    UnknownSessionError,
)
from eventstore.engines.base import READ_AHEAD, CachingEngine, Engine, open_engine
from eventstore.engines.conformance import EngineConformance
from eventstore.engines.file.engine import FileEngine
from eventstore.engines.memory import MemoryEngine
from eventstore.format.chain import HASH_SUFFIX_LEN, line_hash
from eventstore.ops.repair import repair
from projections import Retention

SID = "s"


class TestFileEngine(EngineConformance):
    def make_engine(self) -> Engine:
        return FileEngine(self.tmp / uuid.uuid4().hex)


class TestFileEngineFsync(EngineConformance):
    def make_engine(self) -> Engine:
        return FileEngine(self.tmp / uuid.uuid4().hex, durability="fsync")


class TestMemoryEngine(EngineConformance):
    def make_engine(self) -> Engine:
        return MemoryEngine()


@pytest.mark.skipif(POSTGRES_URL is None, reason="EVENTSTORE_TEST_POSTGRES_URL is not set")
class TestPostgresEngine(EngineConformance):
    def make_engine(self) -> Engine:
        return open_engine(fresh_postgres(self.tmp))


@pytest.mark.skipif(REDIS_URL is None, reason="EVENTSTORE_TEST_REDIS_URL is not set")
class TestRedisEngine(EngineConformance):
    def make_engine(self) -> Engine:
        return open_engine(fresh_redis())


@pytest.fixture
def store(url: str) -> Iterator[SessionStore]:
    with SessionStore(url) as s:
        yield s


def _progress(store: SessionStore, sid: str, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        store.append_progress_entry(sid, make_entry(i))


def _summaries(store: SessionStore, sid: str = SID) -> list[str]:
    return [e.summary for e in store.load_bootstrap_state(sid).recent_progress]


# -- ordering and atomic batches ---------------------------------------------------------


def test_appends_read_back_in_order_with_gapless_seqs(store: SessionStore) -> None:
    store.initialize_session_if_missing(SID, make_manifest(SID), make_features(2))
    _progress(store, SID, 20)
    events = list(store.read_events(SID))
    assert [e.seq for e in events] == list(range(1, 23))
    assert _summaries(store) == [f"step {i}" for i in range(20)]
    assert store.last_seq(SID) == 22
    assert store.verify(SID).ok


# -- expected heads, conflicts, idempotency ------------------------------------------------


def test_expected_seq_conflicts_write_nothing(store: SessionStore) -> None:
    _progress(store, SID, 3)
    with pytest.raises(ConcurrencyError) as info:
        store.append(SID, [ProgressAppended(entry=make_entry(9))], expected_seq=2)
    assert (info.value.expected, info.value.actual) == (2, 3)
    assert store.last_seq(SID) == 3
    assert store.append(SID, [ProgressAppended(entry=make_entry(9))], expected_seq=3).last_seq == 4


def test_idempotent_replays_write_once_across_reopen(url: str) -> None:
    with SessionStore(url) as store:
        first = store.append(SID, [ProgressAppended(entry=make_entry(1))], idempotency_key="k")
        again = store.append(SID, [ProgressAppended(entry=make_entry(1))], idempotency_key="k")
        assert again.replayed and (again.first_seq, again.last_seq) == (
            first.first_seq,
            first.last_seq,
        )
        store.compact(SID, force=True)
    with SessionStore(url) as store:
        third = store.append(SID, [ProgressAppended(entry=make_entry(1))], idempotency_key="k")
        assert third.replayed
        assert store.last_seq(SID) == 1


def test_init_race_between_threads_has_exactly_one_winner(url: str) -> None:
    stores = [SessionStore(url) for _ in range(6)]
    results: list[bool] = []
    barrier = threading.Barrier(len(stores))

    def run(s: SessionStore) -> None:
        barrier.wait()
        results.append(s.initialize_session_if_missing(SID, make_manifest(SID), make_features(2)))

    threads = [threading.Thread(target=run, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 5 + [True]
    assert stores[0].last_seq(SID) == 2
    for s in stores:
        s.close()


# -- concurrency ---------------------------------------------------------------------------


def test_concurrent_writer_threads_on_separate_stores(url: str) -> None:
    n_threads, n = 4, 40
    stores = [SessionStore(url) for _ in range(n_threads)]

    def run(k: int) -> None:
        for i in range(n):
            stores[k].append_progress_entry(SID, make_entry(i, run_id=f"w{k}"))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with SessionStore(url) as fresh:
        entries = fresh.load_bootstrap_state(SID).recent_progress
        assert len(entries) == n_threads * n
        for k in range(n_threads):  # each writer's entries in its own order
            assert [e.summary for e in entries if e.run_id == f"w{k}"] == [
                f"step {i}" for i in range(n)
            ]
        assert fresh.verify(SID).ok
        assert [e.seq for e in fresh.read_events(SID)] == list(range(1, n_threads * n + 1))
    for s in stores:
        s.close()


def _process_writer(url: str, k: int, n: int) -> None:
    with SessionStore(url) as s:
        for i in range(n):
            s.append_progress_entry(SID, make_entry(i, run_id=f"p{k}"))
    os._exit(0)


def test_concurrent_writer_processes(case: EngineCase, url: str) -> None:
    if not case.processes:
        pytest.skip(f"the {case.name} engine is not shared across processes")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_process_writer, args=(url, k, 30)) for k in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with SessionStore(url) as store:
        assert store.last_seq(SID) == 90
        assert store.verify(SID).ok
        entries = store.load_bootstrap_state(SID).recent_progress
        for k in range(3):
            assert [e.summary for e in entries if e.run_id == f"p{k}"] == [
                f"step {i}" for i in range(30)
            ]


def test_snapshot_install_beside_live_writers(url: str) -> None:
    """Compactions while two threads append: nothing lost, nothing doubled, the chain
    verifies, and the history reads every event once."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def write(k: int) -> None:
        try:
            with SessionStore(url) as s:
                for i in range(60):
                    s.append_progress_entry(SID, make_entry(i, run_id=f"w{k}"))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def compact() -> None:
        try:
            with SessionStore(url) as s:
                while not stop.is_set():
                    if s.last_seq(SID):
                        s.compact(SID, force=True)
                    stop.wait(0.005)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    writers = [threading.Thread(target=write, args=(k,)) for k in range(2)]
    compactor = threading.Thread(target=compact)
    compactor.start()
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    compactor.join()
    assert errors == []
    with SessionStore(url) as s:
        entries = s.load_bootstrap_state(SID).recent_progress
        assert len(entries) == 120
        for k in range(2):
            assert [e.summary for e in entries if e.run_id == f"w{k}"] == [
                f"step {i}" for i in range(60)
            ]
        report = s.verify(SID)
        assert report.ok, report.problems
        assert [e.seq for e in s.read_events(SID)] == list(range(1, 121))


# -- history across snapshots ----------------------------------------------------------------


def test_history_across_snapshots_with_and_without_archive(store: SessionStore) -> None:
    store.initialize_session_if_missing(SID, make_manifest(SID), make_features(2))
    _progress(store, SID, 3)
    store.compact(SID, force=True)
    _progress(store, SID, 3, start=3)
    store.append_transcript_messages(SID, [Message(role=Role.USER, content="hi")])
    store.compact(SID, retention=Retention(progress=2), force=True)
    _progress(store, SID, 1, start=6)
    assert [e.seq for e in store.read_events(SID)] == list(range(1, 11))
    assert [e.summary for e in store.state_at(SID, seq=8).recent_progress] == [
        f"step {i}" for i in range(6)
    ]  # exact: retention trims the snapshot, not history
    assert [e.summary for e in store.load_bootstrap_state(SID).recent_progress] == [
        "step 4",
        "step 5",
        "step 6",
    ]
    assert store.transcript_at(SID, seq=10) == [Message(role=Role.USER, content="hi")]
    assert store.verify(SID).ok
    # without an archive the snapshot stands in for what it replaced
    _progress(store, "bare", 3)
    store.compact("bare", archive=False, force=True)
    _progress(store, "bare", 1, start=3)
    kinds = [type(e) for e in store.read_events("bare")]
    assert kinds == [Snapshot, ProgressAppended]
    with pytest.raises(HistoryUnavailableError):
        store.state_at("bare", seq=2)
    assert [e.summary for e in store.state_at("bare", seq=4).recent_progress] == [
        f"step {i}" for i in range(4)
    ]
    report = store.verify("bare")
    assert report.ok and "history_gap" in {p.kind for p in report.problems}


# -- follow ----------------------------------------------------------------------------------


def test_follow_yields_every_event_exactly_once_across_compactions(url: str) -> None:
    stop = threading.Event()
    seen: list[int] = []
    ready = threading.Event()

    def follow() -> None:
        with SessionStore(url) as s:
            ready.set()
            for ev in s.follow(SID, poll_interval=0.01, stop=stop):
                seen.append(ev.seq)
                if ev.seq >= 40:
                    stop.set()

    t = threading.Thread(target=follow)
    t.start()
    ready.wait()
    with SessionStore(url) as w:
        for i in range(40):
            w.append_progress_entry(SID, make_entry(i))
            if i % 9 == 8:
                w.compact(SID, force=True)
    t.join(30)
    assert not t.is_alive()
    assert seen == list(range(1, 41))


@pytest.mark.parametrize("written_again", [0, 5])
def test_a_follower_never_splices_a_purged_session_onto_the_one_written_again(
    url: str, written_again: int
) -> None:
    """A follower had yielded seq 1..3 when the session was purged and written again
    (seqs from 1: another history). It yielded the new history's seq 4 and 5 after the
    old 1..3, as if they continued it, and never the new 1..3. It raises
    `HistoryUnavailableError` instead: the history it followed is gone."""
    stop = threading.Event()  # (set late: a follower that waits on ends, failing)
    with SessionStore(url) as w, SessionStore(url) as r:
        for i in range(3):
            w.append_progress_entry(SID, make_entry(i))
        follower = r.follow(SID, poll_interval=0.01, stop=stop)
        assert [next(follower).seq for _ in range(3)] == [1, 2, 3]
        assert w.delete_session(SID, purge=True)
        for i in range(written_again):
            w.append_progress_entry(SID, make_entry(10 + i))
        timer = threading.Timer(10, stop.set)
        timer.start()
        try:
            with pytest.raises(HistoryUnavailableError, match="purged"):
                next(follower)
        finally:
            timer.cancel()


# -- verify ----------------------------------------------------------------------------------


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")[:-1]


def _join(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)


TAMPERS = {
    "edited": lambda ls: [*ls[:4], ls[4].replace(b"step 2", b"step X"), *ls[5:]],
    "dropped": lambda ls: [*ls[:4], *ls[5:]],
    "inserted": lambda ls: [*ls[:4], ls[2], *ls[4:]],
    "reordered": lambda ls: [*ls[:4], ls[5], ls[4], *ls[6:]],
}


@pytest.mark.parametrize("how", sorted(TAMPERS))
def test_verify_and_loads_find_a_tampered_line(case: EngineCase, url: str, how: str) -> None:
    with SessionStore(url) as store:
        store.initialize_session_if_missing(SID, make_manifest(SID), make_features(2))
        _progress(store, SID, 6)
        assert store.verify(SID).ok
        raw = store.engine.read(SID, None).data
        case.rewrite(store, SID, lambda b: _join(TAMPERS[how](_lines(b))))
    offset = sum(len(line) + 1 for line in _lines(raw)[:4])  # where line 5 starts
    with SessionStore(url) as store:
        report = store.verify(SID)
        assert not report.ok
        bad = [p for p in report.problems if p.severity == "error"]
        # verify names the line by its own seq; a load by the seq it was looking for
        assert (bad[0].kind, bad[0].offset) in {("hash_mismatch", offset), ("sequence", offset)}
        with pytest.raises(CorruptLogError) as info:
            store.load_bootstrap_state(SID)
        assert (info.value.offset, info.value.seq) == (offset, 5)


# -- sessions --------------------------------------------------------------------------------


def test_a_cold_start_reads_a_short_log_with_its_lookup_and_a_long_one_not(url: str) -> None:
    """A fold with nothing in memory and no cache (`open_cold`) gets, from an engine that
    reads on (PostgreSQL, Redis), the live log from its start in the same round trip
    while it holds at most `READ_AHEAD` lines (here a batch each), its opening snapshot
    included after a compaction: what a read from the start gives. Past it, none."""
    with SessionStore(url) as store:
        engine = store.engine
        if (
            not isinstance(engine, CachingEngine)
            or type(engine).open_cold is CachingEngine.open_cold
        ):
            pytest.skip(f"{type(engine).__name__} reads nothing on with a cold start")
        given = []
        for total in (0, 1, READ_AHEAD - 1, READ_AHEAD, READ_AHEAD + 1):
            while store.last_seq(SID) < total:
                store.append_progress_entry(SID, make_entry(store.last_seq(SID)))
            given.append(_read_on_is_the_read_from_the_start(engine))
        store.compact(SID, force=True)
        store.append_progress_entry(SID, make_entry(0))
        given.append(_read_on_is_the_read_from_the_start(engine))
    assert given == [True, True, True, True, False, True]


def _read_on_is_the_read_from_the_start(engine: CachingEngine) -> bool:
    """Whether `open_cold` of a fold without a cache read on (and then, that it read
    what a read from the start reads)."""
    got = engine.open_cold(SID, None, "mark").read_on
    if got is None:
        return False
    want = engine.read(SID, None)
    assert (bytes(got.data), got.head, got.reset) == (bytes(want.data), want.head, False)
    assert (got.where, got.offset) == (want.where, want.offset)
    return True


def test_list_and_remove_sessions(url: str) -> None:
    with SessionStore(url) as store:
        for sid in ("b", "a", "ünï/cødé"):
            _progress(store, sid, 2)
        store.compact("a", force=True)
        assert store.list_sessions() == sorted(["a", "b", "ünï/cødé"])
        assert store.delete_session("a", purge=True) is True
        assert store.delete_session("a", purge=True) is False
        assert store.list_sessions() == sorted(["b", "ünï/cødé"])
        assert store.load_bootstrap_state("a").recent_progress == []
        assert list(store.read_events("a")) == []
        with pytest.raises(UnknownSessionError):
            store.verify("a")
        _progress(store, "a", 1, start=7)  # a removed session starts over at seq 1
        assert store.last_seq("a") == 1
    with SessionStore(url) as other:
        assert _summaries(other, "a") == ["step 7"]


def test_removal_beside_a_live_writer_never_shows_half_a_session(url: str) -> None:
    stop = threading.Event()
    problems: list[str] = []

    def write() -> None:
        with SessionStore(url) as s:
            i = 0
            while not stop.is_set():
                s.append_progress_entry(SID, make_entry(i))
                i += 1

    def read() -> None:
        with SessionStore(url) as s:
            while not stop.is_set():
                try:
                    summaries = _summaries(s)
                except Exception as exc:  # pragma: no cover - reported below
                    problems.append(repr(exc))
                    return
                # what a reader sees is always one whole session: step 0..k in order
                if summaries != [f"step {i}" for i in range(len(summaries))] and not _restart(
                    summaries
                ):
                    problems.append(f"not whole: {summaries[:3]}...")

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    for t in threads:
        t.start()
    with SessionStore(url) as s:
        for _ in range(5):
            stop.wait(0.02)
            s.delete_session(SID, purge=True)
    stop.set()
    for t in threads:
        t.join()
    assert problems == []
    with SessionStore(url) as s:
        assert s.verify(SID).ok if s.last_seq(SID) else True


def _restart(summaries: list[str]) -> bool:
    """A session recreated by the writer after a removal: its steps continue from where
    the writer was, contiguously."""
    nums = [int(x.split()[1]) for x in summaries]
    return nums == list(range(nums[0], nums[0] + len(nums)))


def test_repair_keeps_a_valid_prefix_and_saves_the_original(case: EngineCase, url: str) -> None:
    with SessionStore(url) as store:
        _progress(store, SID, 5)
        case.rewrite(store, SID, lambda b: _join([*_lines(b)[:3], b"{not json", *_lines(b)[3:]]))
    with SessionStore(url) as store:
        with pytest.raises(CorruptLogError):
            store.load_bootstrap_state(SID)
        rep = repair(store, SID)
        assert rep.action == "moved_aside" and rep.moved_to is not None
        assert rep.kept_events == 3
        assert _summaries(store) == ["step 0", "step 1", "step 2"]
        assert store.verify(SID).ok
        # seq 4 and 5 are in the saved original only: no later event is given them
        assert rep.quarantined == (4, 5)
        _progress(store, SID, 1, start=3)
        assert store.last_seq(SID) == 6


@pytest.mark.parametrize("damage", ["edited", "undecodable", "claims_far"])
def test_repair_never_numbers_a_new_event_as_one_it_set_aside(
    case: EngineCase, url: str, damage: str
) -> None:
    """Promise (guarantees, Recovery): after a repair a sequence number never means two
    different events. Broken (issue 29, item 6): with line 4 of 8 damaged, repair kept
    1..3 and the next append was numbered 4 while the saved original still held 4..8
    (5..8 intact). Now a `quarantined` record holds each of 4..8 (what was set aside, and
    why), the next append is 9, and verify and read_events say where 4..8 went. A
    damaged line claiming a seq its place cannot hold (`claims_far`) is not believed."""
    with SessionStore(url) as store:
        _progress(store, SID, 8)

        def damaged(b: bytes) -> bytes:
            ls = _lines(b)
            ls[3] = {
                "edited": ls[3].replace(b"step 3", b"step@3"),
                "undecodable": b"{not json",
                "claims_far": ls[3].replace(b'"seq":4', b'"seq":999999'),
            }[damage]
            return _join(ls)

        case.rewrite(store, SID, damaged)
    with SessionStore(url) as store:
        rep = repair(store, SID)
        assert rep.action == "moved_aside" and rep.quarantined == (4, 8), rep
        assert store.append_progress_entry(SID, make_entry(99)).first_seq == 9
        events = list(store.read_events(SID))
        assert [e.seq for e in events] == list(range(1, 10))
        held = [e for e in events if isinstance(e, Quarantined)]
        assert [e.seq for e in held] == [4, 5, 6, 7, 8]
        assert {(e.first_seq, e.last_seq, e.lines) for e in held} == {(4, 8, 5)}
        assert _summaries(store) == ["step 0", "step 1", "step 2", "step 99"]
        report = store.verify(SID)
        assert report.ok and report.head_seq == 9
        assert [(p.kind, p.seq) for p in report.problems] == [("quarantined", 4)]
    with SessionStore(url) as store:  # a fresh store reads the same
        assert store.last_seq(SID) == 9
        with pytest.raises(InvalidRecordError):
            store.append(SID, [Quarantined(first_seq=1, last_seq=1, lines=1, bytes=1, problem="")])


def _forged(before: bytes, line: bytes, seq: int) -> bytes:
    """`line` claiming `seq`, its `h` recomputed to chain to `before` (a forger's edit)."""
    body = re.sub(rb'"seq":\d+', b'"seq":%d' % seq, line[:-HASH_SUFFIX_LEN]) + b"}"
    h = line_hash(before[-18:-2].decode(), body)
    return body[:-1] + b',"h":"' + h.encode() + b'"}'


@pytest.mark.parametrize(
    "damage", ["one_newline", "four_newlines", "line_lost", "line_lost_and_edited", "forged_far"]
)
def test_repair_believes_the_intact_lines_after_lost_newlines(
    case: EngineCase, url: str, damage: str
) -> None:
    """Issue 29 item 6, attacked: newlines lost between the lines of seq 4.. (lines
    merged into one, as a damaged byte or a torn sector leaves them) make fewer lines than
    the events they hold. Repair bounded the seq the dropped lines may claim by their
    count, so it did not believe intact line 8 (seq 8 past 3 + 4 lines), quarantined 4..7
    and numbered the next append 8, an event the saved original still holds (all of 4..8
    merged: 4..4, next 5). A line also ends where its `h` field closes it. Likewise a
    line lost (seq 5 gone: 6..8 set aside, 3 lines past seq 4): 8 was not believed and
    the next append was 8; a line whose `h` chains it to the line before is believed (a
    forged one claiming a huge seq, as far as the dropped bytes could hold lines)."""
    with SessionStore(url) as store:
        _progress(store, SID, 8)

        def damaged(b: bytes) -> bytes:
            ls = _lines(b)
            return _join(
                {
                    "one_newline": [*ls[:3], ls[3] + b" " + ls[4], *ls[5:]],
                    "four_newlines": [*ls[:3], b"X".join(ls[3:8])],
                    "line_lost": [*ls[:4], *ls[5:]],
                    "line_lost_and_edited": [
                        *ls[:3],
                        ls[3].replace(b"step 3", b"step@3"),
                        *ls[5:],
                    ],  # fmt: skip
                    "forged_far": [*ls[:3], _forged(ls[2], ls[3], 10**15), *ls[4:]],
                }[damage]
            )

        case.rewrite(store, SID, damaged)
    with SessionStore(url) as store:
        rep = repair(store, SID)
        first = 5 if damage == "line_lost" else 4
        assert rep.action == "moved_aside" and rep.quarantined is not None, rep
        if damage == "forged_far":
            assert rep.quarantined[0] == 4 and 8 <= rep.quarantined[1] < 1000, rep
            return
        assert rep.quarantined == (first, 8), rep
        assert store.append_progress_entry(SID, make_entry(99)).first_seq == 9
        assert [e.seq for e in store.read_events(SID)] == list(range(1, 10))
        assert store.verify(SID).ok


def test_open_engine_by_url(tmp_path: Path) -> None:
    from eventstore.errors import (
        UnknownEngineError,
        UnsafePathError,
    )

    assert isinstance(open_engine(tmp_path / "a"), FileEngine)
    assert isinstance(open_engine(f"file://{tmp_path}/b"), FileEngine)
    assert (tmp_path / "b").is_dir()
    shared = open_engine("memory://conformance-shared")
    assert isinstance(shared, MemoryEngine)
    with SessionStore(shared) as a, SessionStore("memory://conformance-shared") as b:
        _progress(a, SID, 1)
        assert b.last_seq(SID) == 1
    with SessionStore("memory://") as private, SessionStore("memory://") as other:
        _progress(private, SID, 1)
        assert other.last_seq(SID) == 0
    with pytest.raises(UnknownEngineError):
        open_engine("nosuch://x")
    with pytest.raises(UnsafePathError):
        SessionStore("")


# -- fork ------------------------------------------------------------------------------------


def test_a_child_forked_while_a_thread_appends_can_append(url: str) -> None:
    """Locks held by another thread at the fork are not inherited held: the child's own
    appends to the same session go through (issue: 20 of 20 forks used to hang)."""
    with SessionStore(url) as store:
        _progress(store, SID, 1)
        stop = threading.Event()

        def hammer() -> None:
            i = 100
            while not stop.is_set():
                store.append_progress_entry(SID, make_entry(i))
                i += 1

        t = threading.Thread(target=hammer)
        t.start()
        try:
            for _ in range(10):
                # the child: use the inherited store, then exit at once
                code = in_forked_child(
                    lambda: (
                        store.append_progress_entry(SID, make_entry(7, run_id="child")),
                        store.load_bootstrap_state(SID),
                    ),
                    20,
                )
                if code is None:
                    pytest.fail("the forked child hung on a lock held by a parent thread")
                assert code == 0
        finally:
            stop.set()
            t.join()
        assert store.verify(SID).ok


EDITS = {
    "a letter of a summary": (b'"summary":"step 3"', b'"summary":"step 8"'),
    "a letter of a type tag": (b'"type":"progress_appended"', b'"type":"progress_appendex"'),
    "a digit of a timestamp": (
        b'"created_at":"2026-03-01T09:30:03',
        b'"created_at":"2026-03-01T09:30:04',
    ),
}


@pytest.mark.parametrize("what", sorted(EDITS))
def test_a_load_never_returns_an_edited_line(case: EngineCase, url: str, what: str) -> None:
    """An edit that keeps the line valid JSON (so only its hash can tell) makes every load
    that folds the line raise CorruptLogError naming the log, the offset and the seq; an
    edited type tag does not make the event vanish as an unknown type."""
    old, new = EDITS[what]
    with SessionStore(url) as store:
        _progress(store, SID, 6)
        raw = store.engine.read(SID, None).data
        lines = _lines(raw)
        assert old in lines[3]
        offset = sum(len(line) + 1 for line in lines[:3])
        edited = [*lines[:3], lines[3].replace(old, new), *lines[4:]]
        case.rewrite(store, SID, lambda b: _join(edited))
    with SessionStore(url) as store:
        for load in (store.load_bootstrap_state, store.load_transcript_messages):
            with pytest.raises(CorruptLogError) as info:
                load(SID)
            assert (info.value.offset, info.value.seq) == (offset, 4)
            assert str(info.value.path).endswith(SID) or "log.jsonl" in str(info.value.path)
        with pytest.raises(CorruptLogError):
            store.state_at(SID, seq=5)
        assert not store.verify(SID).ok


def test_history_readers_beside_appends_and_compactions_see_one_picture(url: str) -> None:
    """verify and read_events while another store appends and compacts: every report is
    clean and every read is gapless 1..n with no snapshot standing in for archived events
    (they used to list the archive and read the live log at different moments)."""
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            with SessionStore(url) as s:
                for i in range(70):
                    s.append_progress_entry(SID, make_entry(i))
                    if i % 7 == 6:
                        s.compact(SID, force=True)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    with SessionStore(url) as store:
        _progress(store, SID, 3)
        t = threading.Thread(target=churn)
        t.start()
        rounds = 0
        try:
            while t.is_alive() or not rounds:
                rounds += 1
                report = store.verify(SID)
                assert report.ok, report.problems
                seqs = [e.seq for e in store.read_events(SID)]
                assert seqs == list(range(1, len(seqs) + 1))
                assert not any(
                    type(e) is Snapshot for e in store.read_events(SID, to_seq=len(seqs))
                )
        finally:
            t.join()
        assert [e.seq for e in store.read_events(SID)] == list(range(1, 74))
    assert errors == []
