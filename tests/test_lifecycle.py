"""Session lifecycle: `eventstore delete ROOT SESSION`, expiry with `--older-than`, beside
live writers and under kill."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import make_entry, make_features, make_manifest, wait_child

import eventstore.ops.lifecycle as lifecycle
from eventstore import (
    ArchivePruned,
    CorruptLogError,
    HistoryUnavailableError,
    Message,
    ProgressEntry,
    Role,
    SessionStore,
)
from eventstore.cli.app import main as cli_main
from eventstore.errors import InvalidArgumentError
from eventstore.ops.history import first_kept_seq
from eventstore.ops.lifecycle import (
    delete_older_than,
    last_activity,
    parse_age,
    prune_archive,
)

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    """`eventstore ARGV` in-process; a usage error argparse reports is exit status 2."""
    try:
        return cli_main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2


def _session(store: SessionStore, sid: str, progress: int = 3) -> None:
    store.initialize_session_if_missing(sid, make_manifest(sid), make_features(4))
    for i in range(progress):
        store.append_progress_entry(sid, ProgressEntry(run_id="r", summary=f"p{i}"))
    store.append_transcript_messages(sid, [Message(Role.USER, f"hello {sid}")])


def _files_of(root: Path, sid: str) -> list[Path]:
    return [p for p in (root / "sessions").rglob("*") if sid in str(p)]


# -- delete ------------------------------------------------------------------------------


def test_delete_removes_log_archive_and_caches_and_nothing_else(root: Path) -> None:
    """`purge=True`: no trace (the default leaves a tombstone: tests/test_tombstones.py)."""
    with SessionStore(root) as store:
        _session(store, "a")
        _session(store, "b")
        store.compact("a", force=True)  # an archive too
        store.append_progress_entry("a", ProgressEntry(run_id="r", summary="after"))
        assert store.load_bootstrap_state("a").manifest is not None  # cached
        assert store.delete_session("a", purge=True) is True
        assert store.list_sessions() == ["b"]
        assert store.load_bootstrap_state("a").manifest is None  # the cache went too
        assert store.load_transcript_messages("a") == []
        assert store.last_seq("a") == 0
        assert store.delete_session("a", purge=True) is False
        assert store.load_bootstrap_state("b").manifest is not None
    assert _files_of(root, "sessions/a") == []
    with SessionStore(root) as fresh:
        assert fresh.list_sessions() == ["b"] and fresh.verify("b").ok


def test_cli_delete_by_name(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with SessionStore(root) as store:
        for sid in ("a", "b", "c"):
            _session(store, sid)
    assert main(["delete", str(root), "a", "c"]) == 0
    out = capsys.readouterr().out
    assert "deleted       a" in out and "2 deleted, 0 failed" in out
    with SessionStore(root) as store:
        assert store.list_sessions() == ["b"]


def test_cli_delete_refuses_an_unknown_session_and_deletes_nothing(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with SessionStore(root) as store:
        _session(store, "a")
    assert main(["delete", str(root), "a", "nope"]) == 2
    assert "unknown session 'nope'" in capsys.readouterr().err
    assert main(["delete", str(root)]) == 2
    assert main(["delete", str(root), "a", "--older-than", "1d"]) == 2
    assert main(["delete", str(root / "missing"), "a"]) == 2
    assert not (root / "missing").exists()
    with SessionStore(root) as store:
        assert store.list_sessions() == ["a"]


def test_cli_delete_dry_run_and_json(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with SessionStore(root) as store:
        _session(store, "a")
    assert main(["delete", str(root), "a", "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["result"] == "would delete"
    with SessionStore(root) as store:
        assert store.list_sessions() == ["a"]


# -- expiry ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30d", 30 * 86400),
        ("12h", 43200),
        ("90m", 5400),
        ("45s", 45),
        ("2w", 14 * 86400),
        ("1.5h", 5400),
    ],
)
def test_parse_age(text: str, seconds: float) -> None:
    assert parse_age(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "30", "d", "-1d", "3y", "1 d 2h", "x30d"])
def test_parse_age_refuses_what_is_not_an_age(text: str) -> None:
    with pytest.raises(ValueError, match="not an age"):
        parse_age(text)


def test_last_activity_is_the_last_event_not_a_compaction(root: Path) -> None:
    with SessionStore(root) as store:
        assert last_activity(store, "none") is None
        _session(store, "a")
        before = last_activity(store, "a")
        assert before is not None
        time.sleep(0.01)
        store.compact("a", force=True)
        assert last_activity(store, "a") == before  # read from the archive


def test_expiry_deletes_only_sessions_idle_longer_than_the_age(root: Path) -> None:
    with SessionStore(root) as store:
        for sid in ("old1", "old2", "new"):
            _session(store, sid)
        t_old = last_activity(store, "old2")
        assert t_old is not None
        later = t_old + timedelta(days=31)
        # "new" is written to 30 days after the others (as seen from `later`: 1 day ago)
        now = datetime.now(UTC)
        assert delete_older_than(store, timedelta(days=30), now=now) == []
        dry = delete_older_than(store, timedelta(days=30), now=later, dry_run=True)
        assert {r.session_id for r in dry} == {"old1", "old2", "new"}
        assert store.list_sessions() == ["new", "old1", "old2"]
        store.append_progress_entry("new", ProgressEntry(run_id="r", summary="fresh"))
        t_new = last_activity(store, "new")
        assert t_new is not None
        results = delete_older_than(store, t_new - t_old - timedelta(microseconds=1), now=t_new)
        assert {r.session_id: r.result for r in results} == {"old1": "deleted", "old2": "deleted"}
        assert store.list_sessions() == ["new"]


def test_cli_expiry(
    root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with SessionStore(root) as store:
        _session(store, "a")
        _session(store, "b")
    assert main(["delete", str(root), "--older-than", "30d"]) == 0
    assert "0 deleted" in capsys.readouterr().out

    class Later(datetime):
        @classmethod
        def now(cls, tz: object = None) -> datetime:  # type: ignore[override]
            return datetime.now(UTC) + timedelta(days=31)

    monkeypatch.setattr(lifecycle, "datetime", Later)
    assert main(["delete", str(root), "--older-than", "30d", "--dry-run"]) == 0
    assert "2 would be deleted" in capsys.readouterr().out
    assert main(["delete", str(root), "--older-than", "30d"]) == 0
    assert "2 deleted, 0 failed" in capsys.readouterr().out
    assert main(["delete", str(root), "--older-than", "soon"]) == 2
    with SessionStore(root) as store:
        assert store.list_sessions() == []


# -- beside live writers -----------------------------------------------------------------


@pytest.mark.slow
def test_delete_beside_live_writers_and_readers_never_shows_half_a_session(root: Path) -> None:
    """Writers keep initializing and appending to the session being deleted; readers keep
    loading it. Every state a reader sees is whole (the init batch is all or nothing, its
    progress in order), and after the last delete the session is gone or a whole new one."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            with SessionStore(root) as s:
                i = 0
                while not stop.is_set():
                    s.initialize_session_if_missing("x", make_manifest("x"), make_features(4))
                    s.append_progress_entry("x", ProgressEntry(run_id=f"w{n}", summary=str(i)))
                    i += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader() -> None:
        try:
            while not stop.is_set():
                with SessionStore(root) as s:
                    st = s.load_bootstrap_state("x")
                    assert (st.manifest is None) == (st.feature_list == [])
                    for run in {p.run_id for p in st.recent_progress}:
                        nums = [int(p.summary) for p in st.recent_progress if p.run_id == run]
                        assert nums == sorted(nums)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(2)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    deleted = 0
    try:
        with SessionStore(root) as s:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                deleted += s.delete_session("x", purge=True)
                time.sleep(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    assert deleted > 10
    with SessionStore(root) as s:
        report = s.verify("x") if "x" in s.list_sessions() else None
        assert report is None or report.ok


# -- under kill --------------------------------------------------------------------------

_DELETER = textwrap.dedent(
    """
    import sys
    from eventstore import SessionStore
    with SessionStore(sys.argv[1]) as store:
        for sid in sys.argv[2:]:
            store.delete_session(sid, purge=True)
    """
)


def test_a_deleter_killed_at_random_moments_never_leaves_half_a_session(root: Path) -> None:
    rng = random.Random(4242)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ids = [f"s{i:03d}" for i in range(60)]
    with SessionStore(root) as store:
        for sid in ids:
            _session(store, sid, progress=2)
            if rng.random() < 0.5:
                store.compact(sid, force=True)
        expected = {sid: store.load_bootstrap_state(sid) for sid in ids}
    for _ in range(4):
        with SessionStore(root) as store:
            left = store.list_sessions()
        if not left:
            break
        proc = subprocess.Popen([sys.executable, "-c", _DELETER, str(root), *left], env=env)
        time.sleep(rng.uniform(0.05, 0.6))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        with SessionStore(root) as store:
            for sid in ids:
                if sid in store.list_sessions():  # whole, as written
                    assert store.verify(sid).ok, sid
                    assert store.load_bootstrap_state(sid) == expected[sid]
                else:  # gone entirely
                    assert store.load_bootstrap_state(sid).manifest is None
                    assert store.last_seq(sid) == 0
    with SessionStore(root) as store:
        for sid in store.list_sessions():
            store.delete_session(sid)
        assert store.list_sessions() == []


# -- pruning archived history ------------------------------------------------------------


def _three_archives(store: SessionStore, sid: str = "p") -> list[int]:
    """A session compacted three times; returns the last seq of each compaction."""
    bounds = []
    for k in range(3):
        for i in range(4):
            store.append_progress_entry(sid, ProgressEntry(run_id=f"r{k}", summary=f"{k}.{i}"))
        bounds.append(store.last_seq(sid))
        store.compact(sid, force=True)
    store.append_progress_entry(sid, ProgressEntry(run_id="live", summary="after"))
    return bounds


@pytest.mark.parametrize("url", ["dir", "memory://"])
def test_prune_by_seq_removes_the_oldest_archives_and_records_it(root: Path, url: str) -> None:
    with SessionStore(root if url == "dir" else url) as store:
        bounds = _three_archives(store)
        state = store.load_bootstrap_state("p")
        report = prune_archive(store, "p", bounds[1] + 1)  # the first two archives
        assert [(s.first_seq, s.last_seq) for s in report.segments] == [
            (1, bounds[0]),
            (bounds[0] + 1, bounds[1]),  # an archive holds each event once: not the snapshot
        ]
        assert report.bytes > 0 and report.event_seq == store.last_seq("p")
        ev = list(store.read_events("p", from_seq=report.event_seq))[-1]
        assert isinstance(ev, ArchivePruned)
        assert (ev.first_seq, ev.last_seq, ev.before) == (1, bounds[1], f"seq {bounds[1] + 1}")
        assert len(ev.segments) == 2 and ev.bytes == report.bytes
        assert store.load_bootstrap_state("p") == state  # the live state is untouched
        with pytest.raises(HistoryUnavailableError):
            store.state_at("p", seq=2)
        assert store.state_at("p", seq=bounds[2]).recent_progress[-1].summary == "2.3"
        assert prune_archive(store, "p", bounds[1] + 1).segments == []  # nothing left to do
        assert store.verify("p").ok


def test_maintenance_is_not_activity(root: Path) -> None:
    with SessionStore(root) as store:
        _three_archives(store)
        before = last_activity(store, "p")
        time.sleep(0.01)
        store.compact("p", force=True)
        prune_archive(store, "p", store.last_seq("p"))  # an archive_pruned record at the end
        store.compact("p", force=True)
        assert last_activity(store, "p") == before


def test_prune_by_time_and_nothing_old_enough_writes_nothing(root: Path) -> None:
    with SessionStore(root) as store:
        _three_archives(store)
        seq = store.last_seq("p")
        early = datetime(2000, 1, 1, tzinfo=UTC)
        assert prune_archive(store, "p", early).event_seq is None
        assert store.last_seq("p") == seq
        report = prune_archive(store, "p", datetime.now(UTC) + timedelta(seconds=1))
        assert len(report.segments) == 3  # every archive; the live log stays
        assert store.load_bootstrap_state("p").recent_progress[-1].summary == "after"
        with pytest.raises(ValueError):
            prune_archive(store, "p", datetime(2030, 1, 1))  # naive
        with pytest.raises(ValueError):
            prune_archive(store, "p", 0)


def test_cli_compact_prune_archive_before(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with SessionStore(root) as store:
        bounds = _three_archives(store)
        before = store.last_seq("p")
    assert main(["compact", str(root), "p", "--prune-archive-before", str(bounds[2] + 1)]) == 0
    out = capsys.readouterr().out
    assert "pruned 3 archived logs" in out
    assert main(["compact", str(root), "p", "--prune-archive-before", "soon"]) == 2
    with SessionStore(root) as store:
        events = list(store.read_events("p", from_seq=before))
        assert any(isinstance(e, ArchivePruned) for e in events)
        assert store.verify("p").ok


@pytest.mark.slow
def test_prune_beside_a_live_writer_loses_nothing_live(root: Path) -> None:
    stop = threading.Event()
    errors: list[BaseException] = []
    written: list[int] = []

    def writer() -> None:
        try:
            with SessionStore(root) as s:
                i = 0
                while not stop.is_set():
                    s.append_progress_entry("p", ProgressEntry(run_id="w", summary=str(i)))
                    written.append(i)
                    i += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=writer)
    t.start()
    try:
        with SessionStore(root) as s:
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                if s.last_seq("p"):
                    s.compact("p", force=True)
                    prune_archive(s, "p", s.last_seq("p"))
    finally:
        stop.set()
        t.join()
    assert errors == []
    with SessionStore(root) as s:
        got = [int(p.summary) for p in s.load_bootstrap_state("p").recent_progress]
        assert got == written
        assert s.verify("p").ok


_PRUNER = textwrap.dedent(
    """
    import sys
    from eventstore import SessionStore
    from eventstore.ops.lifecycle import prune_archive
    with SessionStore(sys.argv[1]) as store:
        for sid in sys.argv[2:]:
            prune_archive(store, sid, store.last_seq(sid) + 1)
    """
)


def test_a_pruner_killed_at_random_moments_leaves_the_live_state_whole(root: Path) -> None:
    rng = random.Random(99)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ids = [f"p{i:02d}" for i in range(25)]
    with SessionStore(root) as store:
        for sid in ids:
            _three_archives(store, sid)
        expected = {sid: store.load_bootstrap_state(sid) for sid in ids}
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", _PRUNER, str(root), *ids], env=env)
        time.sleep(rng.uniform(0.05, 0.5))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        with SessionStore(root) as store:
            for sid in ids:
                state = store.load_bootstrap_state(sid)
                assert state == expected[sid], sid
                assert store.verify(sid).ok, sid
    with SessionStore(root) as store:
        for sid in ids:
            prune_archive(store, sid, store.last_seq(sid) + 1)
            assert not (root / "sessions" / sid / "archive").exists() or not any(
                (root / "sessions" / sid / "archive").glob("*.jsonl")
            )


def test_expiry_keeps_a_session_written_to_after_it_was_judged_idle(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SessionStore(root) as store:
        _session(store, "busy")
        real = lifecycle.last_activity

        def judged_then_written(s: object, sid: str) -> datetime | None:
            when = real(s, sid)  # idle as judged...
            store.append_progress_entry(sid, ProgressEntry(run_id="r", summary="just now"))
            return when  # ...but written to before the removal

        monkeypatch.setattr(lifecycle, "last_activity", judged_then_written)
        far = datetime.now(UTC) + timedelta(days=365)
        results = delete_older_than(store, timedelta(days=1), now=far)
        assert [(r.session_id, r.result) for r in results] == [("busy", "kept")]
        assert store.list_sessions() == ["busy"]


def test_pruned_history_is_a_warning_but_a_lost_archive_is_corruption(root: Path) -> None:
    with SessionStore(root) as store:
        bounds = _three_archives(store)
        archive = root / "sessions" / "p" / "archive"
        prune_archive(store, "p", bounds[0] + 1)
        report = store.verify("p")
        assert report.ok
        kinds = {p.kind: p for p in report.problems}
        assert "history_pruned" in kinds and kinds["history_pruned"].severity == "warning"
        assert "pruned" in kinds["history_pruned"].message
        assert "without an archive" not in " ".join(p.message for p in report.problems)
        with pytest.raises(HistoryUnavailableError, match="pruned"):
            store.state_at("p", seq=bounds[1])  # needs events 1..bounds[0], pruned
        with pytest.raises(HistoryUnavailableError, match="pruned"):
            list(store.read_events("p", to_seq=bounds[1]))  # from 1: never partial
        assert [
            e.seq for e in store.read_events("p", from_seq=bounds[0] + 1, to_seq=bounds[1])
        ] == list(range(bounds[0] + 1, bounds[1] + 1))
        # an archive pruning did not record: corruption, for readers and verify
        (archive / sorted(f.name for f in archive.glob("*.jsonl"))[0]).unlink()
        assert not store.verify("p").ok
        with pytest.raises(CorruptLogError):
            list(store.read_events("p", from_seq=bounds[0] + 1))


@pytest.mark.parametrize("line", [0, 1])
def test_an_edit_of_what_pruning_kept_still_fails_the_chain(root: Path, line: int) -> None:
    """The record keeps the link of the last pruned event: the first line kept is checked
    too (line 0), not only those chained to it (line 1)."""
    with SessionStore(root) as store:
        bounds = _three_archives(store)
        prune_archive(store, "p", bounds[0] + 1)
        kept = sorted((root / "sessions" / "p" / "archive").glob("*.jsonl"))[0]
        lines = kept.read_bytes().split(b"\n")
        edited = lines[line].replace(f'"1.{line}"'.encode(), f'"1.{line}X"'.encode())
        assert edited != lines[line]
        lines[line] = edited
        kept.write_bytes(b"\n".join(lines))
        assert not store.verify("p").ok
        with pytest.raises(CorruptLogError):
            list(store.read_events("p", from_seq=bounds[0] + 1))


def test_an_interrupted_pruning_is_understood(root: Path) -> None:
    """The record is written before any segment goes: with the segments still there,
    readers follow the record (the intent), verify warns, pruning again finishes."""
    with SessionStore(root) as store:
        bounds = _three_archives(store)
        archive = root / "sessions" / "p" / "archive"
        names = sorted(f.name for f in archive.glob("*.jsonl"))
        record = ArchivePruned(first_seq=1, last_seq=bounds[1], segments=names[:2], bytes=1,
                               before=f"seq {bounds[1] + 1}")  # fmt: skip
        store.core.write_events("p", [record], None)  # prune_archive's own append
        (archive / names[1]).unlink()  # a crash removed the second but not the first
        report = store.verify("p")
        assert report.ok, report.problems
        assert "archive_pruned" in {p.kind for p in report.problems}
        assert store.state_at("p", seq=bounds[2]).recent_progress[-1].summary == "2.3"
        with pytest.raises(HistoryUnavailableError):
            store.state_at("p", seq=1)
        assert [s.where for s in prune_archive(store, "p", bounds[1] + 1).segments] == [
            str(archive / names[0])
        ]
        assert store.verify("p").ok


# -- attacks -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda s: delete_older_than(s, timedelta(days=1), now=datetime(2030, 1, 1)),
        lambda s: delete_older_than(s, 30),  # an int where an age belongs
        lambda s: delete_older_than(s, timedelta(days=-1)),
        lambda s: prune_archive(s, "s", before=0),
        lambda s: prune_archive(s, "s", before=datetime(2030, 1, 1)),
        lambda s: parse_age("soon"),
    ],
    ids=["naive-now", "int-age", "negative-age", "seq-0", "naive-before", "bad-age-text"],
)
def test_expiry_and_pruning_refuse_bad_arguments_typed(
    tmp_path: Path, call: Callable[[SessionStore], object]
) -> None:
    """Promise (README, Errors): every error is an `EventStoreError`, and bad input
    changes nothing. Broken: `delete_older_than` with a naive `now` or an age that is
    no timedelta raised a bare TypeError from comparing times, a negative age and
    `prune_archive`'s bad `before` a bare ValueError; each is now an
    InvalidArgumentError (still a ValueError), raised before anything is judged."""
    with SessionStore(tmp_path) as store:
        store.append_progress_entry("s", make_entry(1))
        with pytest.raises(InvalidArgumentError):
            call(store)
        assert store.last_seq("s") == 1


def test_expiry_keeps_a_session_recreated_after_it_was_judged_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Promise (README, Deleting and expiring sessions): a session written to between
    being judged idle and its removal is kept. Broken: "written to" was judged by the
    last sequence number alone, so a session another process deleted and created anew
    in that window, with as many events, looked untouched: the new session, written a
    moment ago, was deleted. The check now compares the chain point (seq and link),
    which a compaction keeps and any new history changes."""
    root = tmp_path / "store"
    with SessionStore(root) as store:
        store.append_progress_entry("s", make_entry(1))
    judged = lifecycle.last_activity

    def judge_then_recreate(store: SessionStore, sid: str) -> datetime | None:
        when = judged(store, sid)
        with SessionStore(root) as other:  # another process, in the window
            assert other.delete_session(sid, purge=True)
            other.append_progress_entry(sid, make_entry(2))
        return when

    monkeypatch.setattr(lifecycle, "last_activity", judge_then_recreate)
    with SessionStore(root) as store:
        later = datetime.now(UTC) + timedelta(days=2)
        (result,) = delete_older_than(store, timedelta(days=1), now=later)
        assert (result.session_id, result.result) == ("s", "kept")
        assert [e.entry.summary for e in store.read_events("s")] == [make_entry(2).summary]


def test_a_compaction_without_archive_is_not_activity(tmp_path: Path) -> None:
    """Promise (README, Deleting and expiring sessions): `--older-than` judges a session
    by its last event, and "a compaction is not activity". Broken: compacting an idle
    session with `archive=False` makes its last activity the compaction's time, so a
    session idle for 60 days and compacted today is kept by `--older-than 30d`."""
    with SessionStore(tmp_path) as store:
        store.append_progress_entry("s", make_entry(1))
        when = next(iter(store.read_events("s"))).ts
        assert store.compact("s", archive=False, force=True).compacted
        assert lifecycle.last_activity(store, "s") == when


@pytest.mark.slow
def test_expiry_and_pruning_beside_a_writer_process_leave_whole_sessions(tmp_path: Path) -> None:
    """Held (README, Deleting and expiring sessions; Pruning archived history). Attack:
    another process appends to one session for 3 s, compacting every 40 appends, while
    this one runs `delete_older_than(purge=True)` (everything counts as idle; with
    tombstones the writer would be refused: tests/test_tombstones.py) every 0.4 s and
    in between `prune_archive` of all but the last 30 events. Every expiry result is "deleted" or
    "kept" (never "failed"), the session always verifies clean when it exists, and at
    the end reads from its first kept seq give each event once, in order."""
    root = tmp_path / "store"
    with SessionStore(root) as store:
        store.append_progress_entry("s", make_entry(0))
    until = time.monotonic() + 3
    pid = os.fork()
    if pid == 0:  # the writer process
        code = 1
        try:
            with SessionStore(root) as writer:
                n = 0
                while time.monotonic() < until:
                    writer.append_progress_entry("s", make_entry(n))
                    n += 1
                    if n % 40 == 0:
                        writer.compact("s", force=True)
            code = 0
        finally:
            os._exit(code)
    results: set[str] = set()
    pruned = 0
    later = datetime.now(UTC) + timedelta(days=1)
    with SessionStore(root) as store:
        # expire every 0.4 s, so the writer builds archives to prune in between (expiring
        # every few iterations left no session ever past 40 events on a fast machine)
        next_expiry = time.monotonic() + 0.4
        while time.monotonic() < until:
            if time.monotonic() >= next_expiry:
                next_expiry += 0.4
                results |= {
                    r.result for r in delete_older_than(store, timedelta(0), now=later, purge=True)
                }
            elif store.last_seq("s") > 40:
                pruned += len(prune_archive(store, "s", before=store.last_seq("s") - 30).segments)
            if "s" in store.list_sessions():
                assert store.verify("s").ok
        assert wait_child(pid, 10) == 0
        assert results <= {"deleted", "kept"} and "deleted" in results
        assert pruned > 0
        if "s" in store.list_sessions():
            kept = first_kept_seq(store, "s")
            seqs = [e.seq for e in store.read_events("s", from_seq=kept)]
            assert seqs == list(range(kept, store.last_seq("s") + 1))
