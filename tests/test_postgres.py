"""The PostgreSQL engine on a real server: the engine contract, the schema, the global
feed, hostile ids, concurrent processes, killed writers and dropped connections.

Needs `EVENTSTORE_TEST_POSTGRES_URL` (a database the tests may create schemas in; `.ci/run`
starts a throwaway server and sets it). Without it the tests skip, except in CI
(`CI=true`), where they fail: CI must never pass by skipping them. Every test works in
a schema of its own, dropped afterwards.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

import msgspec
import pytest
from conftest import cli_in_process, wait_child, with_query
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from eventstore import (
    ProgressEntry,
    SessionStore,
)
from eventstore.engines.base import (
    EMPTY_HEAD,
    READ_AHEAD,
    EncodedBatch,
    Head,
    HeadMovedError,
    History,
    PruningEngine,
)
from eventstore.errors import (
    CorruptLogError,
    EventStoreError,
    InvalidArgumentError,
    StorageError,
    UnknownEngineError,
)
from eventstore.format.chain import line_hash, split_hash
from eventstore.format.codec import EventCodec
from eventstore.format.events import (
    LineHead,
    ProgressAppended,
    Snapshot,
)

REPO = Path(__file__).resolve().parent.parent


psycopg = pytest.importorskip("psycopg") if os.environ.get("CI") != "true" else None
if psycopg is None:
    import psycopg  # in CI the extra must be installed: an ImportError fails the run

from eventstore.engines.postgres import engine as pg  # noqa: E402
from eventstore.engines.postgres.handover import Handover  # noqa: E402
from eventstore.engines.postgres.schema import channel_of, quote_schema  # noqa: E402


@pytest.fixture
def engine(pg_url: str) -> Iterator[pg.PostgresEngine]:
    e = pg.from_url(pg_url)
    yield e
    e.close()


CODEC = EventCodec()


def make_batch(head: Head, n: int = 1, key: str | None = None, tag: str = "") -> EncodedBatch:
    """`n` progress events encoded and chained after `head`, the way the face does."""
    events = [
        ProgressAppended(entry=ProgressEntry(run_id="r", summary=f"{tag}{i}")) for i in range(n)
    ]
    data, stamped, link = CODEC.encode_batch(
        events, head.seq + 1, head.link, datetime.now(UTC), key
    )
    return EncodedBatch(
        data,
        stamped[0].seq,
        stamped[-1].seq,
        tuple(e.h for e in stamped),
        link,
        key,
        "fp" if key else None,
    )


def snapshot_line(head: Head) -> bytes:
    """A snapshot line covering `head`."""
    snap = Snapshot(base_h=head.link, states={"p": msgspec.Raw(b'{"version":1,"state":{}}')})
    line, _ = CODEC.encode_snapshot(snap, head.seq, head.link, datetime.now(UTC))
    return line


def append_retrying(e: pg.PostgresEngine, sid: str, n: int = 1, tag: str = "") -> Head:
    """Append like the face: encode against the head read, retry when it moved."""
    head = e.head(sid)
    while True:
        try:
            return e.append(sid, make_batch(head, n, tag=tag), head)
        except HeadMovedError as exc:
            head = exc.actual


_heads = msgspec.json.Decoder(LineHead)


def check_chain(data: bytes, first_seq: int = 1) -> list[LineHead]:
    """Every line's seq follows the last and its `h` chains to the one before."""
    heads = []
    link = ""
    seq = first_seq
    for line in data.split(b"\n")[:-1]:
        head = _heads.decode(line)
        body, h = split_hash(line) or (b"", "")
        if head.type == "snapshot":
            assert not heads, "a snapshot after the first line"
            seq = head.seq
            link = head.base_h or ""  # a snapshot chains to the last line it covers
        else:
            assert head.seq == seq, f"seq {head.seq} where {seq} was expected"
        assert line_hash(link, body) == h, f"broken chain at seq {head.seq}"
        link = head.base_h if head.type == "snapshot" and head.base_h is not None else h
        heads.append(head)
        seq += 1
    return heads


# -- the engine contract --------------------------------------------------------------


def test_append_read_head_and_positions(engine: pg.PostgresEngine) -> None:
    assert engine.head("s") == EMPTY_HEAD
    assert engine.read("s", None).data == b""
    b1 = make_batch(EMPTY_HEAD, 3, key="k")
    h1 = engine.append("s", b1, EMPTY_HEAD)
    assert (h1.seq, h1.link, h1.h, h1.size, h1.base_seq) == (
        3,
        b1.link,
        b1.hashes[-1],
        len(b1.data),
        1,
    )
    r = engine.read("s", None)
    assert r.data == b1.data and r.head == h1 == engine.head("s") and not r.reset and r.offset == 0
    b2 = make_batch(h1, 2)
    h2 = engine.append("s", b2, h1)
    r2 = engine.read("s", r.head.position)
    assert r2.data == b2.data and r2.offset == len(b1.data) and r2.head == h2
    assert engine.read("s", h2.position).data == b""
    check_chain(engine.read("s", None).data)


def test_stale_expected_head_writes_nothing(engine: pg.PostgresEngine) -> None:
    h1 = engine.append("s", make_batch(EMPTY_HEAD), EMPTY_HEAD)
    with pytest.raises(HeadMovedError) as info:
        engine.append("s", make_batch(EMPTY_HEAD), EMPTY_HEAD)
    assert info.value.actual == h1
    # the same seq with another link (a forked chain) is refused too
    forged = Head(seq=1, link="0" * 16)
    with pytest.raises(HeadMovedError):
        engine.append("s", make_batch(forged), forged)
    # a head expected on a session that does not exist: nothing is created
    with pytest.raises(HeadMovedError):
        engine.append("ghost", make_batch(h1), h1)
    assert engine.read("s", None).head == h1 == engine.head("s")
    assert engine.list_sessions() == ["s"]


def test_batch_not_following_the_head_is_refused(engine: pg.PostgresEngine) -> None:
    h1 = engine.append("s", make_batch(EMPTY_HEAD), EMPTY_HEAD)
    skip = make_batch(Head(seq=5, link=h1.link))
    with pytest.raises(ValueError, match="starting at seq 6"):
        engine.append("s", skip, h1)
    assert engine.head("s") == h1


def test_snapshot_install_keeps_or_drops_history(engine: pg.PostgresEngine) -> None:
    h = append_retrying(engine, "s", 3)
    before = engine.read("s", None)
    line = snapshot_line(h)
    res = engine.install_snapshot("s", line, h, keep_history=True)
    assert (res.head.seq, res.head.link) == (h.seq, h.link)
    assert res.head.h == split_hash(line[:-1])[1]  # type: ignore[index]
    assert res.before == h.size and res.after == len(line) == res.head.size
    assert res.archived is not None
    # a reader positioned in the old log starts over at the snapshot
    r = engine.read("s", before.head.position)
    assert r.reset and r.data == line and r.head == res.head
    # appends encoded before the install still chain (the snapshot keeps seq and link)
    h2 = engine.append("s", make_batch(h, 2), h)
    assert engine.read("s", None).data == line + engine.read("s", res.head.position).data
    check_chain(engine.read("s", None).data)
    with engine.history("s") as hist:
        segs = list(hist)
    assert [s.archived for s in segs] == [True, False]
    assert segs[0].read() == before.data and (segs[0].first_seq, segs[0].last_seq) == (1, 3)
    assert (segs[1].first_seq, segs[1].last_seq) == (3, 5) and segs[1].size == h2.size
    # a second compaction without history: the first archive stays, the middle goes
    line2 = snapshot_line(h2)
    engine.install_snapshot("s", line2, h2, keep_history=False)
    with engine.history("s") as hist:
        segs = list(hist)
    assert [s.read() for s in segs] == [before.data, line2]
    # installing against the replaced log again is refused and changes nothing
    with pytest.raises(HeadMovedError):
        engine.install_snapshot("s", line, h, keep_history=True)
    assert engine.read("s", None).data == line2


def test_snapshot_then_later_lines_stay_in_place(engine: pg.PostgresEngine) -> None:
    h3 = append_retrying(engine, "s", 3)
    h5 = append_retrying(engine, "s", 2)
    line = snapshot_line(h3)  # covers 3; lines 4 and 5 were committed meanwhile
    res = engine.install_snapshot("s", line, h3, keep_history=False)
    assert (res.head.seq, res.head.h) == (5, h5.h)
    live = engine.read("s", None).data
    heads = check_chain(live, 3)
    assert [x.seq for x in heads] == [3, 4, 5] and res.head.size == len(live)
    with engine.history("s") as hist:
        assert [s.archived for s in hist] == [False]


def test_opening_snapshot_batch_starts_a_compacted_copy(engine: pg.PostgresEngine) -> None:
    # what a copy of a session compacted without history looks like: seq 7 opens it
    line = snapshot_line(Head(seq=7, link="a" * 16))
    h = split_hash(line[:-1])
    assert h is not None
    batch = EncodedBatch(line, 7, 7, (h[1],), "a" * 16)
    head = engine.append("s", batch, EMPTY_HEAD)
    assert (head.seq, head.base_seq, head.link, head.size) == (7, 7, "a" * 16, len(line))
    h8 = engine.append("s", make_batch(head), head)
    assert h8.seq == 8 and engine.read("s", None).data.startswith(line)


def test_list_and_remove_sessions(engine: pg.PostgresEngine) -> None:
    for sid in ("b", "a", "c"):
        append_retrying(engine, sid)
    assert engine.list_sessions() == ["a", "b", "c"]
    pos = engine.head("b").position
    assert engine.remove_session("b") is True
    assert engine.remove_session("b") is False
    assert engine.list_sessions() == ["a", "c"]
    r = engine.read("b", pos)
    assert r.reset and r.data == b"" and r.head == EMPTY_HEAD
    # a writer that still expects the removed head is refused; a new session starts at 1
    with pytest.raises(HeadMovedError):
        engine.append("b", make_batch(engine.head("a")), engine.head("a"))
    assert append_retrying(engine, "b").seq == 1


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(
        st.tuples(st.integers(1, 4), st.booleans(), st.sampled_from(["s", "t"])),
        min_size=1,
        max_size=12,
    )
)
def test_appends_of_any_size_keep_offsets_and_refuse_stale_heads(
    engine: pg.PostgresEngine, steps: list[tuple[int, bool, str]]
) -> None:
    """Batches of 1 to 4 lines on two sessions, each after a refused append with a stale
    head (the one before the last append): every answer's head, size and position
    agree with what a read returns, from the start and from every earlier position."""
    sids = {sid: f"{sid}-{uuid.uuid4().hex[:8]}" for sid in ("s", "t")}
    heads = {sid: engine.head(sid) for sid in sids.values()}
    stale = dict(heads)
    marks: dict[str, list[tuple[Head, int]]] = {sid: [] for sid in sids.values()}
    for n, try_stale, name in steps:
        sid = sids[name]
        head = heads[sid]
        if try_stale and stale[sid] != head:
            with pytest.raises(HeadMovedError) as info:
                engine.append(sid, make_batch(stale[sid], n), stale[sid])
            assert info.value.actual == head
        batch = make_batch(head, n)
        new = engine.append(sid, batch, head)
        assert (new.seq, new.link, new.h) == (head.seq + n, batch.link, batch.hashes[-1])
        assert new.size == head.size + len(batch.data) and new.base_seq == 1
        stale[sid], heads[sid] = head, new
        marks[sid].append((new, new.size))
    for sid, done in marks.items():
        whole = engine.read(sid, None)
        assert whole.head == heads[sid] == engine.head(sid)
        assert len(whole.data) == heads[sid].size
        check_chain(whole.data)
        for head, size in done:
            rest = engine.read(sid, head.position)
            assert rest.offset == size and rest.data == whole.data[size:]


def test_removing_a_session_while_it_is_appended_to_leaves_no_line_behind(
    engine: pg.PostgresEngine, pg_url: str
) -> None:
    """Lines keep no foreign key to their session (schema version 5): removing a
    session deletes its lines itself, under the session's row lock. Removals racing a
    writer that appends on and on leave no line of a removed session in the table (nor
    in the feed), and what is left reads as one whole chain from seq 1."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        with pg.from_url(pg_url) as other:
            while not stop.is_set():
                try:
                    append_retrying(other, "r", 2)
                except BaseException as exc:  # noqa: BLE001 - the test inspects it
                    errors.append(exc)
                    return

    t = threading.Thread(target=writer)
    t.start()
    try:
        removed = 0
        deadline = time.monotonic() + 30
        while removed < 10 and time.monotonic() < deadline:
            if engine.head("r").seq:
                removed += engine.remove_session("r")
    finally:
        stop.set()
        t.join(30)
    assert not errors and removed == 10
    head = engine.head("r")
    data = engine.read("r", None).data
    assert [h.seq for h in check_chain(data)] == list(range(1, head.seq + 1))
    q = quote_schema(engine.schema)
    with psycopg.connect(pg.split_url(pg_url)[0], autocommit=True) as conn:
        orphans = conn.execute(
            f"SELECT count(*) FROM {q}.lines l"  # noqa: S608
            f" WHERE NOT EXISTS (SELECT 1 FROM {q}.sessions s WHERE s.sid = l.sid)"
        ).fetchone()
        kept = conn.execute(f"SELECT count(*) FROM {q}.lines").fetchone()  # noqa: S608
    assert orphans == (0,) and kept == (head.seq,)
    assert [e.seq for e in engine.feed()] == list(range(1, head.seq + 1))


def _wal_records(conn: psycopg.Connection[Any], run: Callable[[], object]) -> list[str]:
    """The WAL records (`resource manager/record type`) written while `run()` ran."""
    start = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
    run()
    end = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
    assert start is not None and end is not None
    rows = conn.execute(
        "SELECT resource_manager || '/' || record_type FROM pg_get_wal_records_info(%s, %s)",
        (start[0], end[0]),
    ).fetchall()
    return [r[0] for r in rows]


def test_an_append_locks_no_row_before_moving_the_head(
    engine: pg.PostgresEngine, pg_url: str
) -> None:
    """Schema version 5: an append to a session whose head is the expected one moves
    the head with one conditional UPDATE (no SELECT ... FOR UPDATE first) and inserts
    its line with no foreign-key check (which locked the session's row again): no row
    lock record in the WAL, one heap insert per line. (Read with pg_walinspect, a
    contrib module of PostgreSQL 15: skipped where the server lacks it.)"""
    conninfo = pg.split_url(pg_url)[0]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        except psycopg.Error as exc:
            pytest.skip(f"pg_walinspect is not available: {exc}")
        head = append_retrying(engine, "s")
        for n in (1, 3):
            batch = make_batch(head, n)
            records = _wal_records(conn, lambda b=batch, h=head: engine.append("s", b, h))
            head = engine.head("s")
            assert not [r for r in records if r.startswith("Heap/LOCK")], records
            inserts = [r for r in records if r.startswith("Heap/INSERT")]
            assert len(inserts) == n and records.count("Transaction/COMMIT") == 1, records


def test_repair_hold_keeps_a_prefix_and_saves_the_rest(
    engine: pg.PostgresEngine, pg_url: str
) -> None:
    h1 = append_retrying(engine, "s", 2)
    append_retrying(engine, "s", 1)
    whole = engine.read("s", None).data
    with engine.hold("s") as hold:
        assert hold.data == whole
        assert hold.keep_prefix(len(whole), "none") is None
        name = hold.keep_prefix(h1.size, "corrupt")
    assert name is not None and "corrupt" in name
    assert engine.read("s", None).data == whole[: h1.size]
    assert (engine.head("s").seq, engine.head("s").link) == (h1.seq, h1.link)
    with psycopg.connect(pg.split_url(pg_url)[0], autocommit=True) as conn:
        saved = conn.execute(f"SELECT data FROM {quote_schema(engine.schema)}.saved").fetchall()
    assert [bytes(r[0]) for r in saved] == [whole]
    assert append_retrying(engine, "s").seq == 3


def test_wait_wakes_on_append_from_another_engine(pg_url: str) -> None:
    reader, writer = pg.from_url(pg_url), pg.from_url(pg_url)
    try:
        h = append_retrying(writer, "s")
        woke: list[float] = []

        def waiter() -> None:
            t0 = time.monotonic()
            woke.append(reader.wait("s", h.position, 20.0))
            woke.append(time.monotonic() - t0)

        # nothing new: it times out, even if the append's own NOTIFY (sent just after its
        # commit) arrives meanwhile
        assert reader.wait("s", h.position, 0.2) is False
        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.5)
        append_retrying(writer, "s")
        t.join(10)
        assert woke and woke[0] is True and woke[1] < 10.0
        # a position behind the head returns at once
        assert reader.wait("s", None, 5.0) is True
    finally:
        reader.close()
        writer.close()


def _xids_assigned(conninfo: str) -> int:
    """The server's next transaction id: a write transaction takes one (so does a NOTIFY)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()
    assert row is not None
    return int(row[0])


def _notes(conn: psycopg.Connection[Any], wait: float) -> list[str]:
    """The payloads of the notifications `conn` got, waiting `wait` seconds for more."""
    conn.execute("SELECT 1")  # delivers what arrived meanwhile
    return [n.payload for n in conn.notifies(timeout=wait)]


def test_an_append_is_one_transaction_and_notifies_only_while_someone_follows(
    pg_url: str,
) -> None:
    """An append commits one transaction (it once sent its NOTIFY in a second one, from a
    thread, after the commit). With no follower it sends no NOTIFY at all (a notifying
    commit serializes with every other on the server); while a follower waits, each
    append's NOTIFY is in the append's own transaction; once the follower closes, none."""
    writer, reader = pg.from_url(pg_url), pg.from_url(pg_url)
    conninfo = pg.split_url(pg_url)[0]
    try:
        head = append_retrying(writer, "s")
        with psycopg.connect(conninfo, autocommit=True) as spy:  # listens, does not follow
            spy.execute(f"LISTEN {channel_of(writer.schema)}")
            n = 20
            before = _xids_assigned(conninfo)
            for _ in range(n):
                head = append_retrying(writer, "s")
            # every append takes one id (autovacuum may take one or two meanwhile)
            assert n <= _xids_assigned(conninfo) - before <= n + 2
            assert _notes(spy, 0.5) == []  # nobody follows: no NOTIFY
            assert reader.wait("s", head.position, 0.2) is False  # now a follower
            before = _xids_assigned(conninfo)
            for _ in range(n):
                head = append_retrying(writer, "s")
            assert n <= _xids_assigned(conninfo) - before <= n + 2
            assert _notes(spy, 0.5) == ["s"] * n
            assert reader.wait("s", None, 5.0) is True
            reader.close()  # no follower left
            for _ in range(3):
                append_retrying(writer, "s")
            assert _notes(spy, 0.5) == []
    finally:
        reader.close()
        writer.close()


def test_a_follower_that_starts_beside_an_append_misses_no_wake_up(pg_url: str) -> None:
    """A new follower registers (its first wait) while one append runs, at varied
    offsets: it either reads that append or is woken by it. A wake-up lost between the
    append's look for followers and the follower's read would leave it waiting out its
    timeout (the registration waits for every append that looked before it)."""
    writer = pg.from_url(pg_url)
    try:
        append_retrying(writer, "s")
        for i in range(16):
            follower = pg.from_url(pg_url)
            try:
                head = follower.head("s")
                got: list[object] = []

                def follow(
                    f: pg.PostgresEngine = follower, h: Head = head, got: list[object] = got
                ) -> None:
                    t0 = time.monotonic()
                    got.append(f.wait("s", h.position, 20.0))
                    got.append(time.monotonic() - t0)

                t = threading.Thread(target=follow)
                t.start()
                time.sleep((i % 8) * 0.003)
                append_retrying(writer, "s")
                t.join(30)
                assert got[0] is True and isinstance(got[1], float) and got[1] < 10.0, (i, got)
            finally:
                follower.close()
    finally:
        writer.close()


def test_a_cold_load_starts_from_the_fold_cache_and_reads_what_came_after(
    pg_url: str,
) -> None:
    """The engine keeps the store's fold caches: a fresh store's first load starts from
    the state the closing store saved (cache_info says which head it holds) and folds
    only the lines appended after it, by any writer; a replaced log's cache is unused."""
    summary = "x" * 1000  # 100 entries: past the log size close saves caches at
    with SessionStore(pg_url) as store:
        for i in range(100):
            store.append_progress_entry("s", _entry(f"{i}{summary}"))
        store.load_bootstrap_state("s")
    with SessionStore(pg_url) as fresh:
        assert len(fresh.load_bootstrap_state("s").recent_progress) == 100
        assert fresh.cache_info("s").folds["bootstrap"] == (100, 100)  # from the cache
        for i in range(5):
            fresh.append_progress_entry("s", _entry(f"after {i}"))
    with SessionStore(pg_url) as fresh:
        got = [p.summary for p in fresh.load_bootstrap_state("s").recent_progress]
        assert got[-5:] == [f"after {i}" for i in range(5)]
        assert got[:100] == [f"{i}{summary}" for i in range(100)][-len(got[:100]) :]
        assert fresh.cache_info("s").folds["bootstrap"][0] == 105
        assert fresh.compact("s", force=True).compacted  # a new log, its own cache
    with SessionStore(pg_url) as fresh:
        assert [p.summary for p in fresh.load_bootstrap_state("s").recent_progress] == got
        assert fresh.verify("s").ok


@pytest.mark.parametrize("edit", ["row-inserted", "head-taken-back"])
def test_attack_repair_never_calls_a_log_with_lines_past_its_head_intact(
    pg_url: str, edit: str
) -> None:
    """Attack: a line row inserted from outside past the head (chained to its line as
    an append's would be) made every load refuse the session and an append a
    StorageError quoting a unique-key violation, yet `repair` said "the log is intact;
    nothing to do", and the session stayed refused. Now an append is CorruptLogError
    naming the session, and repair cuts the rows past the head's own, which end at its
    line and its end of the stream (the whole original saved aside, the seq
    quarantined). A head taken back over lines an append acknowledged (its end of the
    stream left) cannot be told apart from them: repair raises CorruptLogError naming
    the session and changes nothing."""
    from eventstore.ops import audit

    conninfo, schema = pg.split_url(pg_url)
    q = quote_schema(schema)
    with SessionStore(pg_url) as store:
        for i in range(3):
            store.append_progress_entry("s", _entry(f"step {i}"))
            if i == 1:
                older = store.engine.head("s")
        head = store.engine.head("s")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        if edit == "row-inserted":
            event = ProgressAppended(entry=_entry("forged"))
            line, _, _ = EventCodec().encode_batch(
                [event], head.seq + 1, head.link, datetime.now(UTC), None
            )
            conn.execute(
                f"INSERT INTO {q}.lines (sid, seq, stream_off, line) SELECT sid, seq + 1,"
                f" stream_off + octet_length(line), %s FROM {q}.lines WHERE seq = 3",
                (line,),
            )
        else:
            conn.execute(
                f"UPDATE {q}.sessions SET head_seq = 2, head_link = %s, head_h = %s",
                (older.link, older.h),
            )
        rows = conn.execute(f"SELECT seq, line FROM {q}.lines ORDER BY seq").fetchall()
    with SessionStore(pg_url) as store:
        assert not store.verify("s").ok
        with pytest.raises(CorruptLogError, match="#s"):
            store.append_progress_entry("s", _entry("refused"))
        if edit == "head-taken-back":
            with pytest.raises(CorruptLogError, match="#s.*repair cannot tell"):
                audit.repair(store.core, "s")
            with psycopg.connect(conninfo, autocommit=True) as conn:
                got = conn.execute(f"SELECT seq, line FROM {q}.lines ORDER BY seq").fetchall()
                assert got == rows
            return
        report = audit.repair(store.core, "s")
        assert report.action == "moved_aside" and report.kept_events == 3, report
        assert report.problem is not None and report.problem.kind == "past_head"
        assert report.quarantined == (4, 4)
        assert store.verify("s").ok
        store.append_progress_entry("s", _entry("step 3"))
        recent = store.load_bootstrap_state("s").recent_progress
        assert [p.summary for p in recent] == [f"step {i}" for i in range(4)]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        saved = conn.execute(f"SELECT data FROM {q}.saved").fetchall()
    assert [bytes(r[0]) for r in saved] == [b"".join(bytes(r[1]) for r in rows)]


def _with_a_saved_fold_cache(pg_url: str) -> None:
    """Session "s" of three appends of 400 kB, folded: a fold of over 1 MiB, so its
    bootstrap state's cache is saved."""
    with SessionStore(pg_url) as store:
        for i in range(3):
            store.append_progress_entry("s", _entry(f"{i}" + "x" * 400_000))
        store.load_bootstrap_state("s")


def test_a_fold_cache_is_read_with_the_lines_after_it(pg_url: str) -> None:
    """A fold cache comes with the log after its head, read in the same statement, up to
    `READ_AHEAD` lines (a fold from it then reads nothing more); the same bytes a read
    from its head returns. Further behind, the fold reads them itself."""
    _with_a_saved_fold_cache(pg_url)
    with SessionStore(pg_url) as store:  # a writer that folds nothing: the cache stays
        engine = pg.PostgresEngine(pg_url)
        read_on = []
        try:
            for behind in (0, 4, READ_AHEAD - 4, 5):  # 0, 4, READ_AHEAD, past it
                for i in range(behind):
                    store.append_progress_entry("s", _entry(f"after {i}"))
                opened = engine.open_cache("s", "bootstrap")
                assert opened is not None
                with opened[1] as reader:
                    got = reader.read_on
                want = engine.read("s", opened[0].position)
                read_on.append(got is not None)
                if want.head.seq - opened[0].seq > READ_AHEAD:
                    assert got is None
                else:
                    assert got is not None and got.head == want.head
                    assert (bytes(got.data), got.offset) == (bytes(want.data), want.offset)
        finally:
            engine.close()
    assert read_on == [True, True, True, False]


def test_lines_past_the_array_bound_are_read_a_row_each(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: more bytes of lines after a read's position, after a fold cache, or from a
    log's start than one PostgreSQL value holds (1 GB; `ARRAY_BYTES` made small here).
    The one-row reads put them all in one array, which fails there; past `ARRAY_BYTES`
    they come a row each, in a statement of their own: the same bytes."""
    monkeypatch.setattr(pg, "ARRAY_BYTES", 2_000)
    _with_a_saved_fold_cache(pg_url)
    with SessionStore(pg_url) as store:  # a writer that folds nothing: the cache stays
        engine = pg.PostgresEngine(pg_url)
        try:
            cached = engine.head("s")
            for i in range(10):
                store.append_progress_entry("s", _entry(f"after {i} " + "y" * 300))
            whole = engine.read("s", None)
            on = engine.read("s", cached.position)
            assert on.head == whole.head and bytes(whole.data).endswith(bytes(on.data))
            assert bytes(on.data).count(b"\n") == whole.head.seq - cached.seq == 10
            opened = engine.open_cache("s", "bootstrap")
            assert opened is not None and opened[0] == cached
            with opened[1] as reader:
                assert reader.read_on is None  # past the bound: the fold reads them itself
        finally:
            engine.close()
    with SessionStore(pg_url) as store:
        recent = store.load_bootstrap_state("s").recent_progress
        assert [p.summary for p in recent][-10:] == [f"after {i} " + "y" * 300 for i in range(10)]


# -- the global feed ------------------------------------------------------------------


def tail_feed(
    read: Callable[[pg.FeedPosition], list[pg.FeedEntry]], stop: threading.Event
) -> list[pg.FeedEntry]:
    """Read the feed batch after batch from the start, as a tailing reader does, until a
    read that began after `stop` was set comes back empty; returns what it read.

    `stop` is looked at before each read, never after: a read answers as of its start
    (one statement, one snapshot), so an empty answer says nothing of lines committed
    while it ran. Looking after the read made this reader stop without the writers' last
    lines in ~4% of runs (see test_a_feed_read_that_began_before_a_commit_lacks_it)."""
    seen: list[pg.FeedEntry] = []
    after = pg.FEED_START
    while True:
        done = stop.is_set()
        batch = read(after)
        seen.extend(batch)
        if batch:
            after = batch[-1].position
        elif done:
            return seen


def feed_once_released(engine: pg.PostgresEngine, n: int) -> list[pg.FeedEntry]:
    """The whole feed once it holds `n` lines. Acknowledged appends can be held back for a
    moment: a line reaches the feed once every older transaction on the server has ended
    (the engine's own NOTIFY sender's too; see
    test_feed_holds_back_lines_behind_any_older_transaction)."""
    deadline = time.monotonic() + 30
    while True:
        full = engine.feed(pg.FEED_START, 100_000)
        if len(full) >= n or time.monotonic() > deadline:
            return full
        time.sleep(0.01)


def test_feed_keeps_session_order_and_never_fills_in_behind_a_reader(
    engine: pg.PostgresEngine,
) -> None:
    """Writers on several sessions, a reader tailing the feed meanwhile: what the
    reader collected step by step equals the feed read once at the end (nothing ever
    appeared below a position it had passed), positions increase, and each session's
    lines come in seq order."""
    stop = threading.Event()
    seen: list[pg.FeedEntry] = []

    def tail() -> None:
        seen.extend(tail_feed(lambda after: engine.feed(after, 50), stop))

    def write(sid: str) -> None:
        for i in range(40):
            append_retrying(engine, sid, 1 + i % 3)

    reader = threading.Thread(target=tail)
    reader.start()
    writers = [threading.Thread(target=write, args=(f"s{i}",)) for i in range(4)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    # the reader stops only after a read begun once every line was released: a line it
    # skipped would be missing from `seen`, never hidden by an early stop
    full = feed_once_released(engine, 4 * sum(1 + i % 3 for i in range(40)))
    stop.set()
    reader.join()
    assert seen == full
    assert [e.position for e in full] == sorted({e.position for e in full})  # increasing
    assert len(full) == 4 * sum(1 + i % 3 for i in range(40))
    for sid in ("s0", "s1", "s2", "s3"):
        mine = [e for e in full if e.session_id == sid]
        assert [e.seq for e in mine] == list(range(1, len(mine) + 1))
        assert b"".join(e.line for e in mine) == engine.read(sid, None).data


def test_a_feed_read_that_began_before_a_commit_lacks_it(engine: pg.PostgresEngine) -> None:
    """The interleaving that failed the test above (1 of 4 full runs; ~4 in 100 runs of
    it alone): the writers' last append commits while the reader's read is under way and
    the writers finish before that read returns. The read answers as of its start, empty;
    a reader that then looks at its stop flag stops without the line. tail_feed looked
    at the flag before the read began, so it reads again and gets it."""
    stop = threading.Event()
    answers: list[list[pg.FeedEntry]] = []

    def read_while_the_writers_finish(after: pg.FeedPosition) -> list[pg.FeedEntry]:
        got = engine.feed(after, 50)
        if not stop.is_set():
            append_retrying(engine, "s")  # commits after the read's snapshot was taken
            stop.set()  # every writer is done before the read returns
        answers.append(got)
        return got

    seen = tail_feed(read_while_the_writers_finish, stop)
    assert answers[0] == []  # the read that ran across the commit does not have it
    assert [(e.session_id, e.seq) for e in seen] == [("s", 1)]
    assert seen == engine.feed()


def test_feed_holds_back_lines_behind_any_older_transaction(
    engine: pg.PostgresEngine, pg_url: str
) -> None:
    """An append acknowledged to its writer stays out of the feed while any transaction
    that got its id earlier is running, whatever it does and wherever (here one that only
    took an id, in no eventstore table, and then rolls back): a reader's empty answer
    after its writers finished does not mean it holds their lines."""
    conninfo = pg.split_url(pg_url)[0]
    with psycopg.connect(conninfo) as other:  # an explicit transaction: stays open
        other.execute("SELECT pg_current_xact_id()")
        append_retrying(engine, "s")
        assert engine.head("s").seq == 1 and engine.read("s", None).data
        assert engine.feed() == []  # held back, not skipped
        other.rollback()
    assert [(e.session_id, e.seq) for e in engine.feed()] == [("s", 1)]


@contextlib.contextmanager
def _second_cluster() -> Iterator[str]:
    """A throwaway PostgreSQL cluster of its own (initdb-ed fresh by
    `.ci/start-postgres.sh`, so its transaction ids start low), stopped and removed at
    the end: the URL of its `eventstore_test` database."""
    if os.geteuid() != 0 or not os.environ.get("EVENTSTORE_PG_BINDIR"):
        if os.environ.get("CI") == "true":
            pytest.fail("a second cluster needs root and .ci/start-postgres.sh")
        pytest.skip("a second cluster needs root and a server from .ci/start-postgres.sh")
    env = {k: v for k, v in os.environ.items() if k != "EVENTSTORE_TEST_POSTGRES_URL"}
    script = '. .ci/start-postgres.sh && echo "URL=$EVENTSTORE_TEST_POSTGRES_URL" && read _'
    proc = subprocess.Popen(
        ["bash", "-c", script], cwd=REPO, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = proc.stdout.readline()
        assert line.startswith("URL="), f"the second cluster did not start: {line!r}"
        yield line[4:].strip()
    finally:
        proc.stdin.close()  # `read` returns, the shell exits, its trap stops the server
        proc.wait(120)


def _xid(conninfo: str) -> int:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return int(conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0])


@pytest.mark.slow
def test_feed_positions_survive_a_restore_into_another_cluster(pg_url: str) -> None:
    """Issue 29 item 11: positions were transaction ids, and a pg_dump restored into a
    new cluster (whose ids start over, below the old ones) gave a reader resuming from
    its saved position 0 of the new lines, and the full feed put a session's new seq
    6..10 before its seq 1..5. A real second cluster, fresh from initdb; the old one's
    ids pushed past it so the case is the issue's whatever ran before. Lines still held
    back when the dump was taken (an idle transaction open) come after the old ones."""
    conninfo, schema = pg.split_url(pg_url)
    bindir = Path(os.environ["EVENTSTORE_PG_BINDIR"])
    with _second_cluster() as new_server:
        new_conninfo = pg.split_url(new_server)[0]
        for _ in range(max(0, _xid(new_conninfo) + 100 - _xid(conninfo))):
            _xid(conninfo)  # the old cluster's ids lie above the new one's
        with pg.from_url(pg_url) as old:
            for _ in range(5):
                append_retrying(old, "s")
            read = old.feed()
            saved = read[-1].position
            with psycopg.connect(conninfo) as idle:
                idle.execute("SELECT pg_current_xact_id()")
                append_retrying(old, "t", 2)  # committed, held back by `idle`
                dump = subprocess.run(
                    [bindir / "pg_dump", "-n", schema, "--no-owner", conninfo],
                    capture_output=True, check=True,
                ).stdout  # fmt: skip
        assert _xid(new_conninfo) < _xid(conninfo)  # the case of the issue
        subprocess.run(
            [bindir / "psql", "-q", "-v", "ON_ERROR_STOP=1", new_conninfo],
            input=dump, capture_output=True, check=True,
        )  # fmt: skip
        with pg.from_url(with_query(new_server, schema=schema)) as new:
            for _ in range(5):
                append_retrying(new, "s")
            resumed = feed_once_released(new, 12)[len(read) :]
            assert new.feed(saved) == resumed
            assert [(e.session_id, e.seq) for e in resumed] == [
                ("t", 1), ("t", 2), *[("s", n) for n in range(6, 11)]
            ]  # fmt: skip
            full = new.feed()
            assert full[: len(read)] == read  # the old positions mean the same lines
            for sid, n in (("s", 10), ("t", 2)):
                assert [e.seq for e in full if e.session_id == sid] == list(range(1, n + 1))


def test_a_schema_of_version_1_keeps_its_feed_positions(pg_url: str) -> None:
    """Upgrading a version-1 schema numbers the lines already released in the order
    version 1 gave them, and a version-1 position (tx, pos) a reader saved is still
    taken: it resumes after the same line."""
    from eventstore.engines.postgres.schema import ddl

    conninfo, schema = pg.split_url(pg_url)
    q = quote_schema(schema)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(ddl(schema, 1))
        conn.execute(f"INSERT INTO {q}.meta VALUES ('schema_version', '1')")
        batch = make_batch(EMPTY_HEAD, 1)  # through version 1's own append function
        conn.execute(
            f"SELECT * FROM {q}.append('a', 0, '', 1, %s, %s, %s, false, NULL, NULL)",
            ([batch.data], batch.hashes[-1], batch.link),
        )
        legacy = conn.execute(f"SELECT tx::text, pos FROM {q}.lines").fetchone()
    with pg.from_url(pg_url) as engine:
        append_retrying(engine, "b")
        append_retrying(engine, "a")
        full = engine.feed()
        assert [(e.session_id, e.seq) for e in full] == [("a", 1), ("b", 1), ("a", 2)]
        assert engine.feed((int(legacy[0]), int(legacy[1]))) == full[1:]
        assert engine.feed(full[0].position.seq) == full[1:] == engine.feed(full[0].position)
        for bad in ("3", (1, 2, 3), -1, 1.5, (None, 1)):
            with pytest.raises(InvalidArgumentError, match="no feed position"):
                engine.feed(bad)  # type: ignore[arg-type]


def test_a_schema_of_version_4_is_upgraded_in_place(pg_url: str) -> None:
    """Sessions written through version 4's `append` (a keyed batch among them) read the
    same after the upgrade to version 5, append on from their heads, refuse a stale
    head, keep their feed order, and a removed one takes its lines with it."""
    from eventstore.engines.postgres.schema import ddl

    conninfo, schema = pg.split_url(pg_url)
    q = quote_schema(schema)
    old: dict[str, Head] = {}
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for version in range(1, 5):
            conn.execute(ddl(schema, version))
        conn.execute(f"INSERT INTO {q}.meta VALUES ('schema_version', '4')")
        for sid, n, key in (("a", 2, "k1"), ("b", 1, None), ("a", 3, None)):
            head = old.get(sid, EMPTY_HEAD)
            batch = make_batch(head, n, key=key)
            row = conn.execute(
                f"SELECT * FROM {q}.append(%s, %s, %s, %s, %s, %s, %s, false, %s, %s)",
                (sid, head.seq, head.link, batch.first_seq,
                 [line + b"\n" for line in batch.data.split(b"\n")[:-1]],
                 batch.hashes[-1], batch.link, key, batch.fingerprint),
            ).fetchone()  # fmt: skip
            assert row is not None and row[0] is False
            old[sid] = Head(seq=int(row[2]), link=row[3])
    with pg.from_url(pg_url) as engine:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            version = conn.execute(
                f"SELECT value FROM {q}.meta WHERE name = 'schema_version'"  # noqa: S608
            ).fetchone()
        assert version == (str(pg.SCHEMA_VERSION),) and pg.SCHEMA_VERSION == 5
        a = engine.head("a")
        assert (a.seq, a.link, a.base_seq) == (5, old["a"].link, 1)
        assert a.size == len(engine.read("a", None).data)
        check_chain(engine.read("a", None).data)
        with pytest.raises(HeadMovedError):
            engine.append("a", make_batch(old["b"]), old["b"])
        assert append_retrying(engine, "a", 2).seq == 7 and append_retrying(engine, "b").seq == 2
        check_chain(engine.read("a", None).data)
        feed = [(e.session_id, e.seq) for e in feed_once_released(engine, 9)]
        assert feed == [*(("a", i) for i in (1, 2)), ("b", 1), *(("a", i) for i in range(3, 8)),
                        ("b", 2)]  # fmt: skip
        assert engine.remove_session("a") is True
        with psycopg.connect(conninfo, autocommit=True) as conn:
            left = conn.execute(f"SELECT count(*) FROM {q}.lines").fetchone()  # noqa: S608
        assert left == (2,)  # b's two lines


def _other_database(conninfo: str) -> str:
    """The libpq URL of the server's `postgres` database (not the tests' one)."""
    return urlunsplit(urlsplit(conninfo)._replace(path="/postgres"))


@pytest.mark.parametrize("where", ["this database", "another database"])
def test_a_feed_held_back_by_an_idle_transaction_says_by_what(
    pg_url: str, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 29 item 12: one session idle in a transaction that wrote anything (here it
    only took an id), in this database or another, held the feed back for as long as it
    lasted, and nothing said so. Now `feed_blockers` names it (pid, xid, database,
    state, since when), and a feed read held back behind it past `stall_warning` logs a
    warning naming it, once."""
    conninfo = pg.split_url(pg_url)[0]
    other_url = conninfo if where == "this database" else _other_database(conninfo)
    with pg.from_url(pg_url, stall_warning=0) as engine, psycopg.connect(other_url) as idle:
        xid = int(idle.execute("SELECT pg_current_xact_id()::text").fetchone()[0])
        database = idle.info.dbname
        append_retrying(engine, "s")
        assert engine.feed_blockers()[0].xid == xid
        [blocker] = engine.feed_blockers()
        assert (blocker.pid, blocker.gid, blocker.database) == (
            idle.info.backend_pid,
            None,
            database,
        )
        assert blocker.state == "idle in transaction" and blocker.since is not None
        with caplog.at_level("WARNING", logger="eventstore"):
            assert engine.feed() == [] and engine.feed() == [] and engine.feed() == []
        warned = [r.getMessage() for r in caplog.records if "held back" in r.getMessage()]
        assert len(warned) == 1 and f"pid {idle.info.backend_pid}" in warned[0]
        assert f"xid {xid}" in warned[0] and "idle_in_transaction_session_timeout" in warned[0]
        idle.rollback()
        assert engine.feed_blockers() == []
        assert [(e.session_id, e.seq) for e in engine.feed()] == [("s", 1)]


def test_a_feed_held_back_by_a_prepared_transaction_names_its_gid(pg_url: str) -> None:
    """An orphaned PREPARE TRANSACTION (its connection gone) holds the feed back until
    someone commits or rolls it back: `feed_blockers` names its gid."""
    conninfo = pg.split_url(pg_url)[0]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        allowed = int(conn.execute("SHOW max_prepared_transactions").fetchone()[0])
    if not allowed:  # .ci/start-postgres.sh allows them; a server given from outside may not
        if os.environ.get("CI") == "true":
            pytest.fail("the test server refuses PREPARE TRANSACTION (max_prepared_transactions)")
        pytest.skip("the server refuses PREPARE TRANSACTION (max_prepared_transactions = 0)")
    gid = f"orphan-{uuid.uuid4().hex[:8]}"
    with pg.from_url(pg_url) as engine:
        with psycopg.connect(conninfo) as prep:
            prep.execute("SELECT pg_current_xact_id()")
            prep.execute(f"PREPARE TRANSACTION '{gid}'")
        try:
            append_retrying(engine, "s")
            [blocker] = engine.feed_blockers()
            assert (blocker.gid, blocker.pid) == (gid, None) and blocker.since is not None
            assert engine.feed() == []
        finally:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute(f"ROLLBACK PREPARED '{gid}'")
        assert [(e.session_id, e.seq) for e in engine.feed()] == [("s", 1)]


def _waiting_backends(conninfo: str, wait_event: str) -> list[tuple[int, str | None]]:
    """(pid, transaction id) of the backends running `append` and waiting on `wait_event`."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, backend_xid::text FROM pg_stat_activity"
            " WHERE wait_event = %s AND query LIKE '%%.append(%%'",
            (wait_event,),
        ).fetchall()
    return [(int(r[0]), r[1]) for r in rows]


def test_an_append_waiting_for_its_session_has_no_transaction_id_yet(
    engine: pg.PostgresEngine, pg_url: str
) -> None:
    """An append takes its session's advisory lock before anything gives it a
    transaction id: one queued behind another append to the same session holds no id
    while it waits (so it holds no feed line back), gets its id, its feed position, only
    after that one committed, and its lines come after that one's."""
    conninfo = pg.split_url(pg_url)[0]
    batch = make_batch(EMPTY_HEAD, 1, tag="first")
    errors: list[BaseException] = []

    def second() -> None:
        try:
            append_retrying(engine, "a", tag="second")
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    with psycopg.connect(conninfo) as first:  # an explicit transaction: stays open
        first.execute(
            f"SELECT moved FROM {quote_schema(engine.schema)}"
            ".append(%s, 0, '', 1, %s, %s, %s, false, NULL, NULL)",
            ("a", [batch.data], batch.hashes[-1], batch.link),
        )
        first_tx = first.execute("SELECT pg_current_xact_id()::text").fetchone()
        t = threading.Thread(target=second)
        t.start()
        deadline = time.monotonic() + 20
        waiting: list[tuple[int, str | None]] = []
        while not waiting and time.monotonic() < deadline:
            time.sleep(0.02)
            waiting = _waiting_backends(conninfo, "advisory")
        assert waiting, "the second append never waited for the session's advisory lock"
        assert [xid for _, xid in waiting] == [None]  # no transaction id while it waits
        first.commit()
    t.join(20)
    assert not errors and not t.is_alive()
    got = engine.feed()
    assert [(e.session_id, e.seq) for e in got] == [("a", 1), ("a", 2)]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        txs = conn.execute(
            f"SELECT tx::text FROM {quote_schema(engine.schema)}.lines ORDER BY feed_seq"
        ).fetchall()
    assert first_tx is not None and txs[0][0] == first_tx[0] and int(txs[0][0]) < int(txs[1][0])
    assert got[0].position < got[1].position


def test_compaction_and_repair_never_put_a_line_behind_a_reader(
    engine: pg.PostgresEngine,
) -> None:
    """Installing a snapshot (keeping history or not) and a repair only take lines out
    of the feed: every line of the feed after each of them was there before at the same
    position, or lies above every position a reader could have passed."""
    feeds: list[list[pg.FeedEntry]] = []

    def check() -> None:
        now = engine.feed(pg.FEED_START, 100_000)
        if feeds:
            before = {e.position: e for e in feeds[-1]}
            top = max(before)
            for e in now:
                assert before.get(e.position, e) == e and (e.position in before or e.position > top)
        feeds.append(now)

    for sid in ("s", "t", "s", "s", "t", "s"):
        append_retrying(engine, sid, 2)
    check()
    h = engine.head("s")
    engine.install_snapshot("s", snapshot_line(h), h, keep_history=True)
    check()
    assert len(feeds[1]) == len(feeds[0])  # kept history stays in the feed, unmoved
    append_retrying(engine, "s")
    check()
    h = engine.head("s")
    engine.install_snapshot("s", snapshot_line(h), h, keep_history=False)
    check()
    kept = list(range(1, 9))  # the history the first install kept; seq 9 was dropped
    assert [e.seq for e in feeds[-1] if e.session_id == "s"] == kept
    append_retrying(engine, "s", 3)
    check()
    with engine.hold("s") as hold:
        hold.keep_prefix(len(hold.data) - len(feeds[-1][-1].line), "cut")
    check()
    assert [e.seq for e in feeds[-1] if e.session_id == "s"] == [*kept, 10, 11]
    append_retrying(engine, "s")
    check()
    assert [e.seq for e in feeds[-1] if e.session_id == "s"] == [*kept, 10, 11, 12]


# -- hostile input ---------------------------------------------------------------------

HOSTILE_IDS = [
    "'; DROP TABLE lines; --",
    'x"); DROP SCHEMA public CASCADE; --',
    "$fn$ SELECT 1 $fn$",
    "%s %(sid)s {0} \\x00",
    "ünïcødé/../../etc/passwd",
    " leading and trailing ",
    "a" * 1024,
]


def test_hostile_session_ids_and_keys_are_only_data(engine: pg.PostgresEngine, pg_url: str) -> None:
    for sid in HOSTILE_IDS:
        head = EMPTY_HEAD
        b = make_batch(head, 2, key=sid, tag=sid)
        engine.append(sid, b, head)
        assert engine.read(sid, None).data == b.data
    assert engine.list_sessions() == sorted(HOSTILE_IDS)
    with psycopg.connect(pg.split_url(pg_url)[0], autocommit=True) as conn:
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s", (engine.schema,)
            )
        }
        keys = {
            r[0]
            for r in conn.execute(f"SELECT key FROM {quote_schema(engine.schema)}.idempotency_keys")
        }
    assert {"lines", "sessions", "snapshots", "idempotency_keys", "saved"} <= tables
    assert keys == {pg._stored_key(k) for k in HOSTILE_IDS}  # a long one by its digest
    for sid in HOSTILE_IDS:
        assert engine.remove_session(sid)
    assert engine.list_sessions() == []


@pytest.mark.parametrize("schema", ["Upper", "x; DROP TABLE y", 'a"b', "1abc", "a" * 41, "", "a-b"])
def test_hostile_schema_names_are_refused(server_url: str, schema: str) -> None:
    with pytest.raises(ValueError, match="schema name"):
        pg.from_url(with_query(server_url, schema=schema))


@settings(max_examples=200, deadline=None)
@given(
    user=st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=8),
    password=st.text(min_size=0, max_size=30),
)
def test_redact_url_never_shows_the_password(user: str, password: str) -> None:
    from urllib.parse import quote

    secret = quote("§§" + password, safe="")  # the marker cannot occur in the rest
    marker = quote("§§", safe="")
    url = f"postgresql://{user}:{secret}@db.example:5432/x?sslmode=require"
    red = pg.redact_url(url)
    assert red == f"postgresql://{user}:***@db.example:5432/x?sslmode=require"
    red2 = pg.redact_url(f"postgresql://h/x?password={secret}&user={user}")
    assert marker not in red2
    assert parse_qsl(urlsplit(red2).query) == [("password", "***"), ("user", user)]


def test_storage_errors_name_the_url_without_the_password(server_url: str) -> None:
    parts = urlsplit(server_url)
    user = parts.username or "postgres"
    bad = urlunsplit(parts._replace(netloc=f"{user}:s3cr3t-pw@127.0.0.1:1", path="/nowhere"))
    with pytest.raises(StorageError) as info:
        pg.from_url(bad)
    assert "s3cr3t-pw" not in str(info.value) and "***" in str(info.value)


_MARK = "\u2603"  # in no message of eventstore, libpq or the server


def _marked(text: str) -> str:
    """`text` with the marker after every character: any leaked piece of two characters
    or more shows the marker, as written or percent-encoded."""
    return "".join(c + _MARK for c in text) or _MARK


def _leaks(text: str) -> bool:
    return _MARK in text or quote(_MARK).lower() in text.lower() or "\\u2603" in text


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    password=st.text(
        st.one_of(st.sampled_from("%@:/?#&=+ '\\"), st.characters(codec="utf-8")),
        max_size=12,
    ).map(_marked),
    form=st.sampled_from(["raw", "encoded", "password=", "sslpassword="]),
    target=st.sampled_from(["closed port", "no such role"]),
)
# a line break in a raw password: urllib drops it from the URL libpq quotes back
@example(password="0\u2603 \u2603\r\u2603", form="raw", target="closed port")
def test_no_password_reaches_a_message_repr_or_the_cli(
    server_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    password: str,
    form: str,
    target: str,
) -> None:
    """Issue 29 item 13: whatever the password holds (`%`, `@`, `:`, `/`, unicode) and
    wherever the URL gives it, a failing open or connect shows none of it: not in the
    error, its repr, `engine.url`, nor anything the CLI prints."""
    parts = urlsplit(server_url)
    host = f"127.0.0.1:{parts.port}" if target == "no such role" else "127.0.0.1:1"
    enc = quote(password, safe="")
    url = {
        "raw": f"postgresql://nobody_{uuid.uuid4().hex[:6]}:{password}@{host}/x",
        "encoded": f"postgresql://nobody_{uuid.uuid4().hex[:6]}:{enc}@{host}/x",
        "password=": f"postgresql://nobody@{host}/x?password={enc}&sslmode=disable",
        "sslpassword=": f"postgresql://nobody@{host}/x?sslpassword={enc}&sslmode=disable",
    }[form]
    assert not _leaks(pg.redact_url(url))
    with pytest.raises(EventStoreError) as info:
        SessionStore(url)
    for shown in (str(info.value), repr(info.value), repr(info.value.args)):
        assert not _leaks(shown), shown
    capsys.readouterr()
    for argv in (["sessions", url], ["init-db", url], ["migrate", url, str(tmp_path), "--all"]):
        rc, out, err = cli_in_process(capsys, *argv)
        assert rc != 0 and not _leaks(out + err), (argv[0], out + err)


def test_a_failing_engine_shows_its_url_without_the_password(server_url: str) -> None:
    """The password of a URL that opens shows in no `engine.url`, `store.url` or repr."""
    parts = urlsplit(server_url)
    user = parts.username or "postgres"
    url = urlunsplit(parts._replace(netloc=f"{user}:50%25off%40x@{parts.hostname}:{parts.port}"))
    with SessionStore(with_query(url, sslpassword="k3y-secret")) as store:
        for shown in (store.url, store.engine.url, repr(store.engine)):
            assert "50%" not in shown and "off" not in shown and "k3y" not in shown
            assert ":***@" in shown and "sslpassword=***" in shown


def test_a_password_libpq_would_misread_is_refused_unquoted(server_url: str) -> None:
    """`postgresql://app:50%off@...`: libpq said `invalid percent-encoded token: "50%off"`;
    now a typed error tells how to write it, without quoting it, and nothing connects."""
    host = urlsplit(server_url).netloc.rpartition("@")[2]
    for password in ("50%off", "p@ss", "a/b", "x?y", "h#sh"):
        with pytest.raises(InvalidArgumentError, match="percent-encoded") as info:
            SessionStore(f"postgresql://app:{password}@{host}/x")
        assert password not in str(info.value) and "app:***@" in str(info.value)


def test_a_url_with_no_host_or_an_upper_case_scheme_opens(server_url: str) -> None:
    """`postgresql:///db?host=...&port=...` (no authority: a socket, a service file, hosts
    given as parameters) and `POSTGRESQL://...` (schemes are case-insensitive) open the
    store; a password given as a parameter shows nowhere (0.1.0: the first became
    `postgresql:/db?host=...`, which libpq read as an invalid key=value option; the second
    was a bare ValueError)."""
    parts = urlsplit(server_url)
    user = parts.username or "postgres"
    schema = f"s_{uuid.uuid4().hex[:8]}"
    query = f"host=127.0.0.1&port={parts.port}&user={user}&password=pw-s3cret&schema={schema}"
    urls = [
        f"postgresql://{parts.path}?{query}",
        with_query(server_url.replace("postgresql://", "POSTGRESQL://", 1), schema=schema),
    ]
    for url in urls:
        with SessionStore(url) as store:
            store.append_progress_entry("s", _entry("x"))
            assert "s3cret" not in store.url + store.engine.url + repr(store.engine)
    with SessionStore(with_query(server_url, schema=schema)) as store:
        assert store.last_seq("s") == 2


def test_a_libpq_key_value_string_is_refused_not_taken_for_a_directory(
    server_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`host=... password=...` was opened as a directory of that name (created in the
    working directory), and `engine.url` showed the password."""
    monkeypatch.chdir(tmp_path)
    parts = urlsplit(server_url)
    conninfo = f"host=127.0.0.1 port={parts.port} user=app password='kv s3cret' dbname=x"
    for text in (conninfo, "dbname=x sslpassword=kv-s3cret"):
        with pytest.raises(UnknownEngineError, match="key=value") as info:
            SessionStore(text)
        assert "s3cret" not in str(info.value)
        for argv in (["sessions", text], ["init-db", text], ["migrate", text, "b", "--all"]):
            rc, out, err = cli_in_process(capsys, *argv)
            assert rc != 0 and "s3cret" not in out + err, out + err
    assert list(tmp_path.iterdir()) == []  # no directory made


def test_the_install_hint_names_the_distribution() -> None:
    """Without psycopg, opening a PostgreSQL URL names the extra of this project's
    distribution (`harness-eventstore[postgres]`), not another project's."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["psycopg"] = None
        from eventstore import SessionStore
        from eventstore.errors import UnknownEngineError
        try:
            SessionStore("postgresql://u@127.0.0.1:1/x")
        except UnknownEngineError as exc:
            print(exc)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    assert "pip install 'harness-eventstore[postgres]'" in out


# -- the schema -------------------------------------------------------------------------


def test_schema_is_versioned_and_refuses_a_newer_one(pg_url: str) -> None:
    conninfo, schema = pg.split_url(pg_url)
    assert pg.init_db(pg_url) == (0, pg.SCHEMA_VERSION)
    assert pg.init_db(pg_url) == (pg.SCHEMA_VERSION, pg.SCHEMA_VERSION)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'UPDATE "{schema}".meta SET value = %s', (str(pg.SCHEMA_VERSION + 1),))
    with pytest.raises(pg.SchemaVersionError, match="upgrade eventstore"):
        pg.from_url(pg_url)


def test_attack_a_reader_open_of_an_older_schema_upgrades_nothing(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack: opening a store of an older schema version with `create=False` (every
    read command of the CLI) upgraded it: a read wrote DDL, and a read-only role could
    not read at all. Now such an open is SchemaVersionError naming the version found,
    the one this code reads and how to upgrade (create=True, `init-db`), and writes
    nothing: the tables, functions and `meta` as they were; an open with create=True
    upgrades it."""
    from eventstore.engines.postgres.schema import ddl

    conninfo, schema = pg.split_url(pg_url)
    q = quote_schema(schema)

    def catalog(conn: Any) -> Any:
        return (
            conn.execute(f"SELECT name, value FROM {q}.meta ORDER BY name").fetchall(),  # noqa: S608
            conn.execute(
                "SELECT p.oid::regprocedure::text, md5(p.prosrc) FROM pg_proc p"
                " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s"
                " ORDER BY 1",
                (schema,),
            ).fetchall(),
            conn.execute(
                "SELECT table_name, column_name FROM information_schema.columns"
                " WHERE table_schema = %s ORDER BY 1, 2",
                (schema,),
            ).fetchall(),
        )

    with psycopg.connect(conninfo, autocommit=True) as conn:
        for version in range(1, 5):
            conn.execute(ddl(schema, version))
        conn.execute(f"INSERT INTO {q}.meta VALUES ('schema_version', '4')")
        before = catalog(conn)
    with pytest.raises(pg.SchemaVersionError) as raised:
        pg.from_url(pg_url, create=False)
    message = str(raised.value)
    assert "version 4" in message and f"version {pg.SCHEMA_VERSION}" in message
    assert "create=True" in message and "init-db" in message
    rc, _, err = cli_in_process(capsys, "sessions", pg_url)
    assert rc != 0 and "version 4" in err
    with psycopg.connect(conninfo, autocommit=True) as conn:
        assert catalog(conn) == before
    with pg.from_url(pg_url) as engine:  # create=True: the upgrade
        assert engine.list_sessions() == []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        assert catalog(conn)[0][-1] == ("schema_version", str(pg.SCHEMA_VERSION))


INIT_RACE = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from eventstore.engines.postgres.engine import from_url
    gate = Path(sys.argv[2])
    while not gate.exists():
        time.sleep(0.001)
    from_url(sys.argv[1]).close()
    """
)


def _release_when_ready(gate: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    """Open the gate once every worker has written its ready file (or one has died)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready = {p.name for p in gate.parent.glob("ready-*")}
        if all(f"ready-{p.pid}" in ready or p.poll() is not None for p in procs):
            break
        time.sleep(0.02)
    gate.touch()


def _spawn(script: str, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_schema_creation_race_creates_it_once(pg_url: str, tmp_path: Path) -> None:
    gate = tmp_path / "go"
    procs = [_spawn(INIT_RACE, pg_url, str(gate)) for _ in range(6)]
    time.sleep(1.0)
    gate.touch()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    conninfo, schema = pg.split_url(pg_url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        rows = conn.execute(f'SELECT name, value FROM "{schema}".meta').fetchall()
    assert sorted(rows)[1] == ("schema_version", str(pg.SCHEMA_VERSION))
    assert [name for name, _ in sorted(rows)] == ["cluster", "schema_version"]


# -- processes ----------------------------------------------------------------------------

# Workers go through the session API (`SessionStore(url)`): the face and the engine.
PRELUDE = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from eventstore import FeatureRecord, ProgressEntry, SessionManifest, SessionStore
    from eventstore.format.events import ProgressAppended

    def ready_then_wait(gate):
        (gate.parent / f"ready-{os.getpid()}").touch()
        while not gate.exists():
            time.sleep(0.0005)
    """
)

APPENDER = PRELUDE + textwrap.dedent(
    """
    url, sid, n, gate = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    store = SessionStore(url)
    store.last_seq(sid)  # connected
    ready_then_wait(gate)
    for i in range(n):
        store.append_progress_entry(sid, ProgressEntry(run_id=f"p{os.getpid()}", summary=str(i)))
    store.close()
    """
)


def test_four_processes_append_800_lines_to_one_session(pg_url: str, tmp_path: Path) -> None:
    pg.init_db(pg_url)
    gate = tmp_path / "go"
    procs = [_spawn(APPENDER, pg_url, "shared", "200", str(gate)) for _ in range(4)]
    _release_when_ready(gate, procs)
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err.decode()
    with SessionStore(pg_url) as store:
        data = store.engine.read("shared", None).data
        heads = check_chain(data)
        assert [h.seq for h in heads] == list(range(1, 801))
        report = store.verify("shared")
        assert report.ok and report.head_seq == 800
        progress = store.load_bootstrap_state("shared").recent_progress
        by_writer: dict[str, list[str]] = {}
        for entry in progress:
            by_writer.setdefault(entry.run_id, []).append(entry.summary)
        # every writer's 200 appends, each once, in its own order
        assert sorted(by_writer.values()) == [[str(i) for i in range(200)]] * 4


RACER = PRELUDE + textwrap.dedent(
    """
    url, gate, me = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    store = SessionStore(url)
    store.is_initialized("race")  # connected
    ready_then_wait(gate)
    won = store.initialize_session_if_missing(
        "race",
        SessionManifest(session_id="race", active_branch="main", current_objective=me),
        [FeatureRecord(id=me, category="c", description="d", steps=[], passes=False)],
        ProgressEntry(run_id=me, summary="init"),
    )
    print("won" if won else "lost")
    """
)


def test_init_race_has_exactly_one_winner(pg_url: str, tmp_path: Path) -> None:
    pg.init_db(pg_url)
    for round_ in range(3):
        gate = tmp_path / str(round_) / "go"
        gate.parent.mkdir()
        procs = [_spawn(RACER, pg_url, str(gate), f"w{i}") for i in range(5)]
        _release_when_ready(gate, procs)
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()
            outs.append(out.decode().strip())
        assert sorted(outs) == ["lost"] * 4 + ["won"]
        winner = f"w{outs.index('won')}"
        with SessionStore(pg_url) as store:
            state = store.load_bootstrap_state("race")
            assert state.manifest is not None and state.manifest.current_objective == winner
            assert [f.id for f in state.feature_list] == [winner]
            assert store.last_seq("race") == 3 and store.verify("race").ok
            assert store.delete_session("race", purge=True)


KILLED_WRITER = PRELUDE + textwrap.dedent(
    """
    store = SessionStore(sys.argv[1])
    ack = os.open(sys.argv[2], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    n = 0
    while True:
        res = store.append("victim", [
            ProgressAppended(entry=ProgressEntry(run_id="k", summary=f"{n}.{i}"))
            for i in range(3)
        ])
        n += 1
        os.write(ack, f"{res.last_seq}\\n".encode())  # acknowledged: the append returned
    """
)


def test_sigkilled_writer_loses_no_acknowledged_append(pg_url: str, tmp_path: Path) -> None:
    """A writer appending 3-event batches is SIGKILLed at a random moment, 20 times: every
    acknowledged batch is there, every batch is whole, the chain is unbroken."""
    import random

    pg.init_db(pg_url)
    ack = tmp_path / "ack"
    rng = random.Random(15)
    for _ in range(20):
        p = _spawn(KILLED_WRITER, pg_url, str(ack))
        # let it get going (imports take a while), then kill it at a random moment
        deadline = time.monotonic() + 30
        start = ack.stat().st_size if ack.exists() else 0
        while (not ack.exists() or ack.stat().st_size == start) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.05))
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    acked = [int(x) for x in ack.read_text().split()]
    with SessionStore(pg_url) as store:
        data = store.engine.read("victim", None).data
        assert store.verify("victim").ok
    heads = check_chain(data)
    assert heads[-1].seq % 3 == 0  # whole batches only
    assert all(h.more == 2 - (h.seq - 1) % 3 for h in heads)
    assert max(acked) <= heads[-1].seq
    assert len(acked) >= 20


def _backend_pids(conninfo: str, schema: str) -> list[int]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return [
            r[0]
            for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE query LIKE %s AND pid <> pg_backend_pid()"
                " AND wait_event_type = 'Lock'",
                (f'%"{schema}".append(%',),
            )
        ]


def test_dropped_connection_mid_append_is_a_typed_error(
    engine: pg.PostgresEngine, pg_url: str
) -> None:
    """The server ends the writer's connection while its append waits for the session's
    row lock: StorageError, nothing written; the engine's pool recovers and a retry of
    the same batch lands once."""
    h1 = append_retrying(engine, "s")
    conninfo = pg.split_url(pg_url)[0]
    batch = make_batch(h1, 2, key="k-retry")
    errors: list[BaseException] = []
    with psycopg.connect(conninfo) as blocker:
        blocker.execute(
            f"SELECT 1 FROM {quote_schema(engine.schema)}.sessions"
            " WHERE session_id = 's' FOR UPDATE"
        )

        def attempt() -> None:
            try:
                engine.append("s", batch, h1)
            except BaseException as exc:  # noqa: BLE001 - the test inspects it
                errors.append(exc)

        t = threading.Thread(target=attempt)
        t.start()
        deadline = time.monotonic() + 20
        pids: list[int] = []
        while not pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = _backend_pids(conninfo, engine.schema)
        assert pids, "the append never blocked on the row lock"
        with psycopg.connect(conninfo, autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
        t.join(20)
        blocker.rollback()
    assert len(errors) == 1 and isinstance(errors[0], StorageError), errors
    assert "connection" in str(errors[0])
    assert engine.head("s") == h1
    h2 = engine.append("s", batch, h1)
    assert h2.seq == 3
    with pytest.raises(HeadMovedError):
        engine.append("s", batch, h1)
    check_chain(engine.read("s", None).data)


def test_engine_survives_fork(engine: pg.PostgresEngine) -> None:
    append_retrying(engine, "s")
    assert engine.wait("s", None, 1.0)  # the listener connection is open too
    inherited = [(c, c.pgconn) for c in pg._CONNECTIONS]
    assert len(inherited) >= 2
    pid = os.fork()
    if pid == 0:  # the child uses its own connections, never the parent's
        code = 1
        try:
            append_retrying(engine, "s")
            # what finalizers at the child's exit would do to what it inherited: libpq
            # sends Terminate on close, which must not reach the parent's sessions
            for _, pgconn in inherited:
                pgconn.finish()
            code = 0
        finally:
            os._exit(code)
    assert wait_child(pid, 60) == 0
    assert append_retrying(engine, "s").seq == 3
    check_chain(engine.read("s", None).data)


def test_the_schema_checks_connection_is_the_pools_first_and_only_once(pg_url: str) -> None:
    """`Handover`: the connection an engine checks its schema on is what its pool's
    first connect gets (no second server session to start), once; the next connect
    opens another; one no pool took is closed with the engine."""
    conninfo = pg.split_url(pg_url)[0]
    handover = Handover()
    first = handover.connection_class.connect(conninfo, autocommit=True)
    handover.give(first)
    assert handover.connection_class.connect(conninfo, autocommit=True) is first
    with handover.connection_class.connect(conninfo, autocommit=True) as other:
        assert other is not first and other.info.backend_pid != first.info.backend_pid
    first.close()
    left = Handover()
    conn = left.connection_class.connect(conninfo)
    left.give(conn)
    left.close()
    assert conn.closed


def test_a_forked_child_never_takes_its_parents_first_connection(pg_url: str) -> None:
    handover = Handover()
    first = handover.connection_class.connect(pg.split_url(pg_url)[0], autocommit=True)
    handover.give(first)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if handover.take() is None else 2
        finally:
            os._exit(code)
    assert wait_child(pid, 60) == 0
    assert handover.take() is first  # still the parent's, and its session alive
    assert first.execute("SELECT 1").fetchone() == (1,)
    first.close()


# -- migrate ------------------------------------------------------------------------------


def _build_compacted(e: pg.PostgresEngine, sid: str, keep: tuple[bool, ...]) -> None:
    """A session with multi-line batches and one compaction per entry of `keep`."""
    append_retrying(e, sid, 3)
    for i, k in enumerate(keep):
        h = append_retrying(e, sid, 1 + i % 2)
        append_retrying(e, sid, 2)  # committed after what the snapshot covers
        e.install_snapshot(sid, snapshot_line(h), h, keep_history=k)
    append_retrying(e, sid, 2)


def _flat(e: pg.PostgresEngine, sid: str) -> list[bytes]:
    with e.history(sid) as hist:
        return [seg.read() for seg in hist]


def test_migrate_between_postgres_stores_is_exact_and_idempotent(server_url: str) -> None:
    from eventstore.ops.migrate import (
        MigrationError,
        migrate_session,
        same_history,
    )

    a_url = with_query(server_url, schema=f"t_{uuid.uuid4().hex[:12]}")
    b_url = with_query(server_url, schema=f"t_{uuid.uuid4().hex[:12]}")
    a, b = pg.from_url(a_url), pg.from_url(b_url)
    try:
        _build_compacted(a, "s", (True, True))
        _build_compacted(a, "hole", (True, False, True))
        seen: list[tuple[int, int]] = []
        res = migrate_session(a, b, "s", lambda d, t: seen.append((d, t)))
        assert res.written == res.total > 0 and res.already == 0 and seen[-1] == (res.total,) * 2
        assert _flat(a, "s") == _flat(b, "s") and same_history(a, b, "s")
        assert a.head("s").seq == b.head("s").seq
        again = migrate_session(a, b, "s")
        assert (again.written, again.already) == (0, res.total)
        # more appended at the source: a second run copies only that
        append_retrying(a, "s", 2)
        more = migrate_session(a, b, "s")
        assert more.written == 2 and _flat(a, "s") == _flat(b, "s")
        # a destination that diverged is refused and left as it was
        append_retrying(b, "s", 1, tag="other")
        before = _flat(b, "s")
        append_retrying(a, "s", 1)
        with pytest.raises(MigrationError, match="already holds other lines"):
            migrate_session(a, b, "s")
        assert _flat(b, "s") == before
        # a history with a hole cannot be replayed whole: refused, nothing written
        with pytest.raises(MigrationError, match="cannot be copied whole"):
            migrate_session(a, b, "hole")
        assert "hole" not in b.list_sessions() and _flat(b, "hole") == []
    finally:
        for e in (a, b):
            with psycopg.connect(pg.split_url(server_url)[0], autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {quote_schema(e.schema)} CASCADE")
            e.close()


def test_cli_init_db_and_migrate(server_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from eventstore.cli.app import main

    parts = urlsplit(server_url)
    user = parts.username or "postgres"
    # trust auth ignores the password: it must still never be printed
    secret_url = urlunsplit(
        parts._replace(netloc=f"{user}:hunter2-secret@{parts.hostname}:{parts.port}")
    )
    a_url = with_query(secret_url, schema=f"t_{uuid.uuid4().hex[:12]}")
    b_url = with_query(secret_url, schema=f"t_{uuid.uuid4().hex[:12]}")
    try:
        assert main(["init-db", a_url]) == 0
        assert main(["init-db", a_url]) == 0
        out = capsys.readouterr()
        v = pg.SCHEMA_VERSION
        assert f"created at version {v}" in out.out and f"already at version {v}" in out.out
        with pg.from_url(a_url) as a:
            assert "hunter2" not in a.url and ":***@" in a.url
            _build_compacted(a, "one", (True,))
            _build_compacted(a, "two", ())
        assert main(["migrate", a_url, b_url, "--all"]) == 0
        out = capsys.readouterr()
        assert "migrated 2 of 2" in out.out and "[2/2]" in out.err
        assert main(["migrate", a_url, b_url, "one", "--json"]) == 0
        out = capsys.readouterr()
        rows = msgspec.json.decode(out.out)
        assert rows[0]["written"] == 0 and rows[0]["ok"] is True
        assert main(["migrate", a_url, b_url]) == 2  # neither SESSIONs nor --all
        assert main(["migrate", a_url, b_url, "nope"]) == 1
        out = capsys.readouterr()
        assert "no session 'nope'" in out.err
        with pg.from_url(a_url) as a, pg.from_url(b_url) as b:
            assert _flat(a, "one") == _flat(b, "one") and _flat(a, "two") == _flat(b, "two")
        everything = out.out + out.err
        for text in (everything, str(capsys.readouterr())):
            assert "hunter2" not in text
    finally:
        with psycopg.connect(pg.split_url(server_url)[0], autocommit=True) as conn:
            for u in (a_url, b_url):
                conn.execute(f'DROP SCHEMA IF EXISTS "{pg.split_url(u)[1]}" CASCADE')


def test_reading_a_schema_that_is_not_there_never_creates_it(
    server_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`eventstore sessions|log|state URL?schema=typo`, `migrate` from it and `verify
    --witness` of it each created the schema (with its tables) they were only to read,
    then found nothing there. A read refuses it (exit 2; for a witness, a finding), and
    the schema is never made."""
    missing = with_query(server_url, schema=f"t_{uuid.uuid4().hex[:12]}")
    root = tmp_path / "store"
    with SessionStore(root) as s:
        s.append_progress_entry("s", ProgressEntry(run_id="r", summary="hi"))
    for argv in (
        ["sessions", missing],
        ["log", missing, "s"],
        ["state", missing, "s"],
        ["migrate", missing, str(tmp_path / "dst"), "--all"],
    ):
        rc, _, err = cli_in_process(capsys, *argv)
        assert rc == 2 and "no store in schema" in err, (argv, err)
    rc, out, _ = cli_in_process(capsys, "verify", str(root), "s", "--witness", missing, "--json")
    assert rc == 1 and "no store in schema" in out
    with psycopg.connect(pg.split_url(server_url)[0]) as conn:
        found = conn.execute(
            "SELECT 1 FROM pg_namespace WHERE nspname = %s", (pg.split_url(missing)[1],)
        ).fetchall()
    assert found == [] and not (tmp_path / "dst").exists()


def test_exporting_claude_code_lines_from_a_schema_that_is_not_there_never_creates_it(
    server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack: `eventstore export URL?schema=typo S --format claude-code` opened the store
    as a writer does, so it created the schema (with its tables) it was only to read.
    Now it refuses it (exit 2, one line) like every other read, and the schema is never
    made."""
    missing = with_query(server_url, schema=f"t_{uuid.uuid4().hex[:12]}")
    rc, out, err = cli_in_process(capsys, "export", missing, "s", "--format", "claude-code")
    assert rc == 2 and out == "" and "no store in schema" in err, err
    with psycopg.connect(pg.split_url(server_url)[0]) as conn:
        found = conn.execute(
            "SELECT 1 FROM pg_namespace WHERE nspname = %s", (pg.split_url(missing)[1],)
        ).fetchall()
    assert found == []


def _open_kind(kind: str, server_url: str, tmp: Path) -> tuple[str, Callable[[], None]]:
    """A new, empty store URL of an engine kind, and how to drop it."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    if kind == "file":
        return str(tmp / name), lambda: None
    if kind == "memory":
        return f"memory://{name}", lambda: None
    url = with_query(server_url, schema=name)

    def drop() -> None:
        with psycopg.connect(pg.split_url(server_url)[0], autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')

    return url, drop


def _kept(store: SessionStore, sid: str) -> tuple[int, bool]:
    """(the first seq the source keeps as an event, whether what it keeps is replayable:
    from seq 1, or the snapshot its history opens with, every later seq up to the head
    kept as a line)."""
    seqs: set[int] = set()
    opening: int | None = None
    with store.engine.history(sid) as hist:
        for i, seg in enumerate(hist):
            for n, line in enumerate(seg.read().splitlines()):
                head = _heads.decode(line)
                if head.type != "snapshot":
                    seqs.add(head.seq)
                elif i == 0 and n == 0:
                    opening = head.seq
    start = 1 if opening is None else opening + 1
    return min(seqs, default=start), seqs == set(range(start, store.last_seq(sid) + 1))


def _picture(store: SessionStore, sid: str) -> tuple[object, ...]:
    """What a reader gets of a session's history on any engine: every segment (archived
    or live) with its bytes, the events, the export, the verify verdict and head hash.
    Engines differ in one thing only: the snapshot line that opens a later archived
    segment (derived state, not an event) PostgreSQL keeps and the file and memory
    engines do not, so it is left out of the segments compared."""
    from eventstore.ops.export import export_jsonl

    with store.engine.history(sid) as hist:
        segments = []
        for i, seg in enumerate(hist):
            data = seg.read()
            if i and seg.archived and data.startswith(b'{"type":"snapshot"'):
                data = data[data.index(b"\n") + 1 :]
            segments.append((seg.archived, data))
    report = store.verify(sid)
    start = _kept(store, sid)[0]
    try:
        exported = b"".join(export_jsonl(store, sid))
    except EventStoreError as exc:
        exported = str(exc).encode()
    return (
        segments,
        list(store.read_events(sid, from_seq=start)),
        exported,
        report.ok,
        report.head_hash,
    )


_COMPACTION_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 4)),
        st.tuples(st.just("compact"), st.booleans()),
        st.tuples(st.just("prune"), st.integers(1, 40)),
    ),
    min_size=1,
    max_size=10,
)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=_COMPACTION_STEPS,
    kinds=st.tuples(*[st.sampled_from(["file", "memory", "postgres"])] * 2),
)
def test_migrate_copies_every_kept_byte_with_its_segments_or_writes_nothing(
    server_url: str, tmp_path: Path, steps: list[tuple[str, object]], kinds: tuple[str, str]
) -> None:
    """Issue 29 item 10: a session compacted with archive, then without, then with again
    (an archive of seq 1..20, seq 21..30 gone) was copied from seq 30 on, the archive of
    1..20 left behind, with `"ok": true`. Now, for any sequence of appends, compactions
    (archive or not) and prunes, between any two engines: the copy gives the same
    segments byte for byte (two archive segments come back as two), the same events,
    export and head hash; or, for a history no engine can replay, MigrationError and
    nothing at the destination."""
    from eventstore.ops.migrate import MigrationError, migrate_session, same_history

    (src_url, drop_src), (dst_url, drop_dst) = (_open_kind(k, server_url, tmp_path) for k in kinds)
    try:
        with SessionStore(src_url) as src, SessionStore(dst_url) as dst:
            n = 0
            for op, arg in [("append", 2), *steps]:
                if op == "append":
                    for _ in range(int(arg)):  # type: ignore[call-overload]
                        n += 1
                        src.append_progress_entry("s", ProgressEntry(run_id="r", summary=f"{n}"))
                elif op == "compact":
                    src.compact("s", archive=bool(arg), force=True)
                elif isinstance(src.engine, PruningEngine):
                    with contextlib.suppress(EventStoreError):
                        src.prune_archive("s", before=int(arg))  # type: ignore[call-overload]
            before = _picture(src, "s")
            if _kept(src, "s")[1]:
                migrate_session(src.engine, dst.engine, "s")
                assert _picture(dst, "s") == before
                again = migrate_session(src.engine, dst.engine, "s")
                assert again.written == 0 and same_history(src.engine, dst.engine, "s")
            else:
                with pytest.raises(MigrationError):
                    migrate_session(src.engine, dst.engine, "s")
                assert dst.list_sessions() == [] and dst.last_seq("s") == 0
            assert _picture(src, "s") == before  # the source is only read
    finally:
        drop_src()
        drop_dst()


def test_migrate_refuses_an_archive_then_a_compaction_without_one(
    tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The case of the issue, through the CLI: archive, no archive, archive: the copy
    was made from seq 30 on, exit 0, "ok": true, "history before seq 20 was not kept".
    Now exit 1, "ok": false, the error says why and how, and the destination is empty."""
    src = tmp_path / "src"
    with SessionStore(src) as store:
        n = 0
        for archive in (True, False, True):
            for _ in range(10 if n else 20):
                n += 1
                store.append_progress_entry("s", ProgressEntry(run_id="r", summary=f"{n}"))
            store.compact("s", archive=archive)
        store.append_progress_entry("s", ProgressEntry(run_id="r", summary="last"))
    rc, out, err = cli_in_process(capsys, "migrate", str(src), pg_url, "--all", "--json")
    rows = msgspec.json.decode(out)
    assert rc == 1 and rows[0]["ok"] is False, (out, err)
    assert "seq 21..30 were compacted without an archive" in rows[0]["error"]
    assert "--prune-archive-before 30" in rows[0]["error"]
    with SessionStore(pg_url) as dst:
        assert dst.list_sessions() == []
    # pruned before the hole's snapshot, the rest copies whole
    with SessionStore(src) as store:
        store.prune_archive("s", before=30)
    rc, out, err = cli_in_process(capsys, "migrate", str(src), pg_url, "--all", "--json")
    assert rc == 0, (out, err)
    with SessionStore(src) as a, SessionStore(pg_url) as b:
        assert _picture(a, "s") == _picture(b, "s")


# -- through the session API ---------------------------------------------------------------


def _block_session(conninfo: str, q: str, sid: str) -> psycopg.Connection[object]:
    """A connection holding the session's row lock in an open transaction."""
    blocker: psycopg.Connection[object] = psycopg.connect(conninfo)
    blocker.execute(f"SELECT 1 FROM {q}.sessions WHERE session_id = %s FOR UPDATE", (sid,))
    return blocker


def test_dropped_connection_then_retry_with_the_same_key_does_not_duplicate(
    pg_url: str,
) -> None:
    from eventstore import (
        Message,
        Role,
    )

    with SessionStore(pg_url) as store:
        engine = store.engine
        assert isinstance(engine, pg.PostgresEngine)
        conninfo = pg.split_url(pg_url)[0]
        store.append_progress_entry("s", ProgressEntry(run_id="r", summary="before"))
        msgs = [
            Message(role=Role.USER, content="hello"),
            Message(role=Role.ASSISTANT, content="hi"),
        ]
        errors: list[BaseException] = []
        blocker = _block_session(conninfo, quote_schema(engine.schema), "s")
        try:

            def attempt() -> None:
                try:
                    store.append_transcript_messages("s", msgs, idempotency_key="turn-7")
                except BaseException as exc:  # noqa: BLE001 - the test inspects it
                    errors.append(exc)

            t = threading.Thread(target=attempt)
            t.start()
            deadline = time.monotonic() + 20
            pids: list[int] = []
            while not pids and time.monotonic() < deadline:
                time.sleep(0.05)
                pids = _backend_pids(conninfo, engine.schema)
            assert pids, "the append never blocked on the row lock"
            with psycopg.connect(conninfo, autocommit=True) as killer:
                killer.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
            t.join(20)
        finally:
            blocker.rollback()
            blocker.close()
        assert len(errors) == 1 and isinstance(errors[0], StorageError), errors
        assert store.load_transcript_messages("s") == []
        first = store.append_transcript_messages("s", msgs, idempotency_key="turn-7")
        again = store.append_transcript_messages("s", msgs, idempotency_key="turn-7")
    with SessionStore(pg_url) as other:  # another process's view: the key is in the log
        third = other.append_transcript_messages("s", msgs, idempotency_key="turn-7")
        assert other.load_transcript_messages("s") == msgs
        assert other.last_seq("s") == 2 and other.verify("s").ok
    for res in (first, again, third):
        assert res is None or (res.first_seq, res.last_seq) == (2, 2)


def test_store_feed_and_follow(pg_url: str) -> None:
    with SessionStore(pg_url) as a, SessionStore(pg_url) as b:
        got: list[object] = []
        stop = threading.Event()

        def follow() -> None:
            for ev in b.follow("s", stop=stop):
                got.append(ev)
                if len(got) == 3:
                    return

        t = threading.Thread(target=follow)
        t.start()
        for i in range(3):
            a.append_progress_entry(
                "s" if i != 1 else "t", ProgressEntry(run_id="r", summary=str(i))
            )
        a.append_progress_entry("s", ProgressEntry(run_id="r", summary="3"))
        t.join(20)
        stop.set()
        assert [e.entry.summary for e in got] == ["0", "2", "3"]  # type: ignore[attr-defined]
        items = b.feed()
        assert [(sid, ev.entry.summary) for _, sid, ev in items] == [  # type: ignore[attr-defined]
            ("s", "0"),
            ("t", "1"),
            ("s", "2"),
            ("s", "3"),
        ]
        assert b.feed(items[1][0]) == items[2:]
        assert b.feed(limit=1) == items[:1]


def test_migrate_file_to_postgres_to_file_exports_identical_lines(
    pg_url: str, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    from eventstore import (
        Message,
        Role,
    )
    from eventstore.cli.app import main
    from eventstore.ops.export import export_jsonl

    src, back = str(tmp_path / "src"), str(tmp_path / "back")
    with SessionStore(src) as store:
        for sid in ("plain", "compacted", "ünï ¢ødé"):
            for i in range(5):
                store.append_progress_entry(sid, ProgressEntry(run_id="r", summary=f"{sid} {i}"))
                store.append_transcript_messages(
                    sid,
                    [
                        Message(role=Role.USER, content=f"q{i}"),
                        Message(role=Role.ASSISTANT, content="a"),
                    ],
                )
            if sid != "plain":
                store.compact(sid, archive=True)
                store.append_progress_entry(sid, ProgressEntry(run_id="r", summary="after"))
                store.compact(sid, archive=True)
                store.append_progress_entry(sid, ProgressEntry(run_id="r", summary="after 2"))
    assert main(["migrate", src, pg_url, "--all", "--quiet"]) == 0
    assert main(["migrate", pg_url, back, "--all", "--quiet"]) == 0
    assert main(["migrate", src, pg_url, "--all", "--quiet"]) == 0  # idempotent
    capsysbinary.readouterr()

    def export(root: str, sid: str) -> bytes:
        # what `eventstore export ROOT SID --format jsonl` prints
        with SessionStore(root) as store:
            return b"".join(export_jsonl(store, sid))

    for sid in ("plain", "compacted", "ünï ¢ødé"):
        lines = export(src, sid)
        assert lines and lines == export(pg_url, sid) == export(back, sid)
        for root in (src, pg_url, back):
            with SessionStore(root) as store:
                assert store.verify(sid).ok
                assert store.load_bootstrap_state(sid) == SessionStore(src).load_bootstrap_state(
                    sid
                )
    # the kept history holds the same lines (segment boundaries are the engines' own)
    with SessionStore(src) as a, SessionStore(back) as b:
        for sid in a.list_sessions():
            with a.engine.history(sid) as ha, b.engine.history(sid) as hb:
                assert _lines_by_seq(ha) == _lines_by_seq(hb)


class _Seq(msgspec.Struct):
    seq: int


def _lines_by_seq(history: History) -> dict[int, set[bytes]]:
    kept: dict[int, set[bytes]] = {}
    for segment in history:
        for line in segment.read().splitlines():
            kept.setdefault(msgspec.json.decode(line, type=_Seq).seq, set()).add(line)
    return kept


# -- README claims ---------------------------------------------------------------------------


def test_feed_holds_back_lines_behind_a_transaction_in_flight(
    engine: pg.PostgresEngine, pg_url: str
) -> None:
    """An append still in flight (its transaction open) holds back the feed lines of
    appends that committed after it began, so a reader never passes a place where a line
    can still appear; once it commits, the reader gets both, the earlier one first."""
    conninfo = pg.split_url(pg_url)[0]
    append_retrying(engine, "b")
    before = engine.feed()
    assert len(before) == 1
    batch = make_batch(EMPTY_HEAD, 1, tag="slow")
    with psycopg.connect(conninfo) as slow:  # an explicit transaction: stays open
        row = slow.execute(
            f"SELECT moved FROM {quote_schema(engine.schema)}"
            ".append(%s, 0, '', 1, %s, %s, %s, false, NULL, NULL)",
            ("a", [batch.data], batch.hashes[-1], batch.link),
        ).fetchone()
        assert row == (False,)
        append_retrying(engine, "b", tag="fast")  # commits while "a" is in flight
        assert engine.head("b").seq == 2
        assert engine.feed(before[-1].position) == []  # held back, not skipped
        slow.commit()
    after = engine.feed(before[-1].position)
    assert [(e.session_id, e.seq) for e in after] == [("a", 1), ("b", 2)]


def test_privileges_the_readme_lists_are_enough(pg_url: str) -> None:
    """An administrator runs init-db; an application role with only the documented grants
    appends, reads, compacts, follows, verifies and deletes."""
    conninfo, schema = pg.split_url(pg_url)
    pg.init_db(pg_url)
    role = f"es_app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        # the grants of the README's PostgreSQL section, verbatim
        admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        admin.execute(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}"
        )
        admin.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}")
    try:
        parts = urlsplit(pg_url)
        app_url = urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port or 5432}"))
        with SessionStore(app_url) as store:
            for i in range(4):
                store.append_progress_entry("s", ProgressEntry(run_id="r", summary=str(i)))
            store.compact("s", archive=True)
            store.append_progress_entry("s", ProgressEntry(run_id="r", summary="4"))
            assert [e.summary for e in store.load_bootstrap_state("s").recent_progress] == [
                str(i) for i in range(5)
            ]
            assert store.verify("s").ok and len(store.feed()) == 5
            assert store.engine.wait("s", None, 1.0) is True
            assert store.delete_session("s", purge=True)
        with (
            psycopg.connect(app_url.split("?")[0], autocommit=True) as app,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            app.execute(f"CREATE TABLE {schema}.intruder (x int)")
    finally:
        with psycopg.connect(conninfo, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


def _woken_by_an_append(writer: pg.PostgresEngine, follower: pg.PostgresEngine, head: Any) -> None:
    """An append by `writer` 0.3 s on wakes `follower`'s wait from `head` (its second
    line)."""
    timer = threading.Timer(0.3, append_retrying, (writer, "s"))
    timer.start()
    try:
        assert follower.wait("s", head.position, 30.0) is True
    finally:
        timer.join()
    assert follower.head("s").seq == 2


@contextlib.contextmanager
def _read_only_role(pg_url: str) -> Iterator[tuple[str, str]]:
    """A login role that may only SELECT in the store's schema (its `listen()` refuses
    to register it), and the store's URL as that role; dropped after."""
    conninfo, schema = pg.split_url(pg_url)
    role = f"es_ro_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        admin.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}")
    try:
        parts = urlsplit(pg_url)
        yield (
            role,
            urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port or 5432}")),
        )
    finally:
        with psycopg.connect(conninfo, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


def test_attack_a_read_only_follower_polls_without_reconnecting(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a follower under a read-only role (SELECT only: the schema's `listen()`
    refuses to register it) made its LISTEN connection again every 0.2 s for as long as
    it followed, each refused in turn; following still worked, by polling. Now a
    refusal stops the listener for `LISTEN_RETRY` seconds (a minute, doubled each
    time): one LISTEN connection, and a wait still wakes on an append (by polling)."""
    with pg.from_url(pg_url) as writer, _read_only_role(pg_url) as (_, ro_url):
        append_retrying(writer, "s")
        real_connect, made = psycopg.connect, []

        def counting(*args: Any, **kwargs: Any) -> Any:
            made.append(args)
            return real_connect(*args, **kwargs)

        monkeypatch.setattr(psycopg, "connect", counting)  # (the listener's connections)
        try:
            with pg.from_url(ro_url, create=False) as ro:
                head = ro.head("s")
                for _ in range(3):  # long enough for the old listener to reconnect often
                    assert ro.wait("s", head.position, 0.6) is False
                _woken_by_an_append(writer, ro, head)
            assert len(made) == 1, f"{len(made)} LISTEN connections"
        finally:
            monkeypatch.undo()


def test_attack_a_refused_follower_listens_once_its_role_may(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a follower whose registration the server refused (a SELECT-only role)
    polled for the engine's life, even once the role was granted what registering
    needs (or a standby promoted): never woken by a NOTIFY again. Now the refusal is
    tried again after `LISTEN_RETRY` seconds (doubled each time): once the role may, the
    follower registers and an append wakes it."""
    monkeypatch.setattr(pg, "LISTEN_RETRY", 0.05)
    conninfo, schema = pg.split_url(pg_url)
    with pg.from_url(pg_url) as writer, _read_only_role(pg_url) as (role, ro_url):
        append_retrying(writer, "s")

        def registered() -> int:
            with psycopg.connect(conninfo, autocommit=True) as admin:
                row = admin.execute(
                    f"SELECT count(*) FROM {schema}.listeners l JOIN pg_stat_activity a"
                    " ON a.pid = l.pid WHERE a.usename = %s",
                    (role,),
                ).fetchone()
                return int(row[0]) if row else 0

        with pg.from_url(ro_url, create=False) as ro:
            head = ro.head("s")
            assert ro.wait("s", head.position, 0.3) is False  # refused: it polls
            assert registered() == 0
            with psycopg.connect(conninfo, autocommit=True) as admin:
                admin.execute(f"GRANT INSERT, UPDATE, DELETE ON {schema}.listeners TO {role}")
            deadline = time.monotonic() + 30  # a hang detector, not a speed limit
            while registered() == 0:
                assert time.monotonic() < deadline, "the follower never listened again"
                ro.wait("s", head.position, 0.1)
            _woken_by_an_append(writer, ro, head)


def test_attack_listen_retries_hold_no_backend_and_close_ends_a_retry_wait(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a refused follower retrying LISTEN every few milliseconds (`LISTEN_RETRY`
    and `LISTEN_RETRY_MAX` made tiny) keeps no retry's connection (the role's backends
    stay at most its pool's plus the one retry under way), and the engine closed while a
    retry waits (a minute) ends the listener's thread and leaves no backend of the role
    (held)."""
    conninfo, _ = pg.split_url(pg_url)
    with pg.from_url(pg_url) as writer:
        append_retrying(writer, "s")
    with _read_only_role(pg_url) as (role, ro_url):
        _listen_retries_against(conninfo, role, ro_url, monkeypatch)


def _listen_retries_against(
    conninfo: str, role: str, ro_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The body of the attack above, as `role` (`ro_url`)."""

    def backends() -> int:
        with psycopg.connect(conninfo, autocommit=True) as admin:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (role,)
            ).fetchone()
            return int(row[0]) if row else 0

    def listeners() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "eventstore-listen"]

    before = set(listeners())
    monkeypatch.setattr(pg, "LISTEN_RETRY", 0.005)
    monkeypatch.setattr(pg, "LISTEN_RETRY_MAX", 0.01)
    ro = pg.from_url(ro_url, create=False)
    head = ro.head("s")
    pool_size = backends()
    seen = []
    for _ in range(30):  # many retries, each refused
        ro.wait("s", head.position, 0.05)
        seen.append(backends())
    assert max(seen) <= pool_size + 1, seen
    monkeypatch.setattr(pg, "LISTEN_RETRY", 60.0)  # the next engine's retry waits long
    monkeypatch.setattr(pg, "LISTEN_RETRY_MAX", 60.0)
    ro.close()
    ro = pg.from_url(ro_url, create=False)
    assert ro.wait("s", head.position, 0.3) is False  # refused: now it waits a minute
    ro.close()
    deadline = time.monotonic() + 30  # a hang detector, not a speed limit
    while set(listeners()) - before or backends():
        assert time.monotonic() < deadline, "a listener or a backend outlived close"
        time.sleep(0.05)


def test_postgres_scheme_alias_and_default_schema(server_url: str) -> None:
    conninfo, schema = pg.split_url(server_url.replace("postgresql://", "postgres://", 1))
    assert conninfo.startswith("postgresql://") and schema == "eventstore"
    with pytest.raises(ValueError, match="not a PostgreSQL URL"):
        pg.split_url("mysql://u:pw@h/db")


def test_feed_is_refused_by_engines_without_one(tmp_path: Path) -> None:
    with SessionStore(tmp_path / "store") as store:
        store.append_progress_entry("s", ProgressEntry(run_id="r", summary="x"))
        with pytest.raises(NotImplementedError, match="no global feed"):
            store.feed()


def test_async_store_over_postgres(pg_url: str) -> None:
    """The async API (a thread offload over SessionStore) works on this engine as is."""
    import asyncio

    from eventstore.aio import AsyncSessionStore

    async def main() -> list[str]:
        async with AsyncSessionStore(pg_url) as store:
            await asyncio.gather(
                *(
                    store.append_progress_entry(
                        f"s{i % 2}", ProgressEntry(run_id="r", summary=str(i))
                    )
                    for i in range(6)
                )
            )
            state = await store.load_bootstrap_state("s0")
            assert len(await store.feed()) == 6
            return [e.summary for e in state.recent_progress]

    assert asyncio.run(main()) == ["0", "2", "4"]


# -- attacks -------------------------------------------------------------------------------
#
# Attacks on the PostgreSQL engine from outside: rows edited with SQL behind the
# engine's back, writers, compactors and loaders in several processes, a fork while
# another thread holds the engine, connections ended by the server, inputs the file
# engine accepts. Every child process has a timeout.


def _sql(pg_url: str, statement: str, *args: object) -> None:
    """Run statements as an outsider (a connection of its own), `@S` the schema, every
    `%s` of every statement given the same args."""
    conninfo, schema = pg.split_url(pg_url)
    with psycopg.connect(conninfo, autocommit=True) as conn, conn.transaction():
        for one in statement.replace("@S", f'"{schema}"').split(";"):
            conn.execute(one, args[: one.count("%s")])


SID_ROW = "(SELECT sid FROM @S.sessions WHERE session_id = %s)"


def _entry(summary: str, run_id: str = "r") -> ProgressEntry:
    return ProgressEntry(run_id=run_id, summary=summary)


def _summaries(store: SessionStore, sid: str) -> list[str]:
    return [p.summary for p in store.load_bootstrap_state(sid).recent_progress]


def _build(pg_url: str, sid: str, n: int) -> None:
    with SessionStore(pg_url) as store:
        for i in range(n):
            store.append_progress_entry(sid, _entry(f"e{i}"))


def _cold_load_error(pg_url: str, sid: str, caches: bool = True) -> BaseException | list[str]:
    """What a load in a fresh store (a fresh process's view) gives: the summaries or
    the exception it raised."""
    with SessionStore(pg_url, caches=caches) as store:
        try:
            return _summaries(store, sid)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            return exc


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("turn\x007", id="nul"),
        pytest.param(secrets.token_hex(3000), id="6000-random-chars"),
    ],
)
def test_an_idempotency_key_the_file_engine_accepts_is_accepted(
    pg_url: str, tmp_path: Path, key: str
) -> None:
    """The face accepts any non-empty str encodable as UTF-8 as a key, and the file
    engine stores it (the key travels in the line, JSON-escaped). The PostgreSQL engine
    also copies the key into `idempotency_keys.key` (text, in a btree primary key):
    a NUL cannot be sent as text, and a key past ~2.7 kB that does not compress
    overflows a btree index row. Either way the append fails with a StorageError that
    no retry will ever get past (for the long key it even says the connection was lost
    and the batch may be committed)."""
    with SessionStore(tmp_path / "files") as files:
        first = files.append_progress_entry("s", _entry("x"), idempotency_key=key)
        again = files.append_progress_entry("s", _entry("x"), idempotency_key=key)
        assert (first.first_seq, again.replayed) == (1, True)
    with SessionStore(pg_url) as store:
        try:
            first = store.append_progress_entry("s", _entry("x"), idempotency_key=key)
        except StorageError as exc:
            pytest.fail(f"the file engine accepts this key; PostgreSQL: {exc}")
        again = store.append_progress_entry("s", _entry("x"), idempotency_key=key)
        assert (first.first_seq, again.replayed) == (1, True)
        assert _summaries(store, "s") == ["x"]


def test_a_server_side_refusal_is_not_reported_as_a_lost_connection(pg_url: str) -> None:
    """With `lock_timeout` set (an ordinary libpq `options` parameter of the URL), an
    append that waits too long for its session is rolled back by the server and the
    connection stays up. The engine reports every psycopg.OperationalError (lock and
    statement timeouts, program limits, a closed pool) as a lost connection after which
    the batch 'may or may not be committed': the caller is told to reconcile a batch
    that was definitely not written."""
    _build(pg_url, "s", 1)
    url = with_query(pg_url, options="-clock_timeout=200")  # (no space: see below)
    conninfo, schema = pg.split_url(pg_url)
    with psycopg.connect(conninfo) as blocker, SessionStore(url) as store:
        blocker.execute(
            f'SELECT 1 FROM "{schema}".sessions WHERE session_id = %s FOR UPDATE', ("s",)
        )
        with pytest.raises(StorageError) as info:
            store.append_progress_entry("s", _entry("late"))
        blocker.rollback()
        assert _summaries(store, "s") == ["e0"]  # nothing was written
    text = str(info.value)
    assert "lock timeout" in text
    assert "may or may not be committed" not in text, text


def test_libpq_parameters_with_spaces_reach_libpq_as_written(pg_url: str) -> None:
    """The README: every URL parameter but `schema` goes to libpq. `split_url` decodes
    the query and encodes it again with `urlencode`, which writes a space as `+`; libpq
    does not read `+` as a space. So `application_name=fleet worker` reaches the server
    as 'fleet+worker', and `options=-c lock_timeout=200` (the usual way to set a
    setting per connection) fails to connect: unrecognized parameter '+lock_timeout'."""
    name = f"fleet worker {uuid.uuid4().hex[:6]}"
    with SessionStore(with_query(pg_url, application_name=name)) as store:
        store.append_progress_entry("s", _entry("x"))
        conninfo, _ = pg.split_url(pg_url)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            names = {
                r[0]
                for r in conn.execute(
                    "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE %s",
                    (f"fleet%{name[-6:]}",),
                )
            }
    assert names == {name}


def test_a_deleted_last_row_is_not_folded_past(pg_url: str) -> None:
    """The `sessions` row records the head (seq 4 and its hash); the last line's row is
    deleted. A load folds seq 1..3 and returns that state as the state at seq 4 (its
    head is taken from the sessions row, never compared with the last line read), and
    the next append chains onto the missing line 4: from then on every load of the
    session raises CorruptLogError (`seq 5 where 4 was expected`). The file engine has
    one record of its head (the log) and goes on from seq 3; here the engine holds the
    evidence of the drop and ignores it."""
    _build(pg_url, "s", 4)
    _sql(pg_url, f"DELETE FROM @S.lines WHERE sid = {SID_ROW} AND seq = 4", "s")
    got = _cold_load_error(pg_url, "s")
    assert isinstance(got, CorruptLogError), (
        f"a load returned {got!r} as the state at seq 4 without event 4"
    )


def test_a_snapshot_row_without_bytes_is_a_typed_error(pg_url: str) -> None:
    """The live log's snapshot row lost its bytes (`line` is NULL: what a compaction
    without history does to the snapshot of the log it replaces; here done to the live
    one). A load raises a bare TypeError from `b"".join` in PostgresEngine.read instead
    of an EventStoreError."""
    _build(pg_url, "s", 4)
    with SessionStore(pg_url) as store:
        assert store.compact("s", force=True).compacted
        store.append_progress_entry("s", _entry("after"))
    _sql(pg_url, f"UPDATE @S.snapshots SET line = NULL WHERE sid = {SID_ROW}", "s")
    got = _cold_load_error(pg_url, "s")
    assert isinstance(got, EventStoreError), f"a load raised {got!r}"


def test_verify_of_a_history_with_a_gap_then_an_archive(pg_url: str) -> None:
    """Compactions with archive, without, with again (nothing edited): verify reports
    the last snapshot as edited ('snapshot_state' errors). It compares each snapshot
    with the fold of the archived events it has read (`so_far`), which a `history_gap`
    (a warning) does not reset; `_check_snapshot_states` only checks that they start at
    1 and end at the snapshot's seq, not that none is missing between. The same on the
    file and memory engines (verify.py is shared); found by writers racing a compactor
    that alternated `archive=`."""
    with SessionStore(pg_url) as store:
        n = 0
        for archive in (True, False, True):
            for _ in range(5):
                store.append_progress_entry("s", _entry(f"k{n}"), idempotency_key=f"k{n}")
                n += 1
            assert store.compact("s", archive=archive, force=True).compacted
        report = store.verify("s")
    assert report.ok, [(p.seq, p.kind, p.message) for p in report.problems]


def test_a_child_forked_while_a_thread_holds_the_engine_can_use_it(
    pg_url: str, tmp_path: Path
) -> None:
    """`PostgresEngine._lock` is taken on the first use of the pool (`_get_pool`) and on wait
    (`_get_listener`). If another thread holds it at the moment of a fork, the child's
    first call goes to `_get_pool`, sees a new pid and takes the inherited lock to reset
    its per-process state: held by a thread that does not exist in the child, forever.
    The file and memory engines give a forked child fresh locks (os.register_at_fork)."""
    with SessionStore(pg_url) as store:
        store.append_progress_entry("s", _entry("parent"))
        engine = store.engine
        assert isinstance(engine, pg.PostgresEngine)
        held, release = threading.Event(), threading.Event()
        report = tmp_path / "child-error"

        def holder() -> None:  # a thread inside the engine's lock (e.g. in an append)
            with engine._lock:
                held.set()
                release.wait(20)

        t = threading.Thread(target=holder)
        t.start()
        assert held.wait(10)
        try:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                code = 3
                try:
                    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # (not pytest-timeout's)
                    signal.alarm(4)
                    store.append_progress_entry("s", _entry("child"))
                    code = 0
                except BaseException as exc:  # noqa: BLE001 - reported through a file
                    Path(report).write_text(repr(exc))
                finally:
                    os._exit(code)
            status = wait_child(pid, 8)
        finally:
            release.set()
            t.join(10)
        why = report.read_text() if report.exists() else "killed or hung"
        assert status == 0, f"the child never finished its append (exit {status}: {why})"
        assert _summaries(store, "s") == ["parent", "child"]
        store.append_progress_entry("s", _entry("parent again"))
        assert store.verify("s").ok


TAMPERS = {
    "edit-bytes": (
        "UPDATE @S.lines SET line = convert_to(replace(convert_from(line, 'UTF8'),"
        " '\"e2\"', '\"X2\"'), 'UTF8') WHERE sid = {sid} AND seq = 3"
    ),
    "swap-seq": (
        "UPDATE @S.lines SET seq = 7 - seq + 1000 WHERE sid = {sid} AND seq IN (3, 4);"
        " UPDATE @S.lines SET seq = seq - 1000 WHERE sid = {sid} AND seq > 1000"
    ),
    "delete-middle": "DELETE FROM @S.lines WHERE sid = {sid} AND seq = 3",
    "insert-copy": (
        "INSERT INTO @S.lines (sid, seq, stream_off, line)"
        " SELECT sid, 7, 0, line FROM @S.lines WHERE sid = {sid} AND seq = 6"
    ),
    "edit-snapshot": (
        "UPDATE @S.snapshots SET line = convert_to(replace(convert_from(line, 'UTF8'),"
        " '\"e2\"', '\"X2\"'), 'UTF8') WHERE sid = {sid}"
    ),
    "truncate-snapshot": (
        "UPDATE @S.snapshots SET line = substring(line FROM 1 FOR length(line) - 20)"
        " || '\\x0a'::bytea WHERE sid = {sid}"
    ),
}


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_rows_edited_with_sql_are_never_folded(pg_url: str, tamper: str) -> None:
    """Each edit of a committed row: a cold load that reads the log raises
    CorruptLogError; one that starts from a fold cache (its state folded from lines
    checked before the edit: compaction keeps one at its snapshot) raises it or returns
    that state; a warm load (a store that folded the log before the edit and reads on)
    never returns the edited event (it raises CorruptLogError or returns what it held);
    and verify reports it."""
    with SessionStore(pg_url) as warm:
        for i in range(6):
            warm.append_progress_entry("s", _entry(f"e{i}"))
        if "snapshot" in tamper:
            assert warm.compact("s", archive=False, force=True).compacted
            warm.append_progress_entry("s", _entry("e6"))
        before = _summaries(warm, "s")
        _sql(pg_url, TAMPERS[tamper].format(sid=SID_ROW), "s")
        got = _cold_load_error(pg_url, "s", caches=False)
        assert isinstance(got, CorruptLogError), got
        got = _cold_load_error(pg_url, "s")
        assert isinstance(got, CorruptLogError) or got == before, got
        try:  # reads on from where it was: what it folds on top is checked
            after = _summaries(warm, "s")
        except CorruptLogError:
            pass
        else:
            assert "X2" not in "".join(after) and after[: len(before)] == before
        report = warm.verify("s")
        assert not report.ok


WORKER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from eventstore import ProgressEntry, SessionStore
    from eventstore.errors import CorruptLogError, EventStoreError, StorageError

    url, role, gate, out = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    store = SessionStore(url)
    store.last_seq("shared")
    (gate.parent / f"ready-{os.getpid()}").touch()
    while not gate.exists():
        time.sleep(0.001)
    stop = time.monotonic() + 2.0
    lines = []
    if role.startswith("w"):
        i = 0
        # at most 600 keys: a session remembers its newest 1,000, so a writer that lags
        # the others by more (a slow start) appends a key they evicted, as documented
        while time.monotonic() < stop and i < 600:
            # every key is also replayed by the next writer: keys cross processes
            key = f"k{i}"
            res = store.append_progress_entry(
                "shared", ProgressEntry(run_id=key, summary=key), idempotency_key=key
            )
            lines.append(f"{key} {res.first_seq} {int(res.replayed)}")
            i += 1
    elif role == "compactor":
        n = 0
        while time.monotonic() < stop:
            # without history (lines deleted under racing loads); see
            # test_verify_of_a_history_with_a_gap_then_an_archive for a mix with archives
            store.compact("shared", archive=False, force=True)
            n += 1
            time.sleep(0.02)
        lines.append(str(n))
    else:
        last = 0
        while time.monotonic() < stop:
            fresh = SessionStore(url)
            got = [p.run_id for p in fresh.load_bootstrap_state("shared").recent_progress]
            fresh.close()
            warm = [p.run_id for p in store.load_bootstrap_state("shared").recent_progress]
            for view in (got, warm):
                assert len(view) == len(set(view)), "a key folded twice"
                assert len(view) >= last, "a load went back"
                last = len(view)
        lines.append(str(last))
    store.close()
    out.write_text("\\n".join(lines))
    """
)


@pytest.mark.slow
def test_writers_replaying_keys_beside_a_compactor_and_loaders_in_processes(
    pg_url: str, tmp_path: Path
) -> None:
    """Three writer processes append keyed entries k0, k1, ... to one session (so each
    key is given by all three, racing), a fourth compacts in a loop (without
    archive), a fifth loads cold and warm: each key lands once, every writer is told the
    seq it landed at, seqs are contiguous and verify is clean."""
    pg.init_db(pg_url)
    gate = tmp_path / "go"
    roles = ["w0", "w1", "w2", "compactor", "loader"]
    procs = []
    for role in roles:
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER, pg_url, role, str(gate), str(tmp_path / role)],
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("ready-*"))) < len(procs):
            assert time.monotonic() < deadline, "workers never got ready"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.02)
        gate.touch()
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, err.decode()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
    told: dict[str, set[int]] = {}
    for role in ("w0", "w1", "w2"):
        for row in (tmp_path / role).read_text().split("\n"):
            key, seq, _ = row.split()
            told.setdefault(key, set()).add(int(seq))
    assert int((tmp_path / "compactor").read_text()) >= 2
    with SessionStore(pg_url) as store:
        events = list(store.read_events("shared"))
        progress = store.load_bootstrap_state("shared").recent_progress
        report = store.verify("shared")
        assert report.ok, report.problems
    keys = [p.run_id for p in progress]
    assert len(keys) == len(set(keys)) == store_last(pg_url)
    assert set(keys) == set(told)
    for key, seqs in told.items():  # every caller of a key was told one and the same seq
        assert len(seqs) == 1, (key, seqs)
    seqs = [e.seq for e in events if type(e).__name__ != "Snapshot"]
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))


def store_last(pg_url: str) -> int:
    with SessionStore(pg_url) as store:
        return store.last_seq("shared")


FEED_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from eventstore import Message, Role, SessionStore

    url, me, gate = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    store = SessionStore(url)
    store.last_seq(me)
    while not gate.exists():
        time.sleep(0.001)
    for i in range(60):
        sid = f"{me}-{i % 3}"
        n = 1 + i % 3
        store.append_transcript_messages(
            sid, [Message(role=Role.USER, content=f"{sid}:{i}.{j}") for j in range(n)]
        )
    store.close()
    """
)


@pytest.mark.slow
def test_a_feed_tailed_beside_writer_processes_is_complete_and_ordered(
    pg_url: str, tmp_path: Path
) -> None:
    """Four writer processes append batches of 1-3 messages to three sessions each while
    this process tails `feed()` with a small limit: positions only grow, every committed
    line arrives exactly once, and each session's lines arrive in seq order."""
    pg.init_db(pg_url)
    gate = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", FEED_WRITER, pg_url, f"w{i}", str(gate)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(4)
    ]
    seen: list[tuple[object, str, int]] = []
    try:
        with SessionStore(pg_url) as reader:
            time.sleep(0.5)
            gate.touch()
            after = None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                got = reader.feed(after, limit=7)
                seen.extend((pos, sid, ev.seq) for pos, sid, ev in got)
                if got:
                    after = got[-1][0]
                elif all(p.poll() is not None for p in procs):
                    if not reader.feed(after, limit=7):
                        break
                else:
                    time.sleep(0.005)
            for p in procs:
                _, err = p.communicate(timeout=60)
                assert p.returncode == 0, err.decode()
            seen.extend((pos, sid, ev.seq) for pos, sid, ev in reader.feed(after, 100000))
            expected = {sid: reader.last_seq(sid) for sid in reader.list_sessions()}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
    positions = [pos for pos, _, _ in seen]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    by_sid: dict[str, list[int]] = {}
    for _, sid, seq in seen:
        by_sid.setdefault(sid, []).append(seq)
    assert len(expected) == 12
    assert by_sid == {sid: list(range(1, last + 1)) for sid, last in expected.items()}


def _end_every_client_connection(pg_url: str) -> int:
    """What a server restart does to every client: their connections end."""
    conninfo, _ = pg.split_url(pg_url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_every_connection_ended_by_the_server_between_calls(pg_url: str) -> None:
    """The server ends every client connection between calls: a keyed append fails
    with a StorageError at most once per dead pooled connection, then lands once."""
    with SessionStore(pg_url) as store:
        store.append_progress_entry("s", _entry("e0"))
        assert _summaries(store, "s") == ["e0"]
        assert _end_every_client_connection(pg_url) >= 1
        failures = 0
        for _ in range(12):
            try:
                res = store.append_progress_entry("s", _entry("x"), idempotency_key="x")
                break
            except StorageError:
                failures += 1
        assert failures <= 8  # the pool's size
        assert (res.first_seq, res.replayed) == (2, False)
        assert store.append_progress_entry("s", _entry("x"), idempotency_key="x").replayed
        with SessionStore(pg_url) as fresh:
            assert _summaries(fresh, "s") == ["e0", "x"]
            assert fresh.verify("s").ok


def test_a_follower_survives_the_server_ending_its_connections(pg_url: str) -> None:
    """`follow` is built to outlive a dropped connection: its listener reconnects and
    bumps a generation so waiters look again. But the look is `self.head()` on a pooled
    connection the server also ended, and the StorageError it raises ends the follower
    (PostgresEngine.wait). A wait may return spuriously (Engine.wait's contract), so a
    failed look can be a wake-up; and a read is safe to retry on a fresh connection."""
    with SessionStore(pg_url) as store:
        store.append_progress_entry("s", _entry("e0"))
        got: list[object] = []
        stop = threading.Event()

        def follow() -> None:
            try:
                for ev in store.follow("s", stop=stop, poll_interval=5.0):
                    got.append(ev.seq)
            except Exception as exc:  # noqa: BLE001 - the test inspects it
                got.append(exc)

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        try:
            deadline = time.monotonic() + 10
            while not got and time.monotonic() < deadline:
                time.sleep(0.01)
            assert got == [1]
            assert _end_every_client_connection(pg_url) >= 2
            time.sleep(1.0)  # the listener reconnects; the follower looks again
            for _ in range(12):  # this thread's own calls may meet a dead connection
                try:
                    store.append_progress_entry("s", _entry("e1"), idempotency_key="e1")
                    break
                except StorageError:
                    pass
            deadline = time.monotonic() + 10
            while len(got) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            stop.set()
            t.join(10)
        assert got == [1, 2], got


def test_remove_session_racing_appending_threads(pg_url: str) -> None:
    """Two threads append while a third removes the session again and again: every
    call returns or raises an EventStoreError, and what is left is one clean log whose
    seqs run 1..N."""
    errors: list[BaseException] = []
    stop = time.monotonic() + 1.5

    with SessionStore(pg_url) as store, SessionStore(pg_url) as other:

        def writer(s: SessionStore, me: str) -> None:
            i = 0
            while time.monotonic() < stop:
                try:
                    s.append_progress_entry("s", _entry(f"{me}{i}"))
                except BaseException as exc:  # noqa: BLE001 - the test inspects it
                    errors.append(exc)
                    return
                i += 1

        def remover() -> None:
            while time.monotonic() < stop:
                try:
                    other.delete_session("s", purge=True)
                except BaseException as exc:  # noqa: BLE001
                    errors.append(exc)
                    return
                time.sleep(0.01)

        threads = [
            threading.Thread(target=writer, args=(store, "a")),
            threading.Thread(target=writer, args=(other, "b")),
            threading.Thread(target=remover),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert not errors, errors
        store.append_progress_entry("s", _entry("last"))
        with SessionStore(pg_url) as fresh:
            events = list(fresh.read_events("s"))
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            assert fresh.verify("s").ok
            assert _summaries(fresh, "s") == _summaries(store, "s")
            assert _summaries(fresh, "s")[-1] == "last"


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
def test_attack_a_default_isolation_above_read_committed_keeps_appends_optimistic(
    pg_url: str, level: str
) -> None:
    """Attack: with `default_transaction_isolation` above read committed (a role's or a
    database's setting, or the URL's `options`), an append that waited for another
    append to the same session ran on a snapshot taken before that one committed: the
    server refused it ('could not serialize access', a StorageError), where the
    optimistic append catches up and lands. The engine's connections now pin read
    committed, which its server-side functions are written for."""
    _build(pg_url, "s", 1)
    url = with_query(
        pg_url, options="-c default_transaction_isolation=" + level.replace(" ", "\\ ")
    )
    conninfo, schema = pg.split_url(pg_url)
    errors: list[BaseException] = []
    with pg.from_url(url) as engine, psycopg.connect(conninfo) as first:
        head = engine.head("s")
        batch = make_batch(head, 1, tag="first")
        first.execute(  # another writer's append, in a transaction left open
            f'SELECT moved FROM "{schema}".append(%s, 1, %s, 2, %s, %s, %s, false, NULL, NULL)',
            ("s", head.link, [batch.data], batch.hashes[-1], batch.link),
        )

        def second() -> None:
            try:
                append_retrying(engine, "s", tag="second")
            except BaseException as exc:  # noqa: BLE001 - the test inspects it
                errors.append(exc)

        t = threading.Thread(target=second)
        t.start()
        deadline = time.monotonic() + 20
        while not _waiting_backends(conninfo, "advisory") and time.monotonic() < deadline:
            time.sleep(0.02)
        first.commit()
        t.join(20)
        assert not errors, errors
        assert check_chain(engine.read("s", None).data)[-1].seq == 3


def test_attack_a_function_planted_on_the_search_path_is_never_called(pg_url: str) -> None:
    """Attack: another role that can create functions in a schema on the engine's search
    path (`public`, writable by every role before PostgreSQL 15) planted `nextval(text)`
    and `format(text, text)`, which outrank the built-ins for the engine's calls. The
    migration then ran the planted `format` (as the role running init-db) and bound the
    lines' default to the planted `nextval`, run by every append after, and a repair set
    the live log's id to what it returned. The engine's connections now resolve names in
    pg_catalog alone: the planted functions never run."""
    planted = f"t_{uuid.uuid4().hex[:12]}"
    conninfo = pg.split_url(pg_url)[0]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {planted}; CREATE TABLE {planted}.calls (what text)")
        for signature, returns in (
            ("nextval(text) RETURNS bigint", "7::bigint"),
            ("format(text, text) RETURNS text", "pg_catalog.format($1, $2)"),
        ):
            conn.execute(
                f"CREATE FUNCTION {planted}.{signature} LANGUAGE sql AS $$ INSERT INTO"
                f" {planted}.calls VALUES ('{signature}') RETURNING {returns} $$"
            )
    try:
        url = with_query(pg_url, options=f"-c search_path={planted},public")
        with SessionStore(url) as store:
            for i in range(3):
                store.append_progress_entry("s", _entry(f"e{i}"))
            with store.engine.hold("s") as hold:  # a repair keeping the first line
                hold.keep_prefix(hold.data.index(b"\n") + 1, "attack")
            assert _summaries(store, "s") == ["e0"]
        with psycopg.connect(conninfo, autocommit=True) as conn:
            calls = conn.execute(f"SELECT what FROM {planted}.calls").fetchall()
        assert calls == []
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {planted} CASCADE")


def test_attack_a_repair_dropping_the_opening_snapshot_needs_no_second_connection(
    pg_url: str,
) -> None:
    """Attack: a repair hold that keeps less than the live log's opening snapshot saves
    the session's whole history aside first, and read it on a second pooled connection
    while the hold kept its own: with `pool_size=1` it waited 30 s for one that never
    came and failed (StorageError), the session unrepaired. It now reads on the hold's
    own connection: the session starts over empty, its history saved aside."""
    with pg.from_url(pg_url, pool_size=1) as engine:
        covers = append_retrying(engine, "s", 3)
        engine.install_snapshot("s", snapshot_line(covers), covers, keep_history=True)
        append_retrying(engine, "s")
        with engine.hold("s") as hold:
            saved = hold.keep_prefix(0, "attack")
        assert saved is not None and engine.head("s") == EMPTY_HEAD
        assert append_retrying(engine, "s").seq == 1
        check_chain(engine.read("s", None).data)


@pytest.mark.parametrize(
    "tamper",
    [
        f"DELETE FROM @S.lines WHERE sid = {SID_ROW} AND seq = 4",
        f"UPDATE @S.sessions SET head_seq = 5 WHERE sid = {SID_ROW}",
        f"DELETE FROM @S.lines WHERE sid = {SID_ROW}",
    ],
    ids=["last-row-deleted", "head-ahead", "every-row-deleted"],
)
def test_attack_verify_of_a_live_log_short_of_its_head_is_not_ok(pg_url: str, tamper: str) -> None:
    """Attack: the live log's rows end before the head's seq (its last rows deleted, or
    the head moved on). Every load raises CorruptLogError ('a row deleted at the end is
    a CorruptLogError, not a shorter log'), but `verify` read the history's rows alone
    and reported the shorter log ok, with another head hash. The history's live log is
    now checked against the head as a read checks it: verify reports it, not ok."""
    _build(pg_url, "s", 4)
    _sql(pg_url, tamper, "s")
    assert isinstance(_cold_load_error(pg_url, "s", caches=False), CorruptLogError)
    with SessionStore(pg_url) as store:
        report = store.verify("s")
    assert not report.ok and "its head is at seq" in report.problems[-1].message, report
