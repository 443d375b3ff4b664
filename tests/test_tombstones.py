"""Tombstones: `delete_session(sid)` leaves a tombstone (when, by whom, the last seq and
hash) and erases the data; any write to the id then raises SessionDeletedError and
writes nothing, across stores and processes and on every engine, until `restore`;
`purge=True` leaves no trace. Attacks beside: an append racing a delete from another
process, a deleter killed at random moments, forks, migrate, the CLI, the adapters."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from conftest import cli_in_process, make_checkpoint, make_entry, make_features, make_manifest
from engines import EngineCase, after_each_read_of_the_end

from eventstore import (
    BootstrapState,
    CorruptLogError,
    Message,
    ProgressAppended,
    Role,
    SessionDeletedError,
    SessionExistsError,
    SessionStore,
)
from eventstore.aio import AsyncSessionStore
from eventstore.engines.base import PruningEngine
from eventstore.engines.conformance import wait_child
from eventstore.ops.migrate import migrate_session

REPO = Path(__file__).resolve().parent.parent
SECRET = "SECRET-7f3a9c"


def _seed(store: SessionStore, sid: str, n: int = 3) -> None:
    """A session holding SECRET in every kind of record, compacted once (an archive)."""
    store.initialize_session_if_missing(sid, make_manifest(sid, current_objective=SECRET),
                                        make_features())  # fmt: skip
    for i in range(n):
        store.append_progress_entry(sid, make_entry(i))
        store.append_transcript_messages(sid, [Message(role=Role.USER, content=f"{SECRET} {i}")])
    store.compact(sid, force=True)
    store.append_transcript_messages(sid, [Message(role=Role.ASSISTANT, content=SECRET)])


def _writes(store: SessionStore, sid: str) -> list[object]:
    """Every write of the session API, as callables."""
    msg = [Message(role=Role.USER, content="late")]
    return [
        lambda: store.append_transcript_messages(sid, msg),
        lambda: store.append_progress_entry(sid, make_entry(9)),
        lambda: store.initialize_session_if_missing(sid, make_manifest(sid), make_features()),
        lambda: store.save_manifest(sid, make_manifest(sid)),
        lambda: store.replace_feature_list(sid, make_features(1)),
        lambda: store.update_feature_pass(sid, "f1", True),
        lambda: store.record_run_checkpoint(sid, make_checkpoint()),
        lambda: store.append(sid, [ProgressAppended(entry=make_entry(8))]),
        lambda: store.append(sid, [ProgressAppended(entry=make_entry(8))], idempotency_key="k"),
    ]


def _history_bytes(store: SessionStore, sid: str) -> bytes:
    with store.engine.history(sid) as hist:
        return b"".join(seg.read() for seg in hist)


# -- what a tombstone is -------------------------------------------------------------------


def test_a_deleted_session_reads_empty_refuses_every_write_and_keeps_a_tombstone(
    url: str, case: EngineCase
) -> None:
    sid = f"t-{uuid.uuid4().hex[:8]}"
    with SessionStore(url) as store:
        _seed(store, sid)
        _seed(store, "other")
        last, h = store.last_seq(sid), store.verify(sid).head_hash
        before = time.time()
        assert store.delete_session(sid, by="alice") is True
        assert store.load_bootstrap_state(sid) == BootstrapState()
        assert store.load_transcript_messages(sid) == []
        assert not store.is_initialized(sid)
        seq = store.last_seq(sid)
        for write in _writes(store, sid):
            with pytest.raises(SessionDeletedError, match=f"session '{sid}' was deleted at"):
                write()  # type: ignore[operator]
        assert store.last_seq(sid) == seq  # nothing written
        t = store.tombstone_of(sid)
        assert t is not None and t.by == "alice" and t.erased
        assert (t.last_seq, t.last_h, t.seq) == (last, h, last + 1)
        assert t.deleted_at.timestamp() >= before - 1
        assert store.list_sessions() == ["other"]
        assert [d.session_id for d in store.deleted_sessions()] == [sid]
        report = store.verify(sid)
        assert report.ok and [p.kind for p in report.problems] == ["deleted"]
        assert store.delete_session(sid) is False  # deleted already
        assert store.load_transcript_messages("other")[-1].content == SECRET
    with SessionStore(url) as fresh:  # another store (no shared caches) sees it too
        with pytest.raises(SessionDeletedError):
            fresh.append_transcript_messages(sid, [Message(role=Role.USER, content="x")])
        assert fresh.load_bootstrap_state(sid) == BootstrapState()


def test_a_deleted_sessions_events_are_gone_from_its_history_too(
    url: str, case: EngineCase
) -> None:
    """The live log and every archived segment the engine keeps: no byte of the data."""
    if not isinstance(SessionStore(url).engine, PruningEngine):
        pytest.xfail(
            "an engine that cannot prune history (PostgreSQL) keeps what compactions with"
            " an archive archived before the delete: the live log alone is erased"
        )
    with SessionStore(url) as store:
        _seed(store, "s")
        assert SECRET.encode() in _history_bytes(store, "s")
        store.delete_session("s")
        assert SECRET.encode() not in _history_bytes(store, "s")


def test_the_file_engine_keeps_no_byte_of_a_deleted_session(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with SessionStore(root, durability="fsync") as store:
        _seed(store, "s")
        store.load_transcript_messages("s")
        store.delete_session("s")
    with SessionStore(root) as store:  # the caches saved on close: the empty states
        assert store.load_transcript_messages("s") == []
    leaks = [p for p in root.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaks == []


def test_a_delete_leaves_no_chunk_of_a_long_transcript(tmp_path: Path) -> None:
    """A transcript long enough that its cache is kept in chunks (complete frames,
    written as appends complete them): the erase removes them with the rest."""
    root = tmp_path / "store"
    with SessionStore(root) as store:
        for i in range(0, 1200, 100):
            msgs = [Message(role=Role.USER, content=f"{SECRET} {j}") for j in range(i, i + 100)]
            store.append_transcript_messages("s", msgs)
    assert list((root / "sessions" / "s").glob("fold-transcript.*.cache"))
    with SessionStore(root) as store:
        store.load_transcript_messages("s")
        store.delete_session("s")
    with SessionStore(root) as store:
        assert store.load_transcript_messages("s") == []
    leaks = [p for p in root.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaks == []


def test_restore_frees_the_id_and_purge_leaves_no_trace(url: str) -> None:
    with SessionStore(url) as store:
        _seed(store, "a")
        assert store.restore("a") is False  # live: nothing to restore
        store.delete_session("a")
        assert store.restore("a") is True
        assert store.tombstone_of("a") is None and store.last_seq("a") == 0
        store.append_transcript_messages("a", [Message(role=Role.USER, content="new")])
        assert [m.content for m in store.load_transcript_messages("a")] == ["new"]
        assert store.last_seq("a") == 1  # a fresh session
        assert store.delete_session("a", purge=True) is True
        assert store.last_seq("a") == 0 and store.deleted_sessions() == []
        store.append_transcript_messages("a", [Message(role=Role.USER, content="again")])
        store.delete_session("a")
        assert store.delete_session("a", purge=True) is True  # a tombstone is purged too
        assert store.list_sessions() == [] and store.deleted_sessions() == []
        assert store.delete_session("never") is False and store.deleted_sessions() == []


def test_append_refuses_a_tombstone_and_writes_nothing(tmp_path: Path) -> None:
    from eventstore import InvalidRecordError, SessionDeleted

    with SessionStore(tmp_path / "s") as store:
        store.append_transcript_messages("a", [Message(role=Role.USER, content="x")])
        with pytest.raises(InvalidRecordError, match="delete_session"):
            store.append("a", [SessionDeleted(by="forged")])
        assert store.last_seq("a") == 1 and store.tombstone_of("a") is None


def test_a_new_process_knows_a_tombstone_from_the_last_line_alone(url: str) -> None:
    """The first write of a store to a session reads only its last line for the
    lifecycle state (where the engine reads ranges): a tombstone there, erased or not,
    still refuses it; a long live session is appended to without a fold."""
    with SessionStore(url) as store:
        for i in range(30):
            store.append_transcript_messages("long", [Message(role=Role.USER, content=str(i))])
        _seed(store, "gone")
        store.delete_session("gone")
    with SessionStore(url) as fresh:
        with pytest.raises(SessionDeletedError):
            fresh.append_progress_entry("gone", make_entry(1))
        fresh.append_progress_entry("long", make_entry(1))
        assert fresh.last_seq("long") == 31
        assert len(fresh.load_transcript_messages("long")) == 30


def test_a_first_write_reads_the_last_line_alone_on_every_engine(
    case: EngineCase, url: str
) -> None:
    """The lifecycle state a store's first write to a session judges comes from the
    log's last line alone on every engine (files and memory: read from the end;
    PostgreSQL and Redis: the head's line by its seq, checked): a line edited far back
    never reaches that write, while a load of the whole log reports it."""
    with SessionStore(url) as store:
        for i in range(30):
            store.append_transcript_messages("long", [Message(role=Role.USER, content=f"m{i:03d}")])
        case.rewrite(store, "long", lambda b: b.replace(b"m005", b"m905"))
    with SessionStore(url) as fresh:
        fresh.append_progress_entry("long", make_entry(1))
        assert fresh.last_seq("long") == 31
        with pytest.raises(CorruptLogError):
            fresh.load_transcript_messages("long")


@pytest.mark.parametrize("seeded", [3, 0], ids=["long", "empty"])
def test_a_first_write_judged_on_the_last_line_lands_only_at_that_head(
    case: EngineCase, url: str, seeded: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a store's first write judges the lifecycle state from the last line it
    reads (with the head, in one read on PostgreSQL and Redis) and reads nothing more
    before appending. Another store deletes the session right after that read: the
    write raises SessionDeletedError and nothing lands after the tombstone."""
    if seeded:
        with SessionStore(url) as store:
            _seed(store, "r", seeded)
    fresh = SessionStore(url)
    deleted: list[int] = []

    def delete() -> None:
        if not deleted:  # once, right after the write's read of the last line
            with SessionStore(url) as other:
                other.append_progress_entry("r", make_entry(99))  # (an empty log too)
                other.delete_session("r")
                deleted.append(other.last_seq("r"))

    after_each_read_of_the_end(fresh, monkeypatch, delete)
    with pytest.raises(SessionDeletedError):
        fresh.append_progress_entry("r", make_entry(1))
    fresh.close()
    assert deleted, "the race was not run"
    with SessionStore(url) as store:
        assert store.last_seq("r") == deleted[0]  # the tombstone ends the log
        assert store.tombstone_of("r") is not None


class _Stopped(Exception):
    """A delete stopped between its fence and its erase (what a kill there leaves)."""


def _delete_stopped_before_the_erase(store: SessionStore, sid: str) -> None:
    """`delete_session` killed once its tombstone is durable, before the log is erased."""

    def stop(*args: object, **kw: object) -> object:
        raise _Stopped

    real = store.engine.install_snapshot
    store.engine.install_snapshot = stop  # type: ignore[method-assign]
    try:
        with pytest.raises(_Stopped):
            store.delete_session(sid)
    finally:
        store.engine.install_snapshot = real  # type: ignore[method-assign]


@pytest.mark.parametrize("compacted", [False, True])
def test_a_cold_last_page_of_a_deleted_unerased_session_is_empty(
    case: EngineCase, url: str, compacted: bool
) -> None:
    """Attack: a delete stopped before its erase leaves the tombstone ending the live
    log, the messages before it. A fresh store's `load_transcript_messages(sid, last=N)`
    read them from the log's end (it looked for message lines only) on every engine,
    while the fold reads the session as empty: the scan now stops at a tombstone."""
    with SessionStore(url) as store:
        for i in range(20):
            store.append_transcript_messages("a", [Message(role=Role.USER, content=f"m{i}")])
            if compacted and i == 9:
                store.compact("a", force=True)
        _delete_stopped_before_the_erase(store, "a")
    for n in (1, 3, 40):
        with SessionStore(url) as fresh:
            assert fresh.tombstone_of("a") is not None
            assert fresh.load_transcript_messages("a", last=n) == []
    with SessionStore(url) as fresh:
        assert fresh.load_transcript_messages("a") == []


def _forge_last_line(old: bytes, tombstone: bool) -> bytes:
    """The log with its last line replaced, same seq and `h` (so no longer its hash): by
    a tombstone if `tombstone`, else by the line before it (a live line)."""
    lines = old.rstrip(b"\n").split(b"\n")
    last = json.loads(lines[-1])
    forged = {"type": "session_deleted", "seq": last["seq"], "ts": last["ts"], "by": "x",
              "last_seq": last["seq"] - 1, "last_h": "0" * 16} if tombstone else {
              **json.loads(lines[-2]), "seq": last["seq"], "ts": last["ts"]}  # fmt: skip
    forged["h"] = last["h"]
    lines[-1] = json.dumps(forged, separators=(",", ":")).encode()
    return b"\n".join(lines) + b"\n"


def test_a_forged_last_line_never_decides_whether_a_session_is_deleted(
    case: EngineCase, url: str
) -> None:
    """Attack: the last line, which alone decides a first write's lifecycle state, is
    replaced by a line that does not check (its `h` kept): a tombstone ending a live log,
    or a live line where a delete stopped before its erase left its tombstone. Files and
    memory decoded it unchecked: the first refused the write as deleted, the second
    appended to the deleted session. Now that line is checked against its link on every
    engine, and the fold it falls back to reports the edit; nothing is written."""
    with SessionStore(url) as store:
        for sid in ("live", "gone"):
            for i in range(5):
                store.append_transcript_messages(sid, [Message(role=Role.USER, content=f"m{i}")])
        _delete_stopped_before_the_erase(store, "gone")
        case.rewrite(store, "live", lambda b: _forge_last_line(b, True))
        case.rewrite(store, "gone", lambda b: _forge_last_line(b, False))
    for sid, last in (("live", 5), ("gone", 6)):
        with SessionStore(url) as fresh:
            with pytest.raises(CorruptLogError):
                fresh.append_progress_entry(sid, make_entry(1))
            assert fresh.last_seq(sid) == last


def test_the_async_store_mirrors_delete_restore_and_the_tombstones(tmp_path: Path) -> None:
    import asyncio

    async def main() -> None:
        async with AsyncSessionStore(tmp_path / "s") as store:
            await store.append_transcript_messages("a", [Message(role=Role.USER, content="x")])
            assert await store.delete_session("a", by="bot")
            assert (await store.tombstone_of("a")).by == "bot"  # type: ignore[union-attr]
            assert [t.session_id for t in await store.deleted_sessions()] == ["a"]
            with pytest.raises(SessionDeletedError):
                await store.append_transcript_messages("a", [Message(role=Role.USER, content="y")])
            assert await store.restore("a")
            assert await store.delete_session("a", purge=True) is False  # nothing stored

    asyncio.run(main())


def test_a_compaction_never_archives_a_deleted_session(url: str) -> None:
    with SessionStore(url) as store:
        _seed(store, "a")
        store.delete_session("a")
        report = store.compact("a", force=True)
        assert not report.compacted
        assert store.tombstone_of("a") is not None


# -- forks and migrate -----------------------------------------------------------------------


def test_a_fork_from_a_deleted_session_raises_and_into_one_is_refused(url: str) -> None:
    with SessionStore(url) as store:
        _seed(store, "src")
        _seed(store, "dst")
        store.delete_session("dst")
        with pytest.raises(SessionExistsError):
            store.fork_session("src", "dst")
        store.delete_session("src")
        with pytest.raises(SessionDeletedError, match="'src' was deleted"):
            store.fork_session("src", "new")
        assert store.last_seq("new") == 0


def test_migrate_carries_the_tombstone(tmp_path: Path) -> None:
    with SessionStore(tmp_path / "a") as src, SessionStore(f"memory://{uuid.uuid4().hex}") as dst:
        _seed(src, "s")
        src.delete_session("s", by="carol")
        migrate_session(src.engine, dst, "s")
        t = dst.tombstone_of("s")
        assert t is not None and t.by == "carol"
        with pytest.raises(SessionDeletedError):
            dst.append_transcript_messages("s", [Message(role=Role.USER, content="x")])


# -- across processes ------------------------------------------------------------------------


def test_an_append_racing_a_delete_from_another_process_lands_before_or_is_refused(
    url: str, case: EngineCase
) -> None:
    """A forked child appends as fast as it can, recording each acknowledged seq; this
    process deletes the session meanwhile. The child's last append raises
    SessionDeletedError; every append it was told succeeded precedes the tombstone (and
    was deleted with the session); nothing lands after the tombstone."""
    if not case.processes:
        pytest.skip("the engine's sessions are not shared across processes")
    with SessionStore(url) as store:
        store.append_transcript_messages("r", [Message(role=Role.USER, content="first")])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(r)
            with SessionStore(url) as child:
                os.write(w, b"go\n")
                while True:
                    try:
                        res = child.append_transcript_messages(
                            "r", [Message(role=Role.USER, content=SECRET)]
                        )
                    except SessionDeletedError:
                        code = 0
                        break
                    os.write(w, f"{res.last_seq}\n".encode())  # type: ignore[union-attr]
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as pipe:
        assert pipe.readline() == "go\n"
        time.sleep(0.3)
        with SessionStore(url) as store:
            assert store.delete_session("r")
            t = store.tombstone_of("r")
        acked = [int(line) for line in pipe.read().split()]
    assert wait_child(pid, 30) == 0  # it ended on SessionDeletedError
    assert t is not None and acked and max(acked) < t.seq == t.last_seq + 1
    with SessionStore(url) as store:
        assert store.last_seq("r") == t.seq  # nothing after the tombstone
        assert store.load_transcript_messages("r") == []


_DELETER = textwrap.dedent(
    """
    import sys
    from eventstore import SessionStore
    with SessionStore(sys.argv[1]) as store:
        for sid in sys.argv[2:]:
            store.delete_session(sid)
    """
)


def test_a_deleter_killed_at_random_moments_leaves_the_session_or_its_tombstone(
    tmp_path: Path,
) -> None:
    """Each session is, after every kill, either whole as written (verify clean) or
    deleted (reads empty, refuses writes); deleting again finishes any erasure a kill
    interrupted, and then no file holds a byte of it."""
    root = tmp_path / "store"
    rng = random.Random(3232)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ids = [f"s{i:03d}" for i in range(30)]
    with SessionStore(root) as store:
        for sid in ids:
            _seed(store, sid, n=2)
        expected = {sid: store.load_bootstrap_state(sid) for sid in ids}
    for _ in range(4):
        with SessionStore(root) as store:
            left = [sid for sid in ids if store.tombstone_of(sid) is None]
        if not left:
            break
        proc = subprocess.Popen([sys.executable, "-c", _DELETER, str(root), *left], env=env)
        time.sleep(rng.uniform(0.05, 0.8))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        with SessionStore(root) as store:
            for sid in ids:
                assert store.verify(sid).ok, sid
                if store.tombstone_of(sid) is None:  # whole, as written
                    assert store.load_bootstrap_state(sid) == expected[sid]
                else:
                    assert store.load_bootstrap_state(sid) == BootstrapState()
                    with pytest.raises(SessionDeletedError):
                        store.append_progress_entry(sid, make_entry(7))
    with SessionStore(root) as store:
        for sid in ids:
            store.delete_session(sid)
        assert all(t.erased for t in store.deleted_sessions())
        assert len(store.deleted_sessions()) == len(ids) and store.list_sessions() == []
    leaks = [p for p in root.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaks == []


# -- the CLI -----------------------------------------------------------------------------


def test_cli_delete_purge_and_sessions_deleted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as store:
        _seed(store, "a")
        _seed(store, "b")
    assert cli_in_process(capsys, "delete", str(root), "a")[0] == 0
    code, out, _ = cli_in_process(capsys, "sessions", str(root), "--deleted", "--json")
    assert code == 0
    (row,) = json.loads(out)
    assert row["session_id"] == "a" and row["erased"] is True and row["by"]
    code, out, _ = cli_in_process(capsys, "sessions", str(root))
    assert "a " not in out and "b " in out
    code, out, _ = cli_in_process(capsys, "verify", str(root), "a")
    assert code == 0 and "deleted" in out
    assert cli_in_process(capsys, "delete", str(root), "a", "b", "--purge")[0] == 0
    code, out, _ = cli_in_process(capsys, "sessions", str(root), "--deleted")
    assert "no deleted sessions" in out
    with SessionStore(root) as store:
        assert store.list_sessions() == [] and store.deleted_sessions() == []


# -- adapters ------------------------------------------------------------------------------


def test_langgraph_a_deleted_thread_is_gone_and_a_late_put_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("langgraph.checkpoint.base")
    from langgraph.checkpoint.base import empty_checkpoint

    from eventstore.integrations.langgraph import EventStoreSaver

    with SessionStore(tmp_path / "s") as store:
        saver = EventStoreSaver(store)
        config = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
        saved = saver.put(config, empty_checkpoint(), {}, {})  # type: ignore[arg-type]
        assert saver.get_tuple(saved) is not None
        saver.delete_thread("t1")
        assert saver.get_tuple(config) is None  # type: ignore[arg-type]
        assert list(saver.list(config)) == []  # type: ignore[arg-type]
        with pytest.raises(SessionDeletedError):  # the late write of langgraph #7206
            saver.put(config, empty_checkpoint(), {}, {})  # type: ignore[arg-type]
        assert "t1" not in saver.thread_ids()


def test_adk_a_deleted_session_is_not_found(tmp_path: Path) -> None:
    pytest.importorskip("google.adk")
    import asyncio

    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events import Event as AdkEvent

    from eventstore.integrations.google_adk import EventStoreSessionService

    async def main() -> None:
        with SessionStore(tmp_path / "s") as store:
            svc = EventStoreSessionService(store)
            sess = await svc.create_session(app_name="app", user_id="u", session_id="x")
            await svc.delete_session(app_name="app", user_id="u", session_id="x")
            assert await svc.get_session(app_name="app", user_id="u", session_id="x") is None
            with pytest.raises(SessionNotFoundError):
                await svc.append_event(sess, AdkEvent(author="user", invocation_id="i"))

    asyncio.run(main())


def test_agents_sdk_a_write_to_a_deleted_session_raises_and_reads_are_empty(
    tmp_path: Path,
) -> None:
    pytest.importorskip("agents")
    import asyncio

    from eventstore.integrations.openai_agents import EventStoreSession

    async def main() -> None:
        with SessionStore(tmp_path / "s") as store:
            session = EventStoreSession("conv", store)
            await session.add_items([{"role": "user", "content": "hi"}])
            store.delete_session(session.session_id)
            assert await session.get_items() == []
            with pytest.raises(SessionDeletedError):
                await session.add_items([{"role": "user", "content": "late"}])

    asyncio.run(main())


def test_feature_record_is_untouched_by_a_tombstone_elsewhere(tmp_path: Path) -> None:
    with SessionStore(tmp_path / "s") as store:
        store.replace_feature_list("a", make_features(1))
        store.delete_session("b")  # nothing stored: no tombstone
        assert store.deleted_sessions() == [] and store.list_sessions() == ["a"]


def test_a_sealing_store_deletes_quietly_and_verify_says_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A store that seals every write and at close: a delete is not followed by a seal
    (the tombstone ends the log), closing logs no failed seal, verify reports it deleted."""
    pytest.importorskip("cryptography")
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from eventstore import SealPolicy

    key = Ed25519PrivateKey.generate()
    with SessionStore(tmp_path / "s", signing_key=key, seal_policy=SealPolicy(every=1)) as store:
        store.append_transcript_messages("a", [Message(role=Role.USER, content=SECRET)])
        assert store.delete_session("a")
        t = store.tombstone_of("a")
        assert t is not None and store.last_seq("a") == t.seq
        with pytest.raises(SessionDeletedError):
            store.seal("a")
    assert "sealing" not in caplog.text
    with SessionStore(tmp_path / "s") as store:
        assert [p.kind for p in store.verify("a").problems] == ["deleted"]
