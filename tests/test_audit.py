"""Audit and replay (eventstore.ops.audit): read_events, state_at, verify, follow, repair."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import oracle
import pytest
from conftest import FIXTURES, LOGS, make_checkpoint, make_entry, make_features, make_manifest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import checkpoints, feature_lists, messages, progress_entries

from eventstore import (
    Event,
    FeaturePassUpdated,
    InvalidArgumentError,
    Message,
    MessagesAppended,
    ProgressAppended,
    Role,
    SessionStore,
    Snapshot,
    UnknownEvent,
)
from eventstore.engines.file.layout import SessionPaths
from eventstore.format.reader import read_lines
from eventstore.ops import audit
from eventstore.ops.audit import (
    HistoryUnavailableError,
    UnknownSessionError,
)
from projections import (
    BootstrapProjection,
    TranscriptProjection,
    fold,
)

sys.path.insert(0, str(FIXTURES / "tamper"))
import random

import make as tamper  # noqa: E402
import msgspec
from conftest import log_path

from eventstore import Retention
from eventstore.errors import CorruptLogError, HistoryPrunedError, UnsafePathError
from eventstore.format.events import ArchivePruned
from eventstore.ops.export import export_session
from eventstore.ops.history import first_kept_seq
from eventstore.ops.lifecycle import prune_archive
from eventstore.ops.repair import repair
from projections import StructProjection

try:
    import eventstore.ops.compaction  # noqa: F401

    HAVE_COMPACTION = True
except ImportError:  # pragma: no cover - only before compaction lands
    HAVE_COMPACTION = False

needs_compaction = pytest.mark.skipif(
    not HAVE_COMPACTION, reason="eventstore.ops.compaction is not written yet"
)

BOOT = BootstrapProjection()
TRANS = TranscriptProjection()
REPO = Path(__file__).resolve().parent.parent


def _history(store: SessionStore, sid: str) -> None:
    """A small session of every event type, in several batches."""
    store.initialize_session_if_missing(
        sid, make_manifest(sid), make_features(3), make_entry(0), make_checkpoint()
    )
    store.append_transcript_messages(sid, [Message(role=Role.USER, content="hi")])
    store.update_feature_pass(sid, "f2", True)
    store.append_progress_entry(sid, make_entry(1))
    store.append_transcript_messages(sid, [Message(role=Role.ASSISTANT, content="hello")])


def _log_events(store: SessionStore, sid: str) -> list[Event]:
    """The live log read by the log layer itself (independent of eventstore.ops.audit)."""
    path = SessionPaths(store.root, sid).log
    return read_lines(path.read_bytes(), store.codec, store.codec.decoder(None), str(path)).events


# -- read_events -----------------------------------------------------------------------


def test_read_events_ranges_and_types(store: SessionStore) -> None:
    _history(store, "s")
    all_ = list(store.read_events("s"))
    assert [e.seq for e in all_] == list(range(1, 9))
    assert all(e.ts.tzinfo is not None for e in all_)
    assert [e.seq for e in store.read_events("s", from_seq=3, to_seq=5)] == [3, 4, 5]
    by_tag = list(store.read_events("s", types=["messages_appended"]))
    by_cls = list(store.read_events("s", types=[MessagesAppended]))
    assert [e.seq for e in by_tag] == [e.seq for e in by_cls] == [5, 8]
    assert all(type(e) is MessagesAppended for e in by_tag)
    mixed = list(store.read_events("s", types=[FeaturePassUpdated, "progress_appended"]))
    assert [type(e) for e in mixed] == [ProgressAppended, FeaturePassUpdated, ProgressAppended]
    assert list(store.read_events("nobody")) == []


@needs_compaction
def test_read_events_across_compactions_reads_the_archive(store: SessionStore) -> None:
    _history(store, "s")
    before = [(e.seq, e.h, type(e)) for e in store.read_events("s")]
    store.compact("s", force=True)
    store.append_progress_entry("s", make_entry(2))
    store.compact("s", force=True)
    store.append_progress_entry("s", make_entry(3))
    after = [(e.seq, e.h, type(e)) for e in store.read_events("s")]
    assert after[: len(before)] == before
    assert [s for s, _, _ in after] == list(range(1, 11))  # each once, snapshots not yielded
    snaps = list(store.read_events("s", types=["snapshot"]))
    # the archive holds each event once: the first snapshot's lines were archived, the
    # snapshot itself (derived state, issue 12 item 13) was not; the live one remains
    assert [e.seq for e in snaps] == [9]
    assert audit.verify(store, "s").ok


@needs_compaction
def test_no_archive_history_is_a_snapshot_and_state_at_refuses(store: SessionStore) -> None:
    _history(store, "s")
    expected = store.load_bootstrap_state("s")
    store.compact("s", archive=False, force=True)
    store.append_progress_entry("s", make_entry(5))
    evs = list(store.read_events("s"))
    assert [type(e) for e in evs] == [Snapshot, ProgressAppended]
    assert fold(BOOT, BOOT.initial(), evs) == store.load_bootstrap_state("s")
    assert store.state_at("s", seq=8) == expected
    with pytest.raises(HistoryUnavailableError, match="without an archive"):
        store.state_at("s", seq=3)
    rep = audit.verify(store, "s")
    assert rep.ok and [p.kind for p in rep.problems] == ["history_gap"]


def test_state_at_arguments(store: SessionStore) -> None:
    _history(store, "s")
    with pytest.raises(ValueError):
        store.state_at("s")
    with pytest.raises(ValueError):
        store.state_at("s", seq=1, at=store.load_bootstrap_state("s").recent_progress[0].created_at)
    with pytest.raises(HistoryUnavailableError):
        store.state_at("s", seq=99)
    assert store.state_at("s", seq=0) == BOOT.initial()


def test_state_at_time(store: SessionStore) -> None:
    store.initialize_session_if_missing("s", make_manifest("s"), make_features(2))
    time.sleep(0.01)
    store.append_progress_entry("s", make_entry(1))
    time.sleep(0.01)
    store.update_feature_pass("s", "f1", True)
    evs = _log_events(store, "s")
    at = evs[2].ts  # the progress entry's append time
    assert store.state_at("s", at=at) == fold(BOOT, BOOT.initial(), evs[:3])
    assert store.state_at("s", at=at - timedelta(microseconds=1)) == fold(
        BOOT, BOOT.initial(), evs[:2]
    )
    assert store.state_at("s", at=evs[0].ts - timedelta(days=1)) == BOOT.initial()
    assert store.transcript_at("s", at=evs[-1].ts) == []


# -- state_at == fold of the prefix (hypothesis) ---------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("progress"), progress_entries),
        st.tuples(st.just("checkpoint"), checkpoints),
        st.tuples(st.just("messages"), st.lists(messages, min_size=1, max_size=3)),
        st.tuples(st.just("features"), feature_lists),
        st.tuples(st.just("pass"), st.integers(0, 5), st.booleans()),
        st.tuples(st.just("compact")),
    ),
    min_size=1,
    max_size=14,
)


def _apply(store: SessionStore, sid: str, op: tuple[Any, ...], compact: bool) -> None:
    kind = op[0]
    if kind == "progress":
        store.append_progress_entry(sid, op[1])
    elif kind == "checkpoint":
        store.record_run_checkpoint(sid, op[1])
    elif kind == "messages":
        store.append_transcript_messages(sid, op[1])
    elif kind == "features":
        store.replace_feature_list(sid, op[1])
    elif kind == "pass":
        feats = store.load_bootstrap_state(sid).feature_list
        if feats:
            store.update_feature_pass(sid, feats[op[1] % len(feats)].id, op[2])
    elif kind == "compact" and compact:
        store.compact(sid, force=True)


def _check_every_prefix(store: SessionStore, sid: str, reference: list[Event]) -> None:
    for k in range(len(reference) + 1):
        assert store.state_at(sid, seq=k) == fold(BOOT, BOOT.initial(), reference[:k]), k
        assert store.transcript_at(sid, seq=k) == fold(TRANS, TRANS.initial(), reference[:k]), k


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=ops)
def test_state_at_every_seq_is_the_fold_of_the_prefix(tmp_path: Path, ops: list[Any]) -> None:
    with SessionStore(tmp_path / f"h{time.monotonic_ns()}") as store:
        store.initialize_session_if_missing("s", make_manifest("s"), make_features(3))
        for op in ops:
            _apply(store, "s", op, compact=False)
        _check_every_prefix(store, "s", _log_events(store, "s"))


@needs_compaction
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=ops)
def test_state_at_every_seq_after_compactions(tmp_path: Path, ops: list[Any]) -> None:
    # the same history twice: once never compacted (the reference), once compacted at
    # the drawn points; state_at on the compacted one must equal the fold of the prefix
    base = tmp_path / f"h{time.monotonic_ns()}"
    with SessionStore(base / "ref") as ref, SessionStore(base / "cmp") as cmp_:
        for s in (ref, cmp_):
            s.initialize_session_if_missing("s", make_manifest("s"), make_features(3))
        for op in ops:
            _apply(ref, "s", op, compact=False)
            _apply(cmp_, "s", op, compact=True)
        cmp_.compact("s", force=True)  # at least once, at the end
        _check_every_prefix(cmp_, "s", _log_events(ref, "s"))
        assert audit.verify(cmp_, "s").ok


# -- verify ----------------------------------------------------------------------------


def _store_at(root: Path) -> SessionStore:
    return SessionStore(root)


def test_verify_golden_is_ok(root: Path, install_log: Any) -> None:
    install_log("complete.jsonl")
    with SessionStore(root) as store:
        rep = audit.verify(store, "golden")
    assert rep.ok and rep.problems == [] and rep.events == 18
    last = json.loads((LOGS / "complete.jsonl").read_bytes().splitlines()[-1])
    assert rep.head_hash == last["h"] and rep.head_seq == 18


def _line_offset(path: Path, line_no: int) -> int:
    lines = path.read_bytes().split(b"\n")
    return sum(len(x) + 1 for x in lines[: line_no - 1])


@pytest.mark.parametrize("case", sorted(tamper.EXPECTED))
def test_verify_catches_each_tamper_fixture(case: str) -> None:
    root = FIXTURES / "tamper" / case
    rel, line_no, kind = tamper.EXPECTED[case]
    path = root / rel
    offset = _line_offset(path, line_no)
    seq = json.loads(path.read_bytes().split(b"\n")[line_no - 1])["seq"]
    with SessionStore(root) as store:
        rep = audit.verify(store, "golden")
    assert not rep.ok
    errors = [p for p in rep.problems if p.severity == "error"]
    first = errors[0]
    assert (Path(first.file), first.offset, first.seq) == (path, offset, seq), rep.problems
    assert kind in {p.kind for p in errors if p.offset == offset}


def test_tamper_generator_still_makes_what_verify_catches(tmp_path: Path) -> None:
    # the committed fixtures age with the line format; a fresh run must be caught alike
    subprocess.run(
        [sys.executable, str(FIXTURES / "tamper" / "make.py"), str(tmp_path)], check=True
    )
    for case, (rel, line_no, kind) in tamper.EXPECTED.items():
        path = tmp_path / case / rel
        with SessionStore(tmp_path / case) as store:
            rep = audit.verify(store, "golden")
        first = [p for p in rep.problems if p.severity == "error"][0]
        assert (first.file, first.offset) == (str(path), _line_offset(path, line_no)), case
        assert kind in {p.kind for p in rep.problems if p.offset == first.offset}, case


@pytest.mark.parametrize(
    ("name", "kind", "ok"),
    [("torn_line.jsonl", "torn_tail", True), ("torn_batch.jsonl", "torn_batch", True),
     ("corrupt_middle.jsonl", "undecodable", False)],
)  # fmt: skip
def test_verify_torn_tails_warn_and_corruption_fails(
    root: Path, install_log: Any, name: str, kind: str, ok: bool
) -> None:
    install_log(name)
    with SessionStore(root) as store:
        rep = audit.verify(store, "golden")
    assert rep.ok is ok
    assert kind in [p.kind for p in rep.problems]
    if ok:
        assert all(p.severity == "warning" for p in rep.problems)


def test_verify_unknown_session(store: SessionStore) -> None:
    with pytest.raises(UnknownSessionError):
        audit.verify(store, "nobody")


class Custom(Event, tag="custom_thing", kw_only=True):
    payload: str


def test_unknown_event_types_are_kept_and_reported(root: Path) -> None:
    with SessionStore(root, event_types=[Custom]) as writer:
        writer.initialize_session_if_missing("s", make_manifest("s"), make_features(1))
        writer.append("s", [Custom(payload="from a newer writer")])
    with SessionStore(root) as reader:
        evs = list(reader.read_events("s"))
        assert type(evs[-1]) is UnknownEvent and evs[-1].type_name == "custom_thing"
        assert evs[-1].ts >= evs[-2].ts  # the time of its own line, not 1970
        assert [e.seq for e in reader.read_events("s", types=["custom_thing"])] == [3]
        rep = audit.verify(reader, "s")
        assert rep.ok and [p.kind for p in rep.problems] == ["unknown_type"]


@needs_compaction
def test_verify_across_compactions_and_broken_archive(store: SessionStore) -> None:
    _history(store, "s")
    store.compact("s", force=True)
    store.append_progress_entry("s", make_entry(2))
    store.compact("s", force=True)
    rep = audit.verify(store, "s")
    assert rep.ok and len(rep.files) == 3 and rep.events == 9
    # an archive file edited after the fact is caught in the archive, with its offset
    first = audit.history_files(store, "s")[0].path
    data = first.read_bytes()
    first.write_bytes(data.replace(b'"summary":"step 1"', b'"summary":"step X"'))
    rep = audit.verify(store, "s")
    assert not rep.ok
    bad = [p for p in rep.problems if p.severity == "error"]
    assert bad[0].file == str(first) and bad[0].kind == "hash_mismatch"
    assert bad[0].offset == data.index(b'"summary":"step 1"') - data[
        : data.index(b'"summary":"step 1"')
    ][::-1].index(b"\n")


# -- follow ----------------------------------------------------------------------------

APPENDER = textwrap.dedent(
    """
    import sys, time
    from eventstore import SessionStore, ProgressEntry
    root, n, compact_at = sys.argv[1], int(sys.argv[2]), set(map(int, sys.argv[3].split(",")))
    with SessionStore(root) as s:
        for i in range(n):
            s.append_progress_entry("s", ProgressEntry(run_id="p", summary=f"e{i}"))
            if i in compact_at:
                s.compact("s", force=True)
            time.sleep(0.002)
    """
)


@needs_compaction
def test_follow_sees_exactly_what_another_process_appends(root: Path) -> None:
    with SessionStore(root) as store:
        store.initialize_session_if_missing("s", make_manifest("s"), make_features(2))
        seen: list[Event] = []
        stop = threading.Event()

        def run() -> None:
            for ev in store.follow("s", from_seq=1, poll_interval=0.01, stop=stop):
                seen.append(ev)

        t = threading.Thread(target=run)
        t.start()
        n = 120
        subprocess.run(
            [sys.executable, "-c", APPENDER, str(root), str(n), "10,40,41,90"],
            check=True,
            cwd=REPO,
            timeout=60,
        )
        deadline = time.monotonic() + 10
        while len(seen) < n + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # a chance to (wrongly) yield more
        stop.set()
        t.join(5)
        assert not t.is_alive()
        assert [e.seq for e in seen] == list(range(1, n + 3))
        summaries = [e.entry.summary for e in seen if isinstance(e, ProgressAppended)]
        assert summaries == [f"e{i}" for i in range(n)]
        assert not any(isinstance(e, Snapshot) for e in seen)
        assert len(audit.history_files(store, "s")) == 5  # four archives + the live log


@pytest.mark.parametrize("bad", [0, -1, 1e-320, float("nan"), float("inf"), None, "0.2"])
def test_follow_refuses_a_poll_interval_that_would_spin(store: SessionStore, bad: object) -> None:
    """1e-320 was taken: the follower then re-read the log in a loop, spinning a core."""
    with pytest.raises(InvalidArgumentError, match="poll_interval"):
        next(iter(store.follow("s", poll_interval=bad)))  # type: ignore[arg-type]


def test_follow_stops_and_starts_where_asked(store: SessionStore) -> None:
    _history(store, "s")
    stop = threading.Event()
    got: list[int] = []
    for ev in store.follow("s", from_seq=6, poll_interval=0.01, stop=stop):
        got.append(ev.seq)
        if ev.seq == 8:
            stop.set()
    assert got == [6, 7, 8]


# -- stats, export, repair -------------------------------------------------------------


def test_stats_and_export(store: SessionStore) -> None:
    _history(store, "s")
    s = audit.stats(store, "s")
    assert s.events == 8 and s.last_seq == 8 and s.by_type["messages_appended"] == 2
    assert s.first_ts is not None and s.log_events == 8 and s.archive_files == 0
    doc = audit.export_session(store, "s")
    assert doc["last_seq"] == 8 and doc["transcript"][1]["content"] == "hello"
    lines = b"".join(audit.export_jsonl(store, "s"))
    assert lines == SessionPaths(store.root, "s").log.read_bytes()


def test_repair_truncates_a_torn_tail(root: Path, install_log: Any) -> None:
    log = install_log("torn_line.jsonl")
    size = log.stat().st_size
    with SessionStore(root) as store:
        rep = audit.repair(store, "golden")
        assert rep.action == "truncated" and rep.kept_events == 17
        assert log.stat().st_size == rep.kept_bytes == size - rep.dropped_bytes
        assert audit.verify(store, "golden").problems == []
        assert audit.repair(store, "golden").action == "none"


def test_repair_forgets_everything_the_store_kept_of_the_log_it_replaced(
    root: Path, install_log: Any
) -> None:
    """Folds, head and the checked prefix alike: the next load reads the repaired log."""
    install_log("torn_line.jsonl")
    with SessionStore(root) as store:
        before = store.load_transcript_messages("golden")  # a fold from the start
        assert store.cache_info("golden").prefix  # it vouches for the bytes it checked
        assert audit.repair(store, "golden").action == "truncated"
        info = store.cache_info("golden")
        assert info.folds == {} and info.prefix is None
        assert store.load_transcript_messages("golden") == before


def test_repair_moves_a_corrupt_log_aside(root: Path, install_log: Any) -> None:
    log = install_log("corrupt_middle.jsonl")
    original = log.read_bytes()
    with SessionStore(root) as store:
        rep = audit.repair(store, "golden")
        assert rep.action == "moved_aside" and rep.moved_to is not None
        assert Path(rep.moved_to).read_bytes() == original
        assert rep.kept_events == 9 and log.read_bytes().startswith(original[: rep.kept_bytes])
        assert audit.verify(store, "golden").ok
        # seq 10..18, set aside, keep their numbers (a `quarantined` line holds each)
        assert rep.quarantined == (10, 18)
        store.append_progress_entry("golden", make_entry(1))  # the log takes appends again
        assert store.last_seq("golden") == 19


# -- attacks: export, verify, state_at and repair ------------------------------------------


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
    forged = line.replace(b'"text":"n5"', b'"text":"forged"')
    log.write_bytes(oracle.rehash(forged, msgspec.json.decode(forged)["base_h"]) + b"\n")
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
