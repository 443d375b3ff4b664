"""Retention policies: `Policy`, `SessionStore(retention=)` at automatic compaction, and
`SessionStore.gc` / `eventstore gc` — on every engine, beside a live writer process and
under SIGKILL."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import cli_in_process, make_entry, make_features, make_manifest
from engines import EngineCase

from eventstore import (
    ArchivePruned,
    GcReport,
    HistoryPrunedError,
    Message,
    Policy,
    Role,
    SessionDeletedError,
    SessionStore,
    Snapshot,
    entropy,
)
from eventstore.errors import InvalidArgumentError, UnsupportedError
from eventstore.ops import lifecycle
from eventstore.ops.tombstone import delete_session

REPO = Path(__file__).resolve().parent.parent
LONG_AGO = datetime.now(UTC) - timedelta(days=60)
PRUNES = ("file", "memory", "redis")  # the engines that can prune archived history


def _session(store: SessionStore, sid: str, events: int = 4) -> None:
    store.initialize_session_if_missing(sid, make_manifest(sid), make_features(2))
    for i in range(events):
        store.append_progress_entry(sid, make_entry(i))
    store.append_transcript_messages(sid, [Message(Role.USER, f"hello {sid}")])


def _old_session(store: SessionStore, sid: str, seed: int, events: int = 4) -> None:
    """A session whose every event is 60 days old (the documented clock hook)."""
    with entropy.fixed(seed, start=LONG_AGO, step=timedelta(seconds=1)):
        _session(store, sid, events)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _picture(store: SessionStore) -> dict[str, object]:
    """What a store holds, through the public API: per session its head and history."""
    out: dict[str, object] = {}
    for sid in store.list_sessions():
        events = [(e.seq, type(e).__name__) for e in store.read_events(sid, from_seq=1)]
        out[sid] = (store.last_seq(sid), events, store.tombstone_of(sid))
    return out


# -- the policy --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"idle": 30},
        {"idle": timedelta(seconds=-1)},
        {"archive_older_than": "30d"},
        {"keep_events": 0},
        {"keep_events": True},
        {"keep_events": 2.5},
    ],
)
def test_a_bad_policy_is_refused_typed(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError, match="Policy"):
        Policy(**kwargs)  # type: ignore[arg-type]


def test_a_store_refuses_what_is_not_a_policy_and_gc_needs_one(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="retention must be a Policy"):
        SessionStore(tmp_path / "a", retention={"idle": 1})  # type: ignore[arg-type]
    assert not (tmp_path / "a").exists()
    with SessionStore(tmp_path / "b") as store:
        _session(store, "s")
        with pytest.raises(InvalidArgumentError, match="needs a policy"):
            store.gc()
        with pytest.raises(InvalidArgumentError, match="dry_run"):
            store.gc(Policy(idle=timedelta(0)), dry_run=1)  # type: ignore[arg-type]
        assert store.tombstone_of("s") is None


def test_archive_pruning_is_refused_where_the_engine_cannot_prune(
    url: str, case: EngineCase
) -> None:
    policy = Policy(archive_older_than=timedelta(days=1))
    if case.name in PRUNES:
        SessionStore(url, retention=policy).close()
        return
    with pytest.raises(UnsupportedError, match="cannot prune"):
        SessionStore(url, retention=policy)
    with SessionStore(url) as store:
        _session(store, "s")
        seq = store.last_seq("s")
        with pytest.raises(UnsupportedError, match="cannot prune"):
            store.gc(Policy(idle=timedelta(0), archive_older_than=timedelta(0)))
        assert store.last_seq("s") == seq and store.tombstone_of("s") is None


# -- at automatic compaction -------------------------------------------------------------


def test_keep_events_compacts_a_long_log_as_it_is_written(url: str) -> None:
    """Without `auto_compact`, a policy's `keep_events` compacts a session whose live log
    passes it, archiving what it replaces: the state and the whole history stay. (A
    compaction that would not shrink the log is skipped, as automatic compaction's is.)"""
    with SessionStore(url) as plain:
        for i in range(30):
            plain.append_progress_entry("p", make_entry(i))
        assert plain.engine.head("p").base_seq == 1  # never compacted without a policy
    with SessionStore(url, retention=Policy(keep_events=5)) as store:
        for i in range(30):
            store.append_progress_entry("s", make_entry(i))
        assert store.engine.head("s").base_seq > 1  # compacted as it was written
        got, want = store.load_bootstrap_state("s"), store.load_bootstrap_state("p")
        assert got.recent_progress == want.recent_progress
        assert [e.seq for e in store.read_events("s", from_seq=1)] == list(range(1, 31))
        assert store.verify("s").ok


def test_archive_older_than_prunes_at_each_automatic_compaction(url: str, case: EngineCase) -> None:
    """Each automatic compaction is followed by pruning the archive older than the
    policy's age (0 s: all of it), recorded by `archive_pruned` events; the live state
    stays whole and the session verifies (the pruned range is a warning)."""
    if case.name not in PRUNES:
        pytest.skip("the engine cannot prune archived history")
    policy = Policy(keep_events=5, archive_older_than=timedelta(0))
    with SessionStore(url) as plain:
        for i in range(30):
            plain.append_progress_entry("p", make_entry(i))
    with SessionStore(url, retention=policy) as store:
        for i in range(30):
            store.append_progress_entry("s", make_entry(i))
        kept = store.first_kept_seq("s")
        assert kept > 1  # the oldest history is gone...
        with pytest.raises(HistoryPrunedError):
            list(store.read_events("s", from_seq=1))
        got, want = store.load_bootstrap_state("s"), store.load_bootstrap_state("p")
        assert got.recent_progress == want.recent_progress  # ...the state is whole
        assert store.verify("s").ok
        pruning = [e for e in store.read_events("s", from_seq=kept) if type(e) is ArchivePruned]
        snapshots = [e for e in store.read_events("s", from_seq=kept) if type(e) is Snapshot]
        assert pruning or any(s.pruned for s in snapshots)  # ...and the pruning recorded


# -- gc ----------------------------------------------------------------------------------


def test_gc_tombstones_idle_sessions_and_keeps_the_others(url: str) -> None:
    with SessionStore(url) as store:
        for k in range(3):
            _old_session(store, f"old{k}", seed=k + 1)
            _session(store, f"new{k}")
        before = {sid: store.load_bootstrap_state(sid) for sid in store.list_sessions()}
        report = store.gc(Policy(idle=timedelta(days=30)))
        assert isinstance(report, GcReport) and not report.dry_run
        assert sorted(report.tombstoned) == ["old0", "old1", "old2"]
        assert report.sessions == 6 and report.failed == [] and report.kept == []
        assert report.bytes_freed > 0
        for k in range(3):
            assert store.tombstone_of(f"old{k}") is not None
            with pytest.raises(SessionDeletedError):
                store.append_progress_entry(f"old{k}", make_entry(9))
            assert store.tombstone_of(f"new{k}") is None
            assert store.load_bootstrap_state(f"new{k}") == before[f"new{k}"]
            assert store.verify(f"new{k}").ok
        assert store.gc(Policy(idle=timedelta(days=30))).tombstoned == []  # nothing twice


def _mixed_store(store: SessionStore, prunes: bool) -> None:
    """Old sessions, a long one, and (where the engine prunes) archived ones."""
    _old_session(store, "idle", seed=7)
    _session(store, "long", events=20)
    _session(store, "short", events=1)
    if prunes:
        for _ in range(3):
            _session(store, "archived", events=3)
            assert store.compact("archived", force=True).compacted


def test_a_dry_run_changes_no_byte_and_reports_what_gc_then_does(tmp_path: Path) -> None:
    """Every file of the store is byte-identical after a dry run, and the real gc that
    follows does what the dry run said (file engine: it prunes too)."""
    root = tmp_path / "store"
    policy = Policy(idle=timedelta(days=30), keep_events=10, archive_older_than=timedelta(0))
    with SessionStore(root) as store:
        _mixed_store(store, prunes=True)
    files = _files(root)
    with SessionStore(root) as store:
        dry = store.gc(policy, dry_run=True)
    assert _files(root) == files
    assert dry.dry_run and dry.tombstoned == ["idle"] and dry.compacted == ["long"]
    assert dry.pruned_segments >= 3 and dry.bytes_freed > 0
    with SessionStore(root) as store:
        done = store.gc(policy)
        assert done.tombstoned == dry.tombstoned and done.compacted == dry.compacted
        assert {p.session_id for p in done.pruned} >= {p.session_id for p in dry.pruned}
        assert done.pruned_bytes >= dry.pruned_bytes and done.bytes_freed > 0
        assert store.tombstone_of("idle") is not None
        for sid in ("long", "short", "archived"):
            assert store.verify(sid).ok


def test_a_dry_run_changes_nothing_on_every_engine(url: str, case: EngineCase) -> None:
    prunes = case.name in PRUNES
    policy = Policy(
        idle=timedelta(days=30),
        keep_events=10,
        archive_older_than=timedelta(0) if prunes else None,
    )
    with SessionStore(url) as store:
        _mixed_store(store, prunes)
        picture = _picture(store)
        dry = store.gc(policy, dry_run=True)
        assert dry.tombstoned == ["idle"] and dry.compacted == ["long"]
        assert _picture(store) == picture


# -- beside a live writer, under kill ------------------------------------------------------

_WRITER = textwrap.dedent(
    """
    import sys, time
    from eventstore import ProgressEntry, SessionStore
    until = time.monotonic() + float(sys.argv[2])
    with SessionStore(sys.argv[1]) as store, open(sys.argv[3], "w") as acked:
        n = 0
        while time.monotonic() < until:
            r = store.append_progress_entry("live", ProgressEntry(run_id="w", summary=str(n)))
            acked.write(f"{r.last_seq}\\n")
            acked.flush()
            n += 1
    """
)


def test_gc_beside_a_live_writer_process_never_removes_the_session_being_written(
    url: str, case: EngineCase, tmp_path: Path
) -> None:
    """Another process appends to "live" for 3 s while this one runs gc (idle 30 days,
    a long-log limit that compacts "live" again and again) in a loop; idle sessions
    created meanwhile are tombstoned. The writer never meets a tombstone, every seq it
    was acknowledged is in the session at the end, in order, and it verifies."""
    if not case.processes:
        pytest.skip("the engine's sessions are not shared across processes")
    policy = Policy(idle=timedelta(days=30), keep_events=20)
    with SessionStore(url) as store:
        store.append_progress_entry("live", make_entry(0))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    acked_file = tmp_path / "acked"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, url, "3", str(acked_file)], env=env)
    tombstoned: list[str] = []
    rounds = 0
    with SessionStore(url) as store:
        while proc.poll() is None and rounds < 30:
            _old_session(store, f"old{rounds}", seed=100 + rounds, events=1)
            report = store.gc(policy)
            assert report.failed == [], report.failed
            assert "live" not in report.tombstoned
            tombstoned += report.tombstoned
            rounds += 1
        assert proc.wait(timeout=30) == 0
        acked = [int(x) for x in acked_file.read_text().split()]
        assert acked and store.tombstone_of("live") is None
        seqs = [e.seq for e in store.read_events("live", from_seq=1)]
        assert seqs == list(range(1, store.last_seq("live") + 1))
        assert set(acked) <= set(seqs)
        assert store.verify("live").ok
    assert rounds >= 2 and f"old{rounds - 2}" in tombstoned


_GC = textwrap.dedent(
    """
    import sys
    from datetime import timedelta
    from eventstore import Policy, SessionStore
    policy = Policy(idle=timedelta(days=30), keep_events=5, archive_older_than=timedelta(0))
    with SessionStore(sys.argv[1]) as store:
        store.gc(policy)
    """
)


@pytest.mark.slow
def test_a_gc_killed_at_random_moments_leaves_every_session_whole_or_tombstoned(
    tmp_path: Path,
) -> None:
    """SIGKILL a gc process at random moments, again and again: after each kill every
    session either reads as it was written (and verifies) or is tombstoned; a last gc
    finishes the job: every old session tombstoned, every young one whole."""
    rng = random.Random(3232)
    root = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    old = [f"old{i:02d}" for i in range(20)]
    young = [f"new{i:02d}" for i in range(20)]
    with SessionStore(root) as store:
        for i, sid in enumerate(old):
            _old_session(store, sid, seed=500 + i, events=rng.randrange(1, 12))
        for sid in young:
            _session(store, sid, events=rng.randrange(1, 12))
            if rng.random() < 0.5:
                store.compact(sid, force=True)
                _session(store, sid, events=3)
        expected = {sid: store.load_bootstrap_state(sid) for sid in old + young}

    def check() -> None:
        with SessionStore(root) as store:
            for sid in old + young:
                if store.tombstone_of(sid) is not None:
                    assert sid in old, sid  # a young session is never idle
                    continue
                assert store.load_bootstrap_state(sid) == expected[sid], sid
                assert store.verify(sid).ok, sid

    for _ in range(6):
        proc = subprocess.Popen([sys.executable, "-c", _GC, str(root)], env=env)
        time.sleep(rng.uniform(0.2, 1.2))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        check()
    with SessionStore(root) as store:
        store.gc(Policy(idle=timedelta(days=30), keep_events=5, archive_older_than=timedelta(0)))
        assert {t.session_id for t in store.deleted_sessions()} == set(old)
    check()


# -- the command line ----------------------------------------------------------------------


def test_cli_gc_dry_run_json_then_for_real(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as store:
        _mixed_store(store, prunes=True)
    files = _files(root)
    args = ["gc", str(root), "--idle", "30d", "--keep-events", "10", "--archive-older-than", "0s"]
    code, out, err = cli_in_process(capsys, *args, "--dry-run", "--json")
    assert code == 0 and err == ""  # no progress bar: stderr is no terminal
    dry = json.loads(out)
    assert dry["dry_run"] is True and dry["tombstoned"] == ["idle"]
    assert dry["compacted"] == ["long"] and dry["pruned_segments"] >= 3
    assert _files(root) == files
    code, out, err = cli_in_process(capsys, *args)
    assert code == 0 and "1 tombstoned" in out and "deleted       idle" in out
    code, out, err = cli_in_process(capsys, "gc", str(root), "--idle", "0s", "--json")
    assert code == 0 and sorted(json.loads(out)["tombstoned"]) == ["archived", "long", "short"]


def test_cli_gc_never_reports_a_session_failed_whose_archive_another_process_pruned(
    url: str, case: EngineCase, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: another process prunes a session's archive while `eventstore gc --idle`
    judges it, between the read of where its history starts and the read of its newest
    events: gc reported the session as failed (HistoryPrunedError). What is gone was
    never its newest activity: it is judged from what is kept, nothing failed (exit 0),
    the young session kept and the old one too (the pruning record is a write after
    its judgment) until the next gc tombstones it, on every engine that prunes."""
    if case.name not in PRUNES:
        pytest.skip("the engine cannot prune archived history")
    with SessionStore(url) as store:
        for _ in range(3):
            _old_session(store, "old", seed=11, events=3)
            with entropy.fixed(12, start=LONG_AGO, step=timedelta(seconds=1)):
                assert store.compact("old", force=True).compacted
            _session(store, "young", events=3)
            assert store.compact("young", force=True).compacted
        _old_session(store, "old", seed=13, events=1)  # (its activity is not all pruned)
        _session(store, "young", events=1)
    other = SessionStore(url)  # the other process
    real = lifecycle.first_kept_seq
    pruned: list[str] = []

    def then_pruned(core: Any, session_id: str) -> int:
        first = real(core, session_id)
        if session_id not in pruned:  # once per session, right after gc read it
            pruned.append(session_id)
            assert other.prune_archive(session_id, datetime.now(UTC) + timedelta(days=1)).segments
        return first

    monkeypatch.setattr(lifecycle, "first_kept_seq", then_pruned)
    try:
        rc, out, err = cli_in_process(capsys, "gc", url, "--idle", "30d", "--json")
    finally:
        other.close()
    assert sorted(pruned) == ["old", "young"]
    report = json.loads(out)
    assert (rc, report["failed"], err) == (0, [], "")
    # the pruning record moved the old one's head after gc judged it: kept this time
    assert (report["tombstoned"], report["kept"]) == ([], ["old"])
    monkeypatch.undo()
    rc, out, err = cli_in_process(capsys, "gc", url, "--idle", "30d", "--json")
    assert (rc, json.loads(out)["tombstoned"]) == (0, ["old"])
    with SessionStore(url) as store:
        assert store.tombstone_of("young") is None and store.verify("young").ok


@pytest.mark.parametrize(
    "argv",
    [
        ["gc", "{root}"],
        ["gc", "{root}", "--idle", "30 days"],
        ["gc", "{root}", "--keep-events", "0"],
        ["gc", "{root}/missing", "--idle", "1d"],
    ],
)
def test_cli_gc_refuses_bad_usage_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as store:
        _old_session(store, "idle", seed=9)
    files = _files(root)
    code, _, err = cli_in_process(capsys, *(a.format(root=root) for a in argv))
    assert code == 2 and "error" in err
    assert _files(root) == files


def test_an_idle_delete_keeps_a_session_written_to_before_its_tombstone(tmp_path: Path) -> None:
    """The re-check under the operation: a session judged idle, then written to by
    another store before its tombstone is appended, is kept (`kept`), its write intact."""
    root = tmp_path / "store"
    with SessionStore(root) as store, SessionStore(root) as other:
        _old_session(store, "busy", seed=11)
        head = store.engine.head("busy")
        other.append_progress_entry("busy", make_entry(99))
        assert not delete_session(store, "busy", if_head=head)
        assert store.tombstone_of("busy") is None and store.last_seq("busy") == head.seq + 1
        assert delete_session(store, "busy", if_head=store.engine.head("busy"))
        assert store.tombstone_of("busy") is not None
