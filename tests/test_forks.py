"""Forks: `fork_session(src, dst, at_seq)` starts dst from `state_at(src, at_seq)`, its
first line a snapshot naming src, the seq and src's line hash there, which `verify`
checks; on every engine, beside a live writer, across `migrate`; the CLI's `fork`; the
report's origin line. Attacks (forged provenance, refusals that write nothing) beside."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import cli_in_process, make_entry, make_features, make_manifest
from engines import EngineCase
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracle import rehash, truth
from strategies import payload_events

from eventstore import (
    ForkOrigin,
    HistoryUnavailableError,
    InvalidArgumentError,
    InvalidSessionIdError,
    Message,
    Policy,
    ProgressAppended,
    Role,
    SessionExistsError,
    SessionStore,
    Snapshot,
    UnknownSessionError,
    entropy,
)
from eventstore.aio import AsyncSessionStore
from eventstore.engines.base import PruningEngine
from eventstore.ops.export import export_jsonl
from eventstore.ops.migrate import migrate_session
from eventstore.report.page import render_page, report_data

batches = st.lists(st.lists(payload_events, min_size=1, max_size=3), min_size=1, max_size=5)


def _exported(store: SessionStore, sid: str) -> bytes:
    return b"".join(export_jsonl(store.core, sid))


def _write(store: SessionStore, sid: str, evs: list[list[object]]) -> None:
    for batch in evs:
        store.append(sid, batch)  # type: ignore[arg-type]


def _origin(store: SessionStore, sid: str) -> ForkOrigin:
    first = next(iter(store.read_events(sid, types=["snapshot"])))
    assert isinstance(first, Snapshot) and first.origin is not None
    return first.origin


def _seed(store: SessionStore, sid: str, n: int = 3) -> None:
    store.initialize_session_if_missing(sid, make_manifest(sid), make_features())
    for i in range(n):
        store.append_progress_entry(sid, make_entry(i))
        store.append_transcript_messages(sid, [Message(role=Role.USER, content=f"m{i}")])


# -- what a fork is -------------------------------------------------------------------


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(evs=batches, data=st.data())
def test_a_fork_starts_from_state_at_its_seq_and_appends_continue(
    url: str, case: EngineCase, tmp_path: Path, evs: list[list[object]], data: st.DataObject
) -> None:
    src, dst = f"src-{uuid.uuid4().hex[:8]}", f"dst-{uuid.uuid4().hex[:8]}"
    with SessionStore(url) as store:
        _write(store, src, evs)
        last = store.last_seq(src)
        at = data.draw(st.none() | st.integers(1, last), label="at_seq")
        n = last if at is None else at
        before = _exported(store, src)
        done = store.fork_session(src, dst, at_seq=at)
        assert (done.session_id, done.source, done.seq) == (dst, src, n)
        want = store.state_at(src, seq=n), store.transcript_at(src, seq=n)
        assert (store.load_bootstrap_state(dst), store.load_transcript_messages(dst)) == want
        with SessionStore(url) as other:  # a cold load in another store agrees
            got = other.load_bootstrap_state(dst), other.load_transcript_messages(dst)
            assert got == want
        if case.name == "file":  # the oracle: what dst's files alone say
            assert tuple(truth(Path(url), dst)) == want
        assert _exported(store, src) == before  # src is only read
        line = next(e for e in store.read_events(src, from_seq=n, to_seq=n))
        assert _origin(store, dst) == ForkOrigin(src, n, line.h)
        report = store.verify(dst)
        assert report.ok and report.problems == [], report.problems
        # appends to dst continue after the fork's seq, from its state
        entry = make_entry(99, "after-fork")
        store.append_progress_entry(dst, entry)
        assert store.last_seq(dst) == n + 1
        state = store.load_bootstrap_state(dst)
        assert state.recent_progress[-1] == entry
        assert state.recent_progress[:-1] == want[0].recent_progress
        assert store.verify(dst).ok
        assert store.last_seq(src) == last and _exported(store, src) == before


def test_a_fork_made_now_is_not_idle_since_its_sources_last_event(url: str) -> None:
    """Attack: a session forked just now from one last written 60 days ago was
    tombstoned by the next `gc --idle 30d`: its only line, the fork's snapshot, answered
    for its last activity with the source's (`last_ts`). The fork is the new session's
    first activity, on every engine, also once the fork is compacted."""
    idle = Policy(idle=timedelta(days=30))
    with SessionStore(url) as store:
        with entropy.fixed(3, start=datetime.now(UTC) - timedelta(days=60)):
            _seed(store, "src")
        want = store.load_bootstrap_state("src")
        store.fork_session("src", "dst")
        assert store.gc(idle, dry_run=True).tombstoned == ["src"]
        store.compact("dst", force=True)
        assert store.gc(idle).tombstoned == ["src"]
        assert store.load_bootstrap_state("dst") == want  # kept, and still the fork


def test_the_async_store_forks(tmp_path: Path) -> None:
    async def main() -> tuple[object, object]:
        async with AsyncSessionStore(tmp_path / "s") as store:
            await store.initialize_session_if_missing("a", make_manifest("a"), make_features())
            await store.append_progress_entry("a", make_entry(1))
            done = await store.fork_session("a", "b", at_seq=2)
            return done.seq, await store.load_bootstrap_state("b")

    seq, state = asyncio.run(main())
    with SessionStore(tmp_path / "s") as store:
        assert seq == 2 and state == store.state_at("a", seq=2)


# -- refusals: a typed error naming what is wrong, nothing written ------------------------


def test_a_fork_into_an_existing_session_is_refused_and_writes_nothing(url: str) -> None:
    with SessionStore(url) as store:
        _seed(store, "a")
        _seed(store, "b", 1)
        before = _exported(store, "b")
        with pytest.raises(SessionExistsError, match="'b'"):
            store.fork_session("a", "b")
        with pytest.raises(SessionExistsError, match="'a'"):
            store.fork_session("a", "a")
        assert _exported(store, "b") == before


def test_a_missing_source_or_a_seq_out_of_range_is_refused_and_writes_nothing(url: str) -> None:
    with SessionStore(url) as store:
        _seed(store, "a")
        last = store.last_seq("a")
        with pytest.raises(UnknownSessionError, match="'nope'"):
            store.fork_session("nope", "b")
        with pytest.raises(HistoryUnavailableError, match=f"'a' has no event {last + 1}"):
            store.fork_session("a", "b", at_seq=last + 1)
        for bad in (0, -1, True, "2", 1.0):
            with pytest.raises(InvalidArgumentError, match="at_seq"):
                store.fork_session("a", "b", at_seq=bad)  # type: ignore[arg-type]
        assert store.list_sessions() == ["a"]


@pytest.mark.parametrize(
    ("src", "dst", "at"),
    [(1, "b", None), ("a", None, None), ("", "b", None), ("a", ["b"], None), ("a", "b", [1])],
)
def test_wrong_typed_arguments_get_a_typed_error_and_write_nothing(
    store: SessionStore, src: object, dst: object, at: object
) -> None:
    _seed(store, "a", 1)
    with pytest.raises((InvalidSessionIdError, InvalidArgumentError)):
        store.fork_session(src, dst, at)  # type: ignore[arg-type]
    assert store.list_sessions() == ["a"]


def test_a_fork_of_history_compacted_away_is_refused(url: str) -> None:
    with SessionStore(url) as store:
        _seed(store, "a")
        store.compact("a", archive=False, force=True)
        with pytest.raises(HistoryUnavailableError, match="'a'"):
            store.fork_session("a", "b", at_seq=2)
        store.fork_session("a", "b")  # the head: the snapshot stands in for it
        assert store.load_bootstrap_state("b") == store.load_bootstrap_state("a")
        assert store.verify("b").problems == []
        assert store.list_sessions() == ["a", "b"]


# -- provenance ---------------------------------------------------------------------


def test_forged_provenance_is_reported_by_verify(url: str, case: EngineCase) -> None:
    with SessionStore(url) as store:
        _seed(store, "a")
        store.fork_session("a", "b", at_seq=4)
        real = _origin(store, "b").h
        forged = "0" * 16

        def forge(data: bytes) -> bytes:  # the origin's hash edited, the line re-hashed
            line, nl, rest = data.partition(b"\n")
            line = line.replace(f'"h":"{real}"}},'.encode(), f'"h":"{forged}"}},'.encode())
            head = next(iter(store.read_events("b", types=["snapshot"])))
            return rehash(line, head.base_h if isinstance(head, Snapshot) else "") + nl + rest

        case.rewrite(store, "b", forge)
        store.core.forget("b")
        assert _origin(store, "b").h == forged  # the line itself checks
        report = store.verify("b")
        assert not report.ok
        (p,) = [p for p in report.problems if p.kind == "fork_origin"]
        assert p.severity == "error" and "'a'" in p.message and real in p.message


@pytest.mark.parametrize(
    "forged",
    [b'"session_id":"a","seq":-5', b'"session_id":"a","seq":99', b'"session_id":"","seq":3'],
)
def test_an_origin_naming_an_impossible_seq_or_id_is_reported(
    url: str, case: EngineCase, forged: bytes
) -> None:
    with SessionStore(url) as store:
        _seed(store, "a")
        store.fork_session("a", "b", at_seq=3)
        base = next(iter(store.read_events("b", types=["snapshot"])))
        assert isinstance(base, Snapshot)

        def forge(data: bytes) -> bytes:
            line, nl, rest = data.partition(b"\n")
            line = line.replace(b'"session_id":"a","seq":3', forged)
            return rehash(line, base.base_h) + nl + rest

        case.rewrite(store, "b", forge)
        store.core.forget("b")
        report = store.verify("b")
        assert not report.ok
        assert [p.kind for p in report.problems if p.severity == "error"] == ["fork_origin"]


def test_provenance_is_checked_against_the_archive_after_the_source_is_compacted(
    url: str,
) -> None:
    with SessionStore(url) as store:
        _seed(store, "a")
        store.fork_session("a", "b", at_seq=3)
        store.append_progress_entry("a", make_entry(7))
        assert store.compact("a", archive=True, force=True).compacted
        assert store.verify("b").problems == []  # seq 3 is read from a's archive
        store.append_progress_entry("a", make_entry(8))
        store.compact("a", archive=True, force=True)
        assert store.verify("b").problems == []


@pytest.mark.parametrize("archive", [True, False])
def test_a_compacted_fork_keeps_its_origin_and_its_check(url: str, archive: bool) -> None:
    with SessionStore(url) as store:
        _seed(store, "a")
        done = store.fork_session("a", "b", at_seq=3)
        for i in range(3):
            store.append_progress_entry("b", make_entry(i, "b"))
        assert store.compact("b", archive=archive, force=True).compacted
        snaps = [e for e in store.read_events("b", types=["snapshot"]) if isinstance(e, Snapshot)]
        assert {e.origin for e in snaps} == {ForkOrigin("a", 3, done.h)}
        assert store.verify("b").problems == []
        assert report_data(store, "b").origin == f"forked from a at seq 3 (hash {done.h})"


def test_a_fork_at_a_pruned_sources_compacted_head_names_its_line_not_the_snapshot(
    url: str,
) -> None:
    """Attack: after `prune_archive`, a fork of a source whose live log was only its
    compaction's snapshot named that snapshot line's own hash as the origin (the exact
    read let the snapshot stand in for the pruned events, passing over the archived line
    it covers), so `verify` of the fork failed (`fork_origin`). The fork names the hash
    of the source's line at that seq, as its history holds it, and verifies clean."""
    with SessionStore(url) as store:
        if not isinstance(store.engine, PruningEngine):
            pytest.skip("this engine does not prune archived history")
        _seed(store, "a")
        store.compact("a", archive=True, force=True)
        store.append_progress_entry("a", make_entry(8))
        store.compact("a", archive=True, force=True)
        assert store.prune_archive("a", store.last_seq("a")).segments
        assert store.compact("a", archive=True, force=True).compacted
        done = store.fork_session("a", "b")
        assert store.verify("b").problems == []
        assert done.h == next(iter(store.read_events("a", from_seq=done.seq))).h


def test_a_source_gone_or_compacted_away_is_info_not_an_error(url: str) -> None:
    with SessionStore(url) as store:
        _seed(store, "a")
        _seed(store, "c")
        store.fork_session("a", "b", at_seq=3)
        store.fork_session("c", "d", at_seq=3)
        store.delete_session("a")
        store.compact("c", archive=False, force=True)  # seq 3 is in no segment now
        for sid, src in (("b", "a"), ("d", "c")):
            report = store.verify(sid)
            assert report.ok
            (p,) = report.problems
            assert (p.kind, p.severity) == ("fork_source", "info")
            assert "source not available" in p.message and repr(src) in p.message


def test_a_fork_beside_a_live_writer_names_a_consistent_seq_and_hash(url: str) -> None:
    with SessionStore(url) as store:
        _seed(store, "a", 1)
        stop = threading.Event()

        def writer() -> None:
            i = 0
            while not stop.is_set():
                store.append("a", [ProgressAppended(entry=make_entry(i))] * 2)
                i += 1

        t = threading.Thread(target=writer)
        t.start()
        try:
            forks = [store.fork_session("a", f"f{i}") for i in range(8)]
        finally:
            stop.set()
            t.join()
        for done in forks:
            line = next(e for e in store.read_events("a", from_seq=done.seq, to_seq=done.seq))
            assert line.h == done.h
            assert store.load_bootstrap_state(done.session_id) == store.state_at("a", seq=done.seq)
            assert store.verify(done.session_id).problems == []


def test_migrate_keeps_a_forks_origin_and_its_check(tmp_path: Path) -> None:
    """file -> memory -> file: the origin snapshot is copied byte for byte, and verify's
    provenance check still passes where the source came along."""
    mem = f"memory://forks-{uuid.uuid4().hex}"
    with (
        SessionStore(tmp_path / "one") as one,
        SessionStore(mem) as two,
        SessionStore(tmp_path / "three") as three,
    ):
        _seed(one, "a")
        one.fork_session("a", "b", at_seq=5)
        one.append_progress_entry("b", make_entry(9))
        one.compact("a", archive=True, force=True)
        for a, b in ((one, two), (two, three)):
            for sid in ("a", "b"):
                migrate_session(a.engine, b.engine, sid)
        assert _exported(three, "b") == _exported(one, "b")
        assert _origin(three, "b") == _origin(one, "b")
        assert three.verify("b").problems == []
        assert three.load_bootstrap_state("b") == one.load_bootstrap_state("b")


# -- the CLI and the report -------------------------------------------------------------


def test_the_cli_forks_and_log_and_state_read_the_fork(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "s"
    with SessionStore(root) as store:
        _seed(store, "a")
    rc, out, _ = cli_in_process(capsys, "fork", str(root), "a", "b", "--at-seq", "4")
    assert rc == 0 and "forked 'b' from 'a' at seq 4" in out
    rc, out, _ = cli_in_process(capsys, "fork", str(root), "a", "c", "--json")
    data = json.loads(out)
    with SessionStore(root) as store:
        assert rc == 0 and data["seq"] == store.last_seq("a") and data["source"] == "a"
        assert data["hash"] == _origin(store, "c").h
    rc, out, _ = cli_in_process(capsys, "log", str(root), "b")
    assert rc == 0 and "forked from a at seq 4" in out
    rc, out, _ = cli_in_process(capsys, "state", str(root), "b", "--json")
    assert rc == 0 and json.loads(out)
    rc, out, _ = cli_in_process(capsys, "verify", str(root), "b")
    assert rc == 0
    for argv, says in (
        (("a", "b"), "already exists"),
        (("nope", "d"), "no session 'nope'"),
        (("a", "d", "--at-seq", "99"), "no event 99"),
    ):
        rc, _, err = cli_in_process(capsys, "fork", str(root), *argv)
        assert rc == 2 and says in err and "Traceback" not in err


def test_the_report_shows_a_forks_origin(tmp_path: Path) -> None:
    with SessionStore(tmp_path / "s") as store:
        _seed(store, "a")
        done = store.fork_session("a", "b", at_seq=3)
        data = report_data(store, "b")
        line = f"forked from a at seq 3 (hash {done.h})"
        assert data.origin == line
        assert f'<p id="origin">{line}</p>' in render_page(data)
        assert report_data(store, "a").origin is None
