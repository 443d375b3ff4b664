"""Attacks on the PostgreSQL engine from outside: rows edited with SQL behind the
engine's back, writers, compactors and loaders in several processes, a fork while
another thread holds the engine, connections ended by the server, inputs the file
engine accepts.

Needs `EVENTSTORE_TEST_POSTGRES_URL` (see tests/test_postgres.py: skipped without it,
failing in CI). Every test works in a schema of its own, dropped afterwards; every child
process has a timeout.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import wait_child, with_query

from eventstore import (
    ProgressEntry,
    SessionStore,
)
from eventstore.errors import (
    CorruptLogError,
    EventStoreError,
    StorageError,
)

REPO = Path(__file__).resolve().parent.parent


psycopg = pytest.importorskip("psycopg") if os.environ.get("CI") != "true" else None
if psycopg is None:
    import psycopg  # in CI the extra must be installed: an ImportError fails the run

from eventstore.engines.postgres import engine as pg  # noqa: E402


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


def _cold_load_error(pg_url: str, sid: str) -> BaseException | list[str]:
    """What a load in a fresh store (a fresh process's view) gives: the summaries or
    the exception it raised."""
    with SessionStore(pg_url) as store:
        try:
            return _summaries(store, sid)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            return exc


# -- findings: inputs the file engine accepts ---------------------------------------------


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


# -- findings: rows damaged behind the engine's back ---------------------------------------


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


# -- finding: a fork while another thread holds the engine ---------------------------------


def test_a_child_forked_while_a_thread_holds_the_engine_can_use_it(
    pg_url: str, tmp_path: Path
) -> None:
    """`PostgresEngine._lock` is taken on every append (`_get_notifier`) and wait
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


# -- coverage: what held --------------------------------------------------------------------


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
    """Each edit of a committed row: a cold load raises CorruptLogError, a warm load
    (a store that folded the log before the edit and reads on) never returns the edited
    event (it raises CorruptLogError or returns what it held), and verify reports it."""
    with SessionStore(pg_url) as warm:
        for i in range(6):
            warm.append_progress_entry("s", _entry(f"e{i}"))
        if "snapshot" in tamper:
            assert warm.compact("s", archive=False, force=True).compacted
            warm.append_progress_entry("s", _entry("e6"))
        before = _summaries(warm, "s")
        _sql(pg_url, TAMPERS[tamper].format(sid=SID_ROW), "s")
        got = _cold_load_error(pg_url, "s")
        assert isinstance(got, CorruptLogError), got
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
    from eventstore.errors import StorageError

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
                    other.delete_session("s")
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
