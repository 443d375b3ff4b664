"""An outside attack on the maintenance and audit paths: importing the older design's
files (`eventstore.ops.legacy`), export (`eventstore.ops.export`), expiry and pruning
(`eventstore.ops.lifecycle`), `verify`, `repair`, `migrate` and the memory engine.

Each finding test states the promise it holds and how the code before its fix broke
it; the tests marked "held" are coverage of attacks that did not break anything.
Findings whose fix belongs in a file this attack could not change are strict xfails
naming the fix.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest
from conftest import log_path, make_entry, make_features, make_manifest, wait_child

from eventstore import (
    Event,
    Message,
    ProgressAppended,
    Retention,
    Role,
    SessionStore,
)
from eventstore.cli.app import main
from eventstore.errors import (
    CorruptLogError,
    HistoryPrunedError,
    HistoryUnavailableError,
    InvalidArgumentError,
    InvalidRecordError,
    UnsafePathError,
)
from eventstore.format.chain import (
    line_hash,
    split_hash,
)
from eventstore.format.events import (
    ArchivePruned,
    MessagesAppended,
    Snapshot,
)
from eventstore.ops import audit, lifecycle
from eventstore.ops.export import export_session
from eventstore.ops.history import first_kept_seq
from eventstore.ops.legacy import (
    import_legacy,
    legacy_file_name,
)
from eventstore.ops.lifecycle import (
    delete_older_than,
    parse_age,
    prune_archive,
)
from eventstore.ops.migrate import (
    MigrationError,
    migrate_session,
    same_history,
)
from eventstore.ops.repair import repair
from projections import (
    StructProjection,
    fold,
)


def _legacy_dir(tmp_path: Path, files: dict[str, object]) -> Path:
    """A legacy directory holding one `sessions/<hex id>.json` per (id, document)."""
    base = tmp_path / "legacy"
    (base / "sessions").mkdir(parents=True)
    for sid, doc in files.items():
        (base / "sessions" / legacy_file_name(sid)).write_text(json.dumps(doc))
    return base


_GOOD = {"recent_progress": [{"run_id": "r", "summary": "kept", "created_at_secs": 1}]}


def test_a_legacy_time_past_the_calendar_fails_its_file_alone(tmp_path: Path) -> None:
    """Promise (legacy module docstring): a file that cannot be decoded is reported as
    failed, and the others are still imported. Broken: a `created_at_secs` past year
    9999 made `timedelta` raise OverflowError, which is no ValueError: it escaped
    `import_legacy` untyped and no later file was imported."""
    legacy = _legacy_dir(
        tmp_path,
        {
            "a-hostile": {
                "recent_progress": [{"run_id": "r", "summary": "x", "created_at_secs": 10**15}]
            },
            "b-good": _GOOD,
        },
    )
    with SessionStore(tmp_path / "store") as store:
        report = import_legacy(store, legacy)
        assert [(i.session_id, i.result) for i in report.items] == [
            ("a-hostile", "failed"),
            ("b-good", "imported"),
        ]
        assert "created_at" in report.items[0].detail
        assert store.list_sessions() == ["b-good"]


@pytest.mark.timeout(10)
def test_a_fifo_in_the_legacy_directory_fails_alone_without_hanging(tmp_path: Path) -> None:
    """Promise (legacy module docstring): a file that cannot be read is reported as
    failed, and the others are still imported. Broken: a FIFO named like a session file
    (`sessions/<hex>.json`) made `import_legacy` block forever in its open (so did a
    link to /dev/zero, reading without end): no file after it was imported and the
    command never returned. Only a regular file is read now, opened without blocking."""
    legacy = _legacy_dir(tmp_path, {"b-good": _GOOD})
    os.mkfifo(legacy / "sessions" / legacy_file_name("a-fifo"))
    with SessionStore(tmp_path / "store") as store:
        report = import_legacy(store, legacy)
        assert [(i.session_id, i.result) for i in report.items] == [
            ("a-fifo", "failed"),
            ("b-good", "imported"),
        ]
        assert "not a regular file" in report.items[0].detail


def test_a_legacy_feature_list_with_an_id_twice_is_refused(tmp_path: Path) -> None:
    """Promise (README, Using it from Python): a feature id twice is refused with
    InvalidRecordError and nothing is written (`replace_feature_list`,
    `initialize_session_if_missing`); the legacy module docstring: a file that cannot be
    decoded fails alone. Broken: import wrote a legacy list holding feature "a" twice, a
    state no session call can make: `update_feature_pass` then flipped both, and
    writing the loaded list back was refused. The file now fails, naming the id."""
    feature = {"id": "a", "category": "c", "description": "d", "steps": [], "passes": False}
    legacy = _legacy_dir(tmp_path, {"a-dup": {"feature_list": [feature, feature]}, "b-good": _GOOD})
    with SessionStore(tmp_path / "store") as store:
        report = import_legacy(store, legacy)
        assert [(i.session_id, i.result) for i in report.items] == [
            ("a-dup", "failed"),
            ("b-good", "imported"),
        ]
        assert "'a' appears twice" in report.items[0].detail
        assert store.list_sessions() == ["b-good"]


def test_an_unreadable_session_fails_its_legacy_file_alone(tmp_path: Path) -> None:
    """Promise (legacy module docstring): one bad file never stops the others. Broken:
    the already-imported check loaded the target session's idempotency keys outside
    the file's error handling, so a session whose log has a damaged line (or a planted
    symlink) raised CorruptLogError out of `import_legacy`: no later file was
    imported."""
    root = tmp_path / "store"
    with SessionStore(root) as store:
        store.append_progress_entry("a-damaged", make_entry(1))
        store.append_progress_entry("a-damaged", make_entry(2))
    log = log_path(root, "a-damaged")
    log.write_bytes(log.read_bytes().replace(b"summary", b"Summary", 1))
    legacy = _legacy_dir(tmp_path, {"a-damaged": _GOOD, "b-good": _GOOD})
    with SessionStore(root) as store:
        report = import_legacy(store, legacy)
        assert [(i.session_id, i.result) for i in report.items] == [
            ("a-damaged", "failed"),
            ("b-good", "imported"),
        ]
        assert "byte 0" in report.items[0].detail  # where the damage is
        assert (report.imported, report.failed) == (1, 1)


def test_export_session_is_one_picture_with_its_head_hash(tmp_path: Path) -> None:
    """Promise (`export_session`): one session as a document with its current state,
    transcript, last sequence number and head hash. Broken: the document had no head
    hash, and beside a writer (here another store on the same root, as another process
    would be) its state, transcript and `last_seq` were three reads at three moments:
    a state without the progress entry whose message the transcript held, and a
    `last_seq` past both. Each batch here appends one entry and one message."""
    root = tmp_path / "store"
    stop = threading.Event()

    def write() -> None:
        with SessionStore(root) as writer:
            i = 0
            while not stop.is_set() and i < 2000:
                batch = [
                    ProgressAppended(entry=make_entry(i)),
                    MessagesAppended(messages=[Message(role=Role.USER, content=f"m{i}")]),
                ]
                writer.append("s", batch)
                i += 1

    with SessionStore(root) as store:
        store.append(
            "s",
            [
                ProgressAppended(entry=make_entry(-1)),
                MessagesAppended(messages=[Message(role=Role.USER, content="m")]),
            ],
        )
        thread = threading.Thread(target=write)
        thread.start()
        try:
            docs = [export_session(store, "s") for _ in range(150)]
        finally:
            stop.set()
            thread.join()
        for doc in docs:
            n = len(doc["state"]["recent_progress"])
            assert (len(doc["transcript"]), doc["last_seq"]) == (n, 2 * n), doc["last_seq"]
        doc = export_session(store, "s")
        assert doc["head_hash"] == store.verify("s").head_hash
        assert doc["last_seq"] == store.last_seq("s")


class Note(Event, tag="note", kw_only=True):
    """An event type a compacting process may not know."""

    text: str


class Notes(StructProjection[list[str]]):
    """The texts of every note, in order."""

    name = "notes"
    version = 1
    event_types = frozenset({"note"})
    state_type = list[str]

    def initial(self) -> list[str]:
        return []

    def apply(self, state: list[str], event: Event) -> list[str]:
        if type(event) is Note:
            state.append(event.text)
        return state


def _rehashed_snapshot(line: bytes) -> bytes:
    """A snapshot line (no newline) with its `h` made to check again: a forger's edit."""
    split = split_hash(line)
    assert split is not None
    base_h = msgspec.json.decode(line)["base_h"]
    return line[:-18] + line_hash(base_h, split[0]).encode() + b'"}'


def test_verify_checks_the_lines_a_snapshot_keeps_verbatim(tmp_path: Path) -> None:
    """Promise (README, Audit and replay): verify checks each snapshot against the fold
    of the archived events, "which catches a snapshot edited and re-hashed". Broken: a
    snapshot's `unknown` lines (events of a type its compactor did not know, kept
    verbatim) were never compared with the archive: one edited in a re-hashed snapshot
    left verify clean, while a reader that knows the type folds the edited copy (here a
    load of `notes` returned "forged")."""
    root = tmp_path / "store"
    with SessionStore(root, event_types=[Note]) as store:
        for i in range(20):
            store.append("s", [Note(text=f"n{i}")])
            store.append_progress_entry("s", make_entry(i))
    with SessionStore(root) as store:  # a compactor that does not know notes
        assert store.compact("s").compacted
    log = log_path(root, "s")
    line = log.read_bytes().rstrip(b"\n")
    assert line.count(b'"text":"n5"') == 1
    log.write_bytes(_rehashed_snapshot(line.replace(b'"text":"n5"', b'"text":"forged"')) + b"\n")
    for cache in log.parent.glob("fold-*"):
        cache.unlink()
    with SessionStore(root, event_types=[Note], projections=[Notes()]) as store:
        assert store.load("s", "notes")[5] == "forged"  # what the edit changes
        report = store.verify("s")
        assert not report.ok
        (problem,) = [p for p in report.problems if p.severity == "error"]
        assert (problem.kind, problem.seq, problem.offset) == ("snapshot_state", 40, 0)
        assert "seq 11" in problem.message  # the line of n5
        assert problem.file == str(log)


def test_compact_refuses_prune_archive_before_zero_before_compacting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Promise (README, The CLI): a usage error exits 2, and bad input changes nothing.
    Broken: `--prune-archive-before 0` passed the argument check (it is digits), so
    `compact` compacted the session and only then had `prune_archive` refuse seq 0:
    exit 1, "0 compacted, 1 failed", and the log had been replaced all the same."""
    root = tmp_path / "store"
    with SessionStore(root) as store:
        for i in range(30):
            store.append_progress_entry("s", make_entry(i))
    before = log_path(root, "s").read_bytes()
    assert main(["compact", str(root), "s", "--prune-archive-before", "0"]) == 2
    assert "--prune-archive-before" in capsys.readouterr().err
    assert log_path(root, "s").read_bytes() == before
    assert not (log_path(root, "s").parent / "archive").exists()


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
            assert other.delete_session(sid)
            other.append_progress_entry(sid, make_entry(2))
        return when

    monkeypatch.setattr(lifecycle, "last_activity", judge_then_recreate)
    with SessionStore(root) as store:
        later = datetime.now(UTC) + timedelta(days=2)
        (result,) = delete_older_than(store, timedelta(days=1), now=later)
        assert (result.session_id, result.result) == ("s", "kept")
        assert [e.entry.summary for e in store.read_events("s")] == [make_entry(2).summary]


def test_verify_flags_a_pruning_record_naming_events_the_live_log_holds(tmp_path: Path) -> None:
    """Promise (README, Pruning archived history): readers tell pruned history from
    history that is there by the `archive_pruned` record, and `verify` says what is
    wrong. Broken: a record written to the log (through `store.append`, which took any
    event then; a forged line now) naming events 1..5 pruned, while the live log holds
    them, made every read from seq 1 and `state_at(seq=3)` raise HistoryPrunedError for
    history that is right there, and `verify` called the session clean (a
    `history_pruned` warning). A genuine
    pruning removes archived logs only: the live log never holds an event it names."""
    with SessionStore(tmp_path) as store:
        for i in range(6):
            store.append_progress_entry("s", make_entry(i))
        record = ArchivePruned(
            first_seq=1, last_seq=5, segments=[], bytes=0, before="seq 6", last_h=""
        )
        assert store.core.write_events("s", [record], None).first_seq == 7
        report = store.verify("s")
        assert not report.ok
        (problem,) = [p for p in report.problems if p.severity == "error"]
        offset = log_path(tmp_path, "s").read_bytes().index(b'{"type":"archive_pruned"')
        assert (problem.kind, problem.seq, problem.offset) == ("pruning_record", 7, offset)
        assert "1..5" in problem.message


def test_pruning_never_records_a_link_the_kept_history_does_not_chain_to(
    tmp_path: Path,
) -> None:
    """Promise (README, Pruning archived history): the first event kept is still
    hash-checked against the record's `last_h`, the link of the last event dropped; an
    irreversible step on bad input changes nothing. Broken: `prune_archive` copied
    `last_h` from the last line of the segment it dropped without checking it: with
    that line's `h` damaged, it recorded a link seq 7 does not chain to and deleted the
    segment, so the intact events 7..18 could never be read again (not even by putting
    the archive file back). Now it refuses, naming where, and changes nothing."""
    with SessionStore(tmp_path) as store:
        for i in range(18):
            store.append_progress_entry("s", make_entry(i))
            if i % 6 == 5:
                assert store.compact("s", force=True).compacted
    archive = log_path(tmp_path, "s").parent / "archive"
    oldest, kept = sorted(archive.iterdir())[:2]
    lines = oldest.read_bytes().rstrip(b"\n").split(b"\n")
    lines[-1] = lines[-1][:-18] + b"0" * 16 + b'"}'  # seq 6's h, damaged
    oldest.write_bytes(b"\n".join(lines) + b"\n")
    with SessionStore(tmp_path) as store:
        with pytest.raises(CorruptLogError) as caught:
            prune_archive(store, "s", before=7)
        assert (caught.value.path, caught.value.offset, caught.value.seq) == (str(kept), 0, 7)
        assert store.last_seq("s") == 18
        assert oldest.exists()


@pytest.mark.parametrize("engine", ["file", "memory"])
@pytest.mark.parametrize("kind", ["snapshot", "archive_pruned"])
def test_append_refuses_the_maintenance_events(tmp_path: Path, engine: str, kind: str) -> None:
    """Promise (README, Errors; The log format): a record the store cannot take is refused
    with InvalidRecordError and nothing is written; a snapshot opens a log or is
    corruption. Broken: `store.append(sid, [Snapshot(...)])` writes a snapshot after the
    first line, and every later load of the session raises CorruptLogError; an
    `ArchivePruned` appended by a caller makes history that is there read as pruned."""
    url = str(tmp_path) if engine == "file" else f"memory://{tmp_path.name}-{kind}"
    with SessionStore(url) as store:
        for i in range(3):
            store.append_progress_entry("s", make_entry(i))
        event = (
            Snapshot(base_h="")
            if kind == "snapshot"
            else ArchivePruned(first_seq=1, last_seq=2, segments=[], bytes=0, before="seq 3")
        )
        with pytest.raises(InvalidRecordError):
            store.append("s", [event])
        assert store.last_seq("s") == 3
    with SessionStore(url) as store:
        assert len(store.load_bootstrap_state("s").recent_progress) == 3
        assert [e.seq for e in store.read_events("s")] == [1, 2, 3]


def test_state_at_is_never_a_state_trimmed_by_retention(tmp_path: Path) -> None:
    """Promise (README, Audit and replay): `state_at` is exactly the fold of events
    1..N, retention never changes it, and history compacted without an archive raises
    HistoryUnavailableError. Broken: after `compact(archive=False,
    retention=Retention(progress=3))` of 10 progress entries, `state_at(seq=10)`
    returns the 3 the snapshot kept, as if they were the fold of events 1..10."""
    with SessionStore(tmp_path) as store:
        for i in range(10):
            store.append_progress_entry("s", make_entry(i))
        report = store.compact("s", archive=False, retention=Retention(progress=3), force=True)
        assert report.compacted
        try:
            state = store.state_at("s", seq=10)
        except HistoryUnavailableError:
            return
        assert len(state.recent_progress) == 10


def _seqs(data: bytes) -> list[int]:
    """The sequence numbers of the lines of `data` that still decode."""
    found = []
    for line in data.splitlines():
        try:
            found.append(msgspec.json.decode(line)["seq"])
        except (msgspec.DecodeError, KeyError, TypeError):
            continue
    return found


@pytest.mark.parametrize("tail", ["intact", "damaged"])
def test_repair_of_a_snapshot_the_archive_cannot_rebuild_reuses_no_seq(
    tmp_path: Path, tail: str
) -> None:
    """Promise (README, Audit and replay): where the archive cannot rebuild a damaged
    opening snapshot, the new snapshot keeps the damaged one's sequence number, "so no
    number is ever used twice"; repair never drops good data. Broken: the lines after
    the damaged snapshot (here seq 31..33, each still chaining to it) were dropped
    from the live log, so the next append was numbered 31 again, beside the original
    31 in the saved copy. Now the lines that chain are kept; and where a damaged line
    among them drops the rest (`damaged`), the snapshot is numbered past every seq the
    original held."""
    with SessionStore(tmp_path) as store:
        for i in range(30):
            store.append_progress_entry("s", make_entry(i))
        assert store.compact("s", archive=False).compacted
        for i in range(3):
            store.append_progress_entry("s", make_entry(100 + i))
    log = log_path(tmp_path, "s")
    data = log.read_bytes()
    data = data[:30] + b"X" + data[31:]  # inside the snapshot's envelope: its hash breaks
    if tail == "damaged":
        assert data.count(b"step 101") == 1
        data = data.replace(b"step 101", b"step 1O1")
    log.write_bytes(data)
    with SessionStore(tmp_path) as store:
        report = repair(store, "s")
        assert report.action == "rebuilt"
        used = _seqs(data)
        assert max(used) == 33
        result = store.append_progress_entry("s", make_entry(200))
        assert result.first_seq > max(used)
        assert store.verify("s").ok
        kept = [p.summary for p in store.load_bootstrap_state("s").recent_progress]
        if tail == "intact":
            assert report.kept_events == 4  # the snapshot and seq 31..33
            assert kept == [make_entry(i).summary for i in (100, 101, 102, 200)]
        else:
            assert kept == [make_entry(200).summary]


def test_repair_refuses_a_planted_archive_symlink(tmp_path: Path) -> None:
    """Promise (README, Guarantees: nothing leaves the root): a symlink where a store
    directory should be (`archive/` included) is refused with UnsafePathError. Broken:
    repair read the archive to rebuild a damaged opening snapshot, took the refusal for
    an archive that "cannot rebuild", and rewrote the log with a snapshot holding the
    initial state: the whole state lost to a planted link. Now repair refuses, and the
    log is left as it was."""
    with SessionStore(tmp_path / "store") as store:
        for i in range(30):
            store.append_progress_entry("s", make_entry(i))
        assert store.compact("s").compacted
    log = log_path(tmp_path / "store", "s")
    archive = log.parent / "archive"
    archive.rename(tmp_path / "elsewhere")
    archive.symlink_to(tmp_path / "elsewhere")
    data = log.read_bytes()
    log.write_bytes(data[:30] + b"X" + data[31:])
    before = sorted(p.name for p in log.parent.iterdir())
    with SessionStore(tmp_path / "store") as store, pytest.raises(UnsafePathError):
        repair(store, "s")
    assert log.read_bytes() == data[:30] + b"X" + data[31:]
    assert sorted(p.name for p in log.parent.iterdir()) == before


def _pruned_session(root: Path) -> SessionStore:
    """A store whose session "p" had events 1..6 pruned (README, Pruning archived
    history), and one more event after."""
    store = SessionStore(root)
    for i in range(18):
        store.append_progress_entry("p", make_entry(i))
        if i % 6 == 5:
            assert store.compact("p", force=True).compacted
    assert prune_archive(store, "p", before=7).segments
    store.append_progress_entry("p", make_entry(100))
    assert store.verify("p").ok
    return store


def test_migrating_a_pruned_session_is_refused_saying_why(tmp_path: Path) -> None:
    """Promise (brief and README, Errors): an error says what is wrong and where.
    Broken: `migrate_session` of a session whose archive was pruned failed with "seq 7
    follows seq 0: run verify on the source", while `verify` calls the source clean:
    it now says the history was pruned before seq 7, and writes nothing."""
    with _pruned_session(tmp_path / "src") as src, SessionStore(tmp_path / "dst") as dst:
        with pytest.raises(MigrationError) as caught:
            migrate_session(src.engine, dst.engine, "p")
        message = str(caught.value)
        assert "pruned" in message and "seq 7" in message and "verify" not in message
        assert dst.list_sessions() == []


@pytest.mark.xfail(
    strict=True,
    reason="migrate.plan_of would have to start a pruned history at its first kept seq"
    " (is_pruned/pruned_start), and the file engine (engines/file.py) names the first"
    " archived segment of a log that opens at seq 7 without a snapshot 1-N (it assumes"
    " base_seq 1), which verify then reports as archive_name",
)
def test_a_pruned_session_migrates(tmp_path: Path) -> None:
    """Promise (migrate module docstring): any session is copied between any two
    engines, history included, so that `verify` agrees on both sides. Broken: a session
    whose archive was pruned cannot be copied at all (MigrationError)."""
    with _pruned_session(tmp_path / "src") as src, SessionStore(tmp_path / "dst") as dst:
        migrate_session(src.engine, dst.engine, "p")
        assert same_history(src.engine, dst.engine, "p")
        assert dst.verify("p").ok
        assert dst.verify("p").head_hash == src.verify("p").head_hash


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


def test_verify_finds_the_newest_archive_file_deleted(tmp_path: Path) -> None:
    """Promise (README, Pruning archived history): "An archive missing or cut short
    without such a record is still corruption"; verify finds a dropped event. Broken:
    after three archived compactions, deleting the newest archive file (events 13..18)
    leaves `verify` clean with a `history_gap` warning, and `read_events` yields the
    live snapshot in place of the six events deleted."""
    with SessionStore(tmp_path) as store:
        for i in range(18):
            store.append_progress_entry("s", make_entry(i))
            if i % 6 == 5:
                assert store.compact("s", force=True).compacted
    archive = log_path(tmp_path, "s").parent / "archive"
    (newest,) = [p for p in archive.iterdir() if p.name.startswith("000000000013-")]
    newest.unlink()
    with SessionStore(tmp_path) as store:
        assert not store.verify("s").ok


# -- coverage: attacks that held ---------------------------------------------------------


def test_state_at_every_seq_is_the_fold_of_the_first_n_events(tmp_path: Path) -> None:
    """Held (README, Audit and replay: state_at is exactly the fold of events 1..N,
    retention never changes it). Attack: a session of progress, pass flips and message
    batches, compacted at random points with and without retention (archive kept);
    for every N from 0 to the last, `state_at(seq=N)` and `transcript_at(seq=N)` equal
    folding the first N events `read_events` yields, and `state_at(at=ts)` the fold of
    every event appended up to that time."""
    rng = random.Random(7)
    with SessionStore(tmp_path) as store:
        store.initialize_session_if_missing("s", make_manifest("s"), make_features(3))
        for i in range(60):
            r = rng.random()
            if r < 0.3:
                store.append_progress_entry("s", make_entry(i))
            elif r < 0.5:
                store.update_feature_pass("s", f"f{1 + i % 3}", bool(i % 2))
            elif r < 0.8:
                msgs = [Message(role=Role.USER, content=f"m{i}.{k}") for k in range(1 + i % 3)]
                store.append_transcript_messages("s", msgs)
            else:
                keep = rng.choice([None, Retention(progress=2, checkpoints=1, messages=3)])
                store.compact("s", force=True, retention=keep)
        events = list(store.read_events("s"))
        last = store.last_seq("s")
        assert [e.seq for e in events] == list(range(1, last + 1))
        boot, talk = store.projections["bootstrap"], store.projections["transcript"]
        for n in range(last + 1):
            first = [e for e in events if e.seq <= n]
            assert store.state_at("s", seq=n) == fold(boot, boot.initial(), first)
            assert store.transcript_at("s", seq=n) == fold(talk, talk.initial(), first)
        for ev in events[::5]:
            upto = [e for e in events if e.ts <= ev.ts]
            assert store.state_at("s", at=ev.ts) == fold(boot, boot.initial(), upto)


def test_expiry_and_pruning_beside_a_writer_process_leave_whole_sessions(tmp_path: Path) -> None:
    """Held (README, Deleting and expiring sessions; Pruning archived history). Attack:
    another process appends to one session for 3 s, compacting every 40 appends, while
    this one runs `delete_older_than` (everything counts as idle) every 0.4 s and
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
                results |= {r.result for r in delete_older_than(store, timedelta(0), now=later)}
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


def _maintained(url: str) -> tuple[object, ...]:
    """What the audit paths say about one session after compactions (one without an
    archive), a pruning and a repair of a torn-free log, on the store at `url`."""
    with SessionStore(url) as store:
        for i in range(30):
            store.append_progress_entry("s", make_entry(i))
            store.append_transcript_messages("s", [Message(role=Role.USER, content=f"m{i}")])
            if i % 7 == 6:
                assert store.compact("s", force=True, archive=i != 20).compacted
            if i == 22:
                assert prune_archive(store, "s", before=15).segments
        kept = first_kept_seq(store, "s")
        report = store.verify("s")
        st = audit.stats(store, "s")
        with pytest.raises(HistoryPrunedError):
            store.state_at("s", seq=10)
        return (
            kept,
            [e.seq for e in store.read_events("s", from_seq=kept)],
            report.ok,
            [(p.kind, p.seq, p.severity) for p in report.problems],
            report.head_seq,
            len(report.files),
            (st.events, st.by_type, st.first_seq, st.last_seq, st.archive_files),
            (st.snapshots, st.compacted_without_archive),
            [line.count(b"\n") for line in audit.export_jsonl(store, "s")],
            repair(store, "s").action,
            export_session(store, "s")["state"],
        )


def test_the_memory_engine_answers_the_audit_paths_as_the_file_engine(tmp_path: Path) -> None:
    """Held (DESIGN: everything a user sees behaves the same on every engine). Attack:
    the same compactions (one without an archive), pruning, verify, stats, export,
    repair and reads below the pruned point on the file and the memory engine give the
    same answers (the hashes differ only by the times of the appends)."""
    assert _maintained(str(tmp_path)) == _maintained(f"memory://{tmp_path.name}")


def test_export_jsonl_is_a_log_that_verifies_and_checks_every_line(tmp_path: Path) -> None:
    """Held (README, The CLI: `export --format jsonl` gives the raw lines, verbatim, so
    they still verify). Attack: the export of a session compacted three times (archive
    kept), written as another store's log, verifies clean and folds to the same state
    and transcript; with one archived line edited (its `h` left), the export raises
    CorruptLogError naming that file and seq instead of passing the edit on."""
    with SessionStore(tmp_path / "a") as store:
        for i in range(18):
            store.append_progress_entry("s", make_entry(i))
            store.append_transcript_messages("s", [Message(role=Role.USER, content=f"m{i}")])
            if i % 6 == 5:
                assert store.compact("s", force=True).compacted
        lines = b"".join(audit.export_jsonl(store, "s"))
        state, talk = store.load_bootstrap_state("s"), store.load_transcript_messages("s")
    copy = log_path(tmp_path / "b", "s")
    copy.parent.mkdir(parents=True)
    copy.write_bytes(lines)
    with SessionStore(tmp_path / "b") as other:
        assert other.verify("s").ok
        assert other.load_bootstrap_state("s") == state
        assert other.load_transcript_messages("s") == talk
    archived = sorted((log_path(tmp_path / "a", "s").parent / "archive").iterdir())[1]
    data = archived.read_bytes()
    assert data.count(b"step 7") == 1
    archived.write_bytes(data.replace(b"step 7", b"step X"))
    with SessionStore(tmp_path / "a") as store:
        with pytest.raises(CorruptLogError) as caught:
            b"".join(audit.export_jsonl(store, "s"))
        assert (caught.value.path, caught.value.seq) == (str(archived), 15)
