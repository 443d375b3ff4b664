"""Bad input: session ids, records of the wrong shape, corrupt logs, optimistic concurrency,
idempotency keys, and file permissions."""

from __future__ import annotations

import os
import stat
import threading
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    cli_in_process,
    log_path,
    make_checkpoint,
    make_entry,
    make_features,
    make_manifest,
    one_line_error,
)
from engines import EngineCase
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracle import rehash

from eventstore import (
    BootstrapState,
    ConcurrencyError,
    CorruptLogError,
    Event,
    EventStoreError,
    FeatureNotFoundError,
    FeatureRecord,
    InitPlan,
    InvalidRecordError,
    InvalidSessionIdError,
    Message,
    NestingTooDeepError,
    ProgressAppended,
    ProgressEntry,
    Quarantined,
    Role,
    RunCheckpoint,
    SessionStore,
    ToolUseBlock,
)
from eventstore.format.depth import MAX_DEPTH
from projections import StructProjection

# -- session ids -----------------------------------------------------------------------

BAD_IDS = [
    pytest.param("", id="empty"),
    pytest.param("x" * 1025, id="1025-ascii-bytes"),
    pytest.param("é" * 512 + "x", id="1025-utf8-bytes"),
    pytest.param("a\x00b", id="nul"),
    pytest.param("\x00", id="only-nul"),
    pytest.param("\ud800", id="lone-surrogate"),
    pytest.param(None, id="none"),
    pytest.param(42, id="int"),
    pytest.param(b"abc", id="bytes"),
    pytest.param(Path("abc"), id="path"),
]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_invalid_session_id_is_refused_everywhere(store: SessionStore, bad: object) -> None:
    """Every operation refuses an invalid id with InvalidSessionIdError (a ValueError and an
    EventStoreError) before touching the disk."""
    ops: list[Callable[[], object]] = [
        lambda: store.is_initialized(bad),  # type: ignore[arg-type]
        lambda: store.load_bootstrap_state(bad),  # type: ignore[arg-type]
        lambda: store.load_transcript_messages(bad),  # type: ignore[arg-type]
        lambda: store.initialize_session_if_missing(bad, make_manifest(), []),  # type: ignore[arg-type]
        lambda: store.save_manifest(bad, make_manifest()),  # type: ignore[arg-type]
        lambda: store.append_progress_entry(bad, make_entry()),  # type: ignore[arg-type]
        lambda: store.replace_feature_list(bad, make_features()),  # type: ignore[arg-type]
        lambda: store.update_feature_pass(bad, "f1", True),  # type: ignore[arg-type]
        lambda: store.record_run_checkpoint(bad, make_checkpoint()),  # type: ignore[arg-type]
        lambda: store.append_transcript_messages(bad, []),  # type: ignore[arg-type]
    ]
    for op in ops:
        with pytest.raises(InvalidSessionIdError) as info:
            op()
        assert isinstance(info.value, ValueError)
        assert isinstance(info.value, EventStoreError)
    assert store.list_sessions() == []
    assert not (store.root / "sessions").exists() or not any((store.root / "sessions").iterdir())


GOOD_IDS = [
    "plain-id_1.2",
    "a/b",
    "/etc/passwd",
    "../../escape",
    "..",
    ".",
    "a b  c",
    " leading space",
    "ünïcødé-セッション-🚀",
    "back\\slash",
    "_looks-encoded",
    "~looks-hashed",
    "-dash",
    "x" * 128,
    "x" * 129,
    "x" * 1024,
    "é" * 512,
    "a/" * 200,
    "\n\t",
]


def test_unusual_ids_work_stay_inside_root_and_list_back(store: SessionStore) -> None:
    """Ids with "/", "..", spaces, non-ASCII and 1,024 bytes are usable sessions, their
    directories lie inside the root, and list_sessions gives back the original ids."""
    assert len("é" * 512) == 512 and len(("é" * 512).encode()) == 1024
    for i, sid in enumerate(GOOD_IDS):
        assert store.initialize_session_if_missing(sid, make_manifest(sid), make_features(1))
        store.append_progress_entry(sid, make_entry(i))
    root = os.path.realpath(store.root)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            real = os.path.realpath(os.path.join(dirpath, name))
            assert os.path.commonpath([root, real]) == root
    sessions = store.root / "sessions"
    assert len(list(sessions.iterdir())) == len(GOOD_IDS)
    assert store.list_sessions() == sorted(GOOD_IDS)
    # a fresh store reads each one back under its own id
    again = SessionStore(store.root)
    assert again.list_sessions() == sorted(GOOD_IDS)
    for i, sid in enumerate(GOOD_IDS):
        state = again.load_bootstrap_state(sid)
        assert state.manifest is not None and state.manifest.session_id == sid
        assert state.recent_progress == [make_entry(i)]
    # nothing was created outside the root (e.g. by "../../escape" or "/etc/passwd")
    # (beside the session index: eventstore.engines.file.index)
    assert [n for n in sorted(os.listdir(store.root)) if not n.startswith("index.")] == ["sessions"]


def test_ordinary_ids_are_verbatim_directory_names(store: SessionStore) -> None:
    """An ordinary id is its own directory name, so a person can find it."""
    store.append_progress_entry("run-2026.03_a", make_entry())
    assert (store.root / "sessions" / "run-2026.03_a" / "log.jsonl").is_file()


# -- records of the wrong type or shape --------------------------------------------------

NAIVE = datetime(2026, 3, 1, 9, 0)


def _bad_writes(store: SessionStore, sid: str) -> dict[str, Callable[[], object]]:
    feature = make_features(1)[0]
    return {
        "manifest-not-a-manifest": lambda: store.save_manifest(sid, {"session_id": sid}),  # type: ignore[arg-type]
        "manifest-field-int": lambda: store.save_manifest(sid, make_manifest(sid, active_branch=3)),
        "manifest-steps-int": lambda: store.save_manifest(
            sid,
            make_manifest(sid, init_plan=InitPlan(steps=[1])),  # type: ignore[list-item]
        ),
        "manifest-metadata-int": lambda: store.save_manifest(
            sid, make_manifest(sid, metadata={"a": 1})
        ),
        "progress-a-string": lambda: store.append_progress_entry(sid, "did things"),  # type: ignore[arg-type]
        "progress-naive-datetime": lambda: store.append_progress_entry(
            sid, ProgressEntry(run_id="r", summary="s", created_at=NAIVE)
        ),
        "progress-run-id-int": lambda: store.append_progress_entry(
            sid,
            ProgressEntry(run_id=7, summary="s"),  # type: ignore[arg-type]
        ),
        "checkpoint-naive-completed": lambda: store.record_run_checkpoint(
            sid, RunCheckpoint(run_id="r", completed_at=NAIVE)
        ),
        "checkpoint-bad-status": lambda: store.record_run_checkpoint(
            sid,
            RunCheckpoint(run_id="r", status="done"),  # type: ignore[arg-type]
        ),
        "checkpoint-is-progress": lambda: store.record_run_checkpoint(sid, make_entry()),  # type: ignore[arg-type]
        "features-passes-yes": lambda: store.replace_feature_list(
            sid,
            [FeatureRecord(id="f", category="c", description="d", steps=[], passes="yes")],  # type: ignore[arg-type]
        ),
        "features-steps-ints": lambda: store.replace_feature_list(
            sid,
            [FeatureRecord(id="f", category="c", description="d", steps=[1], passes=True)],  # type: ignore[list-item]
        ),
        "features-a-dict": lambda: store.replace_feature_list(sid, [{"id": "f"}]),  # type: ignore[list-item]
        "features-one-record": lambda: store.replace_feature_list(sid, feature),  # type: ignore[arg-type]
        "features-a-string": lambda: store.replace_feature_list(sid, "f1"),  # type: ignore[arg-type]
        "pass-yes": lambda: store.update_feature_pass(sid, "f1", "yes"),  # type: ignore[arg-type]
        "pass-int": lambda: store.update_feature_pass(sid, "f1", 1),  # type: ignore[arg-type]
        "pass-id-int": lambda: store.update_feature_pass(sid, 1, True),  # type: ignore[arg-type]
        "messages-a-string": lambda: store.append_transcript_messages(sid, "hi"),  # type: ignore[arg-type]
        "messages-one-bad": lambda: store.append_transcript_messages(
            sid,
            [Message(role=make_entry(), content="x")],  # type: ignore[arg-type]
        ),
        "messages-content-none": lambda: store.append_transcript_messages(
            sid,
            [Message(role="user", content=None)],  # type: ignore[arg-type]
        ),
        "init-bad-feature": lambda: store.initialize_session_if_missing(
            sid + "-new",
            make_manifest(sid + "-new"),
            [feature, "f2"],  # type: ignore[list-item]
        ),
        "init-naive-entry": lambda: store.initialize_session_if_missing(
            sid + "-new",
            make_manifest(sid + "-new"),
            [feature],
            ProgressEntry(run_id="r", summary="s", created_at=NAIVE),
        ),
        "init-bad-checkpoint": lambda: store.initialize_session_if_missing(
            sid + "-new",
            make_manifest(sid + "-new"),
            [feature],
            None,
            make_entry(),  # type: ignore[arg-type]
        ),
        "append-not-events": lambda: store.append(sid, [make_entry()]),  # type: ignore[list-item]
        "append-bad-payload": lambda: store.append(
            sid,
            [ProgressAppended(entry=ProgressEntry(run_id="r", summary="s", created_at=NAIVE))],
        ),
        "append-empty": lambda: store.append(sid, []),
    }


def test_wrong_records_raise_invalid_record_and_write_nothing(store: SessionStore) -> None:
    """Records of the wrong type or with wrong field types get InvalidRecordError (an
    EventStoreError) and leave the log byte for byte as it was."""
    sid = "victim"
    assert store.initialize_session_if_missing(sid, make_manifest(sid), make_features())
    path = log_path(store.root, sid)
    before = path.read_bytes()
    state = store.load_bootstrap_state(sid)
    for name, write in _bad_writes(store, sid).items():
        with pytest.raises(InvalidRecordError) as info:
            write()
        assert isinstance(info.value, EventStoreError), name
        assert path.read_bytes() == before, name
        assert not log_path(store.root, sid + "-new").exists(), name
    assert store.load_bootstrap_state(sid) == state
    assert store.last_seq(sid) == 2
    assert store.list_sessions() == [sid]


def test_unknown_feature_raises_and_writes_nothing(store: SessionStore) -> None:
    """update_feature_pass on an unknown id: FeatureNotFoundError (a KeyError and an
    EventStoreError) naming the id, and the log is unchanged."""
    store.initialize_session_if_missing("s", make_manifest("s"), make_features())
    path = log_path(store.root, "s")
    before = path.read_bytes()
    with pytest.raises(FeatureNotFoundError) as info:
        store.update_feature_pass("s", "nope", True)
    assert isinstance(info.value, KeyError) and isinstance(info.value, EventStoreError)
    assert "nope" in str(info.value)
    assert path.read_bytes() == before
    assert SessionStore(store.root).load_bootstrap_state("s").feature_list == make_features()


def test_refused_write_on_unknown_session_creates_no_session(store: SessionStore) -> None:
    """A write refused on a session that does not exist leaves no trace: no session listed."""
    with pytest.raises(FeatureNotFoundError):
        store.update_feature_pass("ghost", "f1", True)
    with pytest.raises(ConcurrencyError):
        store.append("ghost2", [ProgressAppended(entry=make_entry())], expected_seq=5)
    assert store.list_sessions() == []


# -- corrupt logs ----------------------------------------------------------------------


def test_corrupt_middle_line_names_file_offset_and_seq(install_log, root: Path) -> None:  # type: ignore[no-untyped-def]
    """A damaged line in the middle is never skipped: CorruptLogError names the file, the
    byte offset where the line starts and the sequence number it should have."""
    path = install_log("corrupt_middle.jsonl")
    lines = path.read_bytes().split(b"\n")
    bad_index = next(i for i, line in enumerate(lines) if b"\0" in line)
    offset = sum(len(line) + 1 for line in lines[:bad_index])
    seq = bad_index + 1
    store = SessionStore(root)
    for load in (store.load_bootstrap_state, store.load_transcript_messages):
        with pytest.raises(CorruptLogError) as info:
            load("golden")
        err = info.value
        assert (err.offset, err.seq) == (offset, seq)
        assert Path(err.path) == path
        msg = str(err)
        assert str(path) in msg and f"byte {offset}" in msg and f"seq {seq}" in msg


def test_log_with_a_sequence_gap_is_corrupt(install_log, root: Path) -> None:  # type: ignore[no-untyped-def]
    """A dropped line in the middle (a gap in the sequence) is reported, not folded."""
    path = install_log("complete.jsonl")
    lines = path.read_bytes().splitlines(keepends=True)
    dropped = 9  # seq 10, a single-line batch
    assert b'"seq":10,' in lines[dropped] and b'"more"' not in lines[dropped]
    path.write_bytes(b"".join(lines[:dropped] + lines[dropped + 1 :]))
    with pytest.raises(CorruptLogError) as info:
        SessionStore(root).load_bootstrap_state("golden")
    assert info.value.offset == sum(len(x) for x in lines[:dropped])
    assert info.value.seq == 10


def test_blank_lines_hold_no_event_and_never_shift_a_torn_tail(install_log, root: Path) -> None:  # type: ignore[no-untyped-def]
    """Blank lines (which msgspec's decode_lines skips) change no state, and a torn batch
    after them is cut at its own first line, not one line off (a fuzzer's find)."""
    path = install_log("complete.jsonl")
    clean = SessionStore(root).load_bootstrap_state("golden")
    lines = path.read_bytes().splitlines(keepends=True)
    assert b'"more"' not in lines[-1]
    # a blank line in the middle, then the last batch torn after two blank lines
    torn = lines[-1][: len(lines[-1]) // 2]
    path.write_bytes(b"".join([*lines[:5], b"\n", *lines[5:], b"\n\n", b"\n"]))
    assert SessionStore(root).load_bootstrap_state("golden") == clean
    assert SessionStore(root).load_bootstrap_state("golden") == clean
    path.write_bytes(b"".join([*lines[:-1], b"\n\n", torn]))
    with SessionStore(root) as store:
        last = store.last_seq("golden")
        store.append_progress_entry("golden", make_entry())
        assert store.last_seq("golden") == last + 1
        assert SessionStore(root).load_bootstrap_state("golden") == store.load_bootstrap_state(
            "golden"
        )


def test_only_blank_lines_read_as_empty(install_log, root: Path) -> None:  # type: ignore[no-untyped-def]
    """A log of blank lines only loads as an empty session instead of crashing."""
    path = install_log("complete.jsonl")
    path.write_bytes(b"\n")
    assert SessionStore(root).load_bootstrap_state("golden") == BootstrapState()


# -- optimistic concurrency and idempotency ---------------------------------------------


def test_expected_seq_mismatch_raises_with_actual_and_writes_nothing(store: SessionStore) -> None:
    """append(expected_seq=N) when the log is at M != N: ConcurrencyError carrying both,
    nothing written; with the right N it appends."""
    store.initialize_session_if_missing("s", make_manifest("s"), make_features(), make_entry())
    path = log_path(store.root, "s")
    before = path.read_bytes()
    for wrong in (0, 2, 4, 100):
        with pytest.raises(ConcurrencyError) as info:
            store.append("s", [ProgressAppended(entry=make_entry(1))], expected_seq=wrong)
        assert (info.value.expected, info.value.actual) == (wrong, 3)
        assert "3" in str(info.value)
        assert path.read_bytes() == before
    res = store.append("s", [ProgressAppended(entry=make_entry(1))], expected_seq=3)
    assert (res.first_seq, res.last_seq, res.replayed) == (4, 4, False)
    with pytest.raises(InvalidRecordError):
        store.append("s", [ProgressAppended(entry=make_entry(2))], expected_seq=-1)
    # expected_seq=0 means "the session must be empty"
    res = store.append("empty", [ProgressAppended(entry=make_entry())], expected_seq=0)
    assert (res.first_seq, res.last_seq) == (1, 1)


def test_expected_h_refuses_another_log_of_as_many_lines(case: EngineCase, url: str) -> None:
    """append(expected_seq=N, expected_h=H), H the newest event's `h` as read: the log
    replaced by another of N lines (a restore from elsewhere, a delete and as many
    writes) makes it a ConcurrencyError that writes nothing, on every engine; with the
    log as read it appends; expected_h alone, or not a str, is refused."""
    with SessionStore(url) as store:
        for i in range(3):
            store.append_progress_entry("s", make_entry(i))
            store.append_progress_entry("t", make_entry(i + 10))
        h = list(store.read_events("s"))[-1].h
        other: list[bytes] = []
        case.rewrite(store, "t", lambda b: other.append(b) or b)
        case.rewrite(store, "s", lambda b: other[0])
    with SessionStore(url) as store:
        before = [e.h for e in store.read_events("s")]
        with pytest.raises(ConcurrencyError) as info:
            store.append("s", [ProgressAppended(entry=make_entry(9))], expected_seq=3, expected_h=h)
        assert (info.value.expected, info.value.actual) == (3, 3)
        assert "another line" in str(info.value)
        assert [e.h for e in store.read_events("s")] == before
        res = store.append(
            "s", [ProgressAppended(entry=make_entry(9))], expected_seq=3, expected_h=before[-1]
        )
        assert (res.first_seq, res.last_seq) == (4, 4)
        assert (
            store.append(
                "e", [ProgressAppended(entry=make_entry())], expected_seq=0, expected_h=""
            ).last_seq
            == 1
        )
        for bad in ({"expected_h": before[-1]}, {"expected_seq": 4, "expected_h": 5}):
            with pytest.raises(InvalidRecordError):
                store.append("s", [ProgressAppended(entry=make_entry(9))], **bad)  # type: ignore[arg-type]
        assert store.last_seq("s") == 4


def test_idempotency_key_retry_returns_first_result(store: SessionStore) -> None:
    """A retried append with the same key returns the first result and writes nothing,
    also through a new store instance."""
    store.initialize_session_if_missing("s", make_manifest("s"), make_features())
    batch = [ProgressAppended(entry=make_entry(1)), ProgressAppended(entry=make_entry(2))]
    first = store.append("s", batch, idempotency_key="run-7/step-3")
    assert (first.first_seq, first.last_seq, first.replayed) == (3, 4, False)
    path = log_path(store.root, "s")
    before = path.read_bytes()
    again = store.append("s", batch, idempotency_key="run-7/step-3")
    assert (again.first_seq, again.last_seq, again.replayed) == (3, 4, True)
    assert path.read_bytes() == before
    other = SessionStore(store.root)
    third = other.append("s", batch, idempotency_key="run-7/step-3")
    assert (third.first_seq, third.last_seq, third.replayed) == (3, 4, True)
    # the session API's key works the same way
    other.append_progress_entry("s", make_entry(3), idempotency_key="p3")
    store.append_progress_entry("s", make_entry(3), idempotency_key="p3")
    assert path.read_bytes().count(b"\n") == 5
    assert [e.summary for e in store.load_bootstrap_state("s").recent_progress] == [
        "step 1",
        "step 2",
        "step 3",
    ]
    # a different key is a different append
    store.append("s", batch, idempotency_key="run-7/step-4")
    assert store.last_seq("s") == 7


# -- permissions ---------------------------------------------------------------------


def test_files_0600_and_dirs_0700_from_creation(tmp_path: Path) -> None:
    """With a permissive umask, everything the store creates is still private: the mode is
    given at creation, not left to the umask."""
    old = os.umask(0)
    try:
        root = tmp_path / "a" / "root"
        with SessionStore(root) as store:
            for sid in ("plain", "ünï/code", "x" * 300):
                store.initialize_session_if_missing(sid, make_manifest(sid), make_features())
                store.append_transcript_messages(sid, [Message(role=Role.USER, content="hi")])
    finally:
        os.umask(old)
    seen_files = 0
    for dirpath, _dirnames, filenames in os.walk(root):
        assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o700, dirpath
        for name in filenames:
            seen_files += 1
            mode = stat.S_IMODE(os.stat(os.path.join(dirpath, name)).st_mode)
            assert mode == 0o600, (dirpath, name, oct(mode))
    assert seen_files >= 7  # 3 logs, 3 locks, 1 id file


def test_reading_unknown_sessions_creates_nothing(store: SessionStore) -> None:
    """Reads of a session that does not exist give the empty answers and leave no trace."""
    for sid in ("nobody", "no/body", "ñ" * 300):
        assert store.load_bootstrap_state(sid) == BootstrapState()
        assert store.load_transcript_messages(sid) == []
        assert store.is_initialized(sid) is False
        assert store.last_seq(sid) == 0
    assert store.list_sessions() == []
    assert not (store.root / "sessions").exists() or not any((store.root / "sessions").iterdir())


def test_a_root_that_is_not_a_directory_is_a_typed_error(tmp_path: Path) -> None:
    """A store root that is a file, or lies under a file, is refused with an
    EventStoreError, not a raw OSError, and nothing is created."""
    afile = tmp_path / "file"
    afile.write_bytes(b"")
    for root in (afile, afile / "below"):
        with pytest.raises(EventStoreError, match="not a directory"):
            SessionStore(root)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


# -- nesting depth ---------------------------------------------------------------------
# A value nested nearly as deep as Python's recursion limit could once be written from a
# shallow stack and then be unreadable from a deeper one (or not be written at all, with a
# bare RecursionError). A log line nests at most MAX_DEPTH levels: a deeper append is
# refused with a typed error; a deeper line written by someone else is a CorruptLogError.

# the level of a messages_appended line at which a value starts
INPUT_LEVEL = 6  # {"messages":[{"blocks":[{"input":{
METADATA_LEVEL = 4  # {"messages":[{"metadata":{


def _nested(levels: int) -> dict[str, Any]:
    """A dict nesting `levels` levels of dicts (itself included)."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def _message_nesting(where: str, line_depth: int) -> Message:
    """A message whose messages_appended line nests exactly `line_depth` levels."""
    if where == "input":
        block = ToolUseBlock(id="t1", name="tool", input=_nested(line_depth - INPUT_LEVEL + 1))
        return Message(Role.ASSISTANT, "call", blocks=[block])
    return Message(Role.USER, "hi", metadata=_nested(line_depth - METADATA_LEVEL + 1))


def _at_stack_depth(frames: int, fn: Callable[[], Any]) -> Any:
    """`fn()` called `frames` Python frames deeper than here."""
    return fn() if frames <= 0 else _at_stack_depth(frames - 1, fn)


def _in_a_thread(fn: Callable[[], Any]) -> Any:
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(fn()))
    t.start()
    t.join(60)
    assert got, "the read in a thread failed"
    return got[0]


def _every_read(store: SessionStore, sid: str) -> list[object]:
    """What every read path gives for `sid`: loads (whole, a last page), history and its
    export, verify, from here, from hundreds of frames deeper and from another thread."""
    out: list[object] = []
    for call in (lambda f: f(), lambda f: _at_stack_depth(400, f), _in_a_thread):
        out.append(call(lambda: store.load_transcript_messages(sid)))
        out.append(call(lambda: store.load_transcript_messages(sid, last=1)))
        out.append(call(lambda: store.load_bootstrap_state(sid)))
        out.append(call(lambda: [type(e).__name__ for e in store.read_events(sid)]))
        out.append(call(lambda: store.verify(sid).ok))
    return out


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    where=st.sampled_from(["input", "metadata"]),
    past=st.integers(-2, 2) | st.sampled_from([729, 734, 740, 5000]),
)
def test_a_write_nested_past_the_depth_limit_is_refused_and_the_rest_reads_back_everywhere(
    url: str, where: str, past: int
) -> None:
    """A line nesting MAX_DEPTH levels or fewer is acknowledged and reads back equal on
    every read path (fresh stores, fold caches, compaction, deep call stacks, threads);
    one level more is refused with NestingTooDeepError naming the limit, nothing written
    (0.1.0: acknowledged ~985 deep, then a bare RecursionError on every load; ~990 deep,
    a bare RecursionError from the append)."""
    sid = f"{where}{past}-{uuid.uuid4().hex[:6]}"
    message = _message_nesting(where, MAX_DEPTH + past)
    with SessionStore(url) as store:
        store.append_progress_entry(sid, make_entry())
        if past > 0:
            with pytest.raises(NestingTooDeepError, match=f"at most {MAX_DEPTH}"):
                store.append_transcript_messages(sid, [message])
            assert store.last_seq(sid) == 1 and store.load_transcript_messages(sid) == []
            return
        store.append_transcript_messages(sid, [message])
        assert store.load_transcript_messages(sid) == [message]
        warm = _every_read(store, sid)
    assert warm[0] == warm[1] == [message] and warm[4] is True
    with SessionStore(url) as cold:  # fold caches and engine heads as another store reads them
        assert _every_read(cold, sid) == warm
        assert cold.compact(
            sid, force=True
        ).compacted  # a snapshot wraps the message a few levels deeper
        assert _every_read(cold, sid) == warm
    with SessionStore(url) as after:
        assert after.load_transcript_messages(sid) == [message]


def _forge_deep_last_line(case: EngineCase, store: SessionStore, sid: str, levels: int) -> None:
    """Nest the `"X"` of the session's last line `levels` deep (a list in a list ...) and
    make its hash check: a line an older writer, a tool or a hand wrote."""

    def deepen(data: bytes) -> bytes:
        lines = data.split(b"\n")[:-1]
        deep = lines[-1].replace(b'"X"', b"[" * levels + b"]" * levels)
        lines[-1] = rehash(deep, lines[-2][-18:-2].decode())
        return b"\n".join(lines) + b"\n"

    case.rewrite(store, sid, deepen)


@pytest.mark.parametrize("levels", [990, 5000])
def test_a_line_nested_too_deep_to_read_is_a_corrupt_log_error_on_every_read_path(
    case: EngineCase, url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, levels: int
) -> None:
    """A line nested deeper than a reader can decode, written by someone else, is a
    CorruptLogError naming the line (its byte offset and seq) on every read path of the
    API and the CLI; verify reports it, repair keeps what is before it (0.1.0: a bare
    RecursionError, a traceback on the CLI, and repair said the log was intact)."""
    sid = "deep"
    with SessionStore(url) as store:
        store.append_progress_entry(sid, make_entry())
        store.append_transcript_messages(sid, [Message(Role.USER, "hi", metadata={"deep": "X"})])
        _forge_deep_last_line(case, store, sid, levels)
    with SessionStore(url) as store:
        reads: list[Callable[[], object]] = [
            lambda: store.load_transcript_messages(sid),
            lambda: store.load_transcript_messages(sid, last=1),
            lambda: store.load_bootstrap_state(sid),
            lambda: list(store.read_events(sid)),
            lambda: store.transcript_at(sid, seq=2),
            lambda: store.compact(sid, force=True),
        ]
        for read in reads:
            with pytest.raises(CorruptLogError, match=f"nests {levels + 4} levels") as info:
                read()
            assert info.value.offset > 0
        [problem] = store.verify(sid).problems
        assert (problem.seq, problem.kind) == (2, "undecodable")
    for command in ("log", "state", "transcript", "export", "stats"):
        rc, out, err = cli_in_process(capsys, command, url, sid)
        assert rc == 2 and f"nests {levels + 4} levels" in err and "(seq 2)" in err, (command, err)
        one_line_error(err)
    page = tmp_path / "r.html"
    rc, out, err = cli_in_process(capsys, "report", url, sid, "-o", str(page))
    assert rc == 0 and f"nests {levels + 4} levels" in page.read_text()  # the page says so
    assert cli_in_process(capsys, "verify", url, sid)[0] == 1
    rc, out, err = cli_in_process(capsys, "repair", url, sid)
    assert rc == 0 and "intact" not in out
    with SessionStore(url) as store:
        # the line set aside keeps its number: a quarantined record holds seq 2
        assert store.verify(sid).ok and store.last_seq(sid) == 2
        assert isinstance(list(store.read_events(sid))[-1], Quarantined)


def test_a_line_at_the_depth_limit_reads_on_every_cli_command(
    url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """What is acknowledged at the limit reads on the CLI too, tables and JSON (0.1.0:
    `log`, `state`, `transcript`, `export`, `stats` and `report` printed a traceback)."""
    sid = "deep"
    with SessionStore(url) as store:
        store.append_transcript_messages(sid, [_message_nesting("input", MAX_DEPTH)])
        store.append_transcript_messages(sid, [_message_nesting("metadata", MAX_DEPTH)])
    for command in ("log", "state", "transcript", "export", "stats", "verify"):
        for json in ([], ["--json"]) if command != "export" else ([],):
            rc, out, err = cli_in_process(capsys, command, url, sid, *json)
            assert rc == 0 and out and not err, (command, json, err)
    rc, out, err = cli_in_process(capsys, "export", url, sid, "--format", "jsonl")
    assert rc == 0 and out.count("\n") == 2
    page = tmp_path / "r.html"
    assert cli_in_process(capsys, "report", url, sid, "-o", str(page))[0] == 0
    assert page.stat().st_size > 0


class Pushed(Event, tag="pushed", kw_only=True):
    n: int = 0


class Wrapping(StructProjection[Any]):
    """A custom projection whose state nests one level deeper with every event."""

    name = "wrapping"
    event_types = frozenset({"pushed"})
    state_type = Any

    def initial(self) -> Any:
        return []

    def apply(self, state: Any, event: Event) -> Any:
        return [state] if type(event) is Pushed else state


@pytest.mark.parametrize("events", [MAX_DEPTH + 20, 992, 1100])
def test_a_snapshot_of_a_projection_state_nested_too_deep_is_refused_and_nothing_written(
    url: str, events: int
) -> None:
    """Compaction refuses (NestingTooDeepError naming the projection, nothing written) a
    snapshot whose custom state nests past the limit, and so is a load of a state too deep
    to copy; the log reads back as before, from a deeper stack too (0.1.0: a state
    ~992 deep was compacted, history and all, into a snapshot no store could load; ~975
    deep, one a load 300 frames deeper could not; ~1100, a bare RecursionError)."""
    with SessionStore(url, event_types=[Pushed], projections=[Wrapping()]) as store:
        for start in range(0, events, 200):
            store.append("s", [Pushed(n=n) for n in range(start, min(events, start + 200))])
        before = [e.seq for e in store.read_events("s")]
        with pytest.raises(NestingTooDeepError, match="'wrapping'"):
            store.compact("s", force=True)
        if events > 1000:  # deeper than a copy of the state can recurse
            with pytest.raises(NestingTooDeepError, match="'wrapping'"):
                store.load("s", "wrapping")
        elif events < 900:  # (between, it depends on the caller's stack)
            assert store.load("s", "wrapping") is not None
    with SessionStore(url, event_types=[Pushed], projections=[Wrapping()]) as store:
        assert [e.seq for e in store.read_events("s")] == before
        assert _at_stack_depth(400, lambda: [e.seq for e in store.read_events("s")]) == before
        assert store.verify("s").ok
