"""The session API as a new user meets it (issue 13): honest results and clear, typed
refusals that change nothing. Idempotency keys carry a fingerprint of the request: the
same request replays, a different one is refused; the writers return what they wrote."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import make_checkpoint, make_entry, make_features, make_manifest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore import (
    AppendResult,
    EventStoreError,
    FeatureRecord,
    IdempotencyConflictError,
    InvalidArgumentError,
    InvalidRecordError,
    Message,
    ProgressAppended,
    ProgressEntry,
    Role,
    RunCheckpoint,
    SessionStore,
    UnknownProjectionError,
    UnsafePathError,
)


@pytest.fixture
def store(store: SessionStore) -> SessionStore:
    """conftest's store, with session "s" initialized (three features)."""
    store.initialize_session_if_missing("s", make_manifest("s"), make_features(3))
    return store


def _log(store: SessionStore) -> bytes:
    assert store.root is not None
    return (store.root / "sessions" / "s" / "log.jsonl").read_bytes()


# -- idempotency keys carry the request's fingerprint --------------------------------


def test_a_key_reused_for_a_different_request_is_refused(store: SessionStore) -> None:
    first = store.append_progress_entry("s", make_entry(1), idempotency_key="k1")
    before = _log(store)
    with pytest.raises(IdempotencyConflictError) as info:
        store.update_feature_pass("s", "f1", True, idempotency_key="k1")
    err = info.value
    assert isinstance(err, EventStoreError)
    assert err.key == "k1" and err.session_id == "s"
    assert (err.first_seq, err.last_seq) == (first.first_seq, first.last_seq)
    assert "k1" in str(err) and f"seq {first.first_seq}" in str(err)
    assert _log(store) == before  # nothing written
    assert not store.load_bootstrap_state("s").feature_list[0].passes


def test_the_same_request_replays(store: SessionStore) -> None:
    first = store.update_feature_pass("s", "f2", True, idempotency_key="k2")
    before = _log(store)
    again = store.update_feature_pass("s", "f2", True, idempotency_key="k2")
    assert again == AppendResult(first.first_seq, first.last_seq, replayed=True)
    assert _log(store) == before
    with pytest.raises(IdempotencyConflictError):
        store.update_feature_pass("s", "f2", False, idempotency_key="k2")


def test_a_retry_that_rebuilt_its_records_is_the_same_request(store: SessionStore) -> None:
    """A retry loop builds its records again, with fresh default times: still a replay.
    A time that is set where the first request had none is a different request."""
    store.append_progress_entry("s", ProgressEntry(run_id="r", summary="x"), idempotency_key="p")
    later = ProgressEntry(run_id="r", summary="x", created_at=datetime.now(UTC) + timedelta(1))
    assert store.append_progress_entry("s", later, idempotency_key="p").replayed
    store.record_run_checkpoint("s", RunCheckpoint(run_id="r"), idempotency_key="c")
    done = RunCheckpoint(run_id="r", completed_at=datetime.now(UTC))
    with pytest.raises(IdempotencyConflictError):
        store.record_run_checkpoint("s", done, idempotency_key="c")


def test_the_fingerprint_holds_after_reopening_and_compaction(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as a:
        a.initialize_session_if_missing("s", make_manifest("s"), make_features(2))
        r = a.append_transcript_messages(
            "s", [Message(role=Role.USER, content="hi")], idempotency_key="m"
        )
        a.compact("s", force=True)
    with SessionStore(root) as b:  # another process, after compaction
        again = b.append_transcript_messages(
            "s", [Message(role=Role.USER, content="hi")], idempotency_key="m"
        )
        assert again.replayed and again.first_seq == r.first_seq
        with pytest.raises(IdempotencyConflictError):
            b.append_transcript_messages(
                "s", [Message(role=Role.USER, content="bye")], idempotency_key="m"
            )
        assert len(b.load_transcript_messages("s")) == 1


def test_append_checks_the_fingerprint_too(store: SessionStore) -> None:
    ev = [ProgressAppended(entry=make_entry(5))]
    r = store.append("s", ev, idempotency_key="a")
    assert store.append("s", ev, idempotency_key="a").replayed
    with pytest.raises(IdempotencyConflictError):
        store.append("s", [ProgressAppended(entry=make_entry(6))], idempotency_key="a")
    assert store.last_seq("s") == r.last_seq


REQUESTS = st.sampled_from(
    [
        ("progress", "a"), ("progress", "b"), ("pass", ("f1", True)), ("pass", ("f1", False)),
        ("pass", ("f2", True)), ("message", "hi"), ("message", "bye"),
        ("checkpoint", "r1"), ("checkpoint", "r2"),
    ]
)  # fmt: skip


def _send(store: SessionStore, req: tuple[str, object], key: str) -> AppendResult:
    kind, arg = req
    if kind == "progress":
        return store.append_progress_entry(
            "s", ProgressEntry(run_id="r", summary=str(arg)), idempotency_key=key
        )
    if kind == "pass":
        fid, passes = arg  # type: ignore[misc]
        return store.update_feature_pass("s", fid, passes, idempotency_key=key)
    if kind == "message":
        return store.append_transcript_messages(
            "s", [Message(role=Role.USER, content=str(arg))], idempotency_key=key
        )
    return store.record_run_checkpoint("s", RunCheckpoint(run_id=str(arg)), idempotency_key=key)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=REQUESTS, second=REQUESTS)
def test_a_second_request_with_a_key_replays_iff_it_is_the_same(
    tmp_path_factory: pytest.TempPathFactory,
    first: tuple[str, object],
    second: tuple[str, object],
) -> None:
    with SessionStore(tmp_path_factory.mktemp("fp")) as store:
        store.initialize_session_if_missing("s", make_manifest("s"), make_features(2))
        r1 = _send(store, first, "key")
        seq = store.last_seq("s")
        if first == second:
            r2 = _send(store, second, "key")
            assert r2.replayed and (r2.first_seq, r2.last_seq) == (r1.first_seq, r1.last_seq)
        else:
            with pytest.raises(IdempotencyConflictError):
                _send(store, second, "key")
        assert store.last_seq("s") == seq


# -- the writers return what they wrote ----------------------------------------------


def test_every_session_writer_returns_its_append_result(store: SessionStore) -> None:
    seq = store.last_seq("s")
    results = [
        store.save_manifest("s", make_manifest("s", active_branch="dev")),
        store.append_progress_entry("s", make_entry(1)),
        store.replace_feature_list("s", make_features(2)),
        store.update_feature_pass("s", "f1", True),
        store.record_run_checkpoint("s", make_checkpoint()),
        store.append_transcript_messages("s", [Message(role=Role.USER, content="a")]),
    ]
    assert all(isinstance(r, AppendResult) and not r.replayed for r in results)
    assert [(r.first_seq, r.last_seq) for r in results] == [(seq + i, seq + i) for i in range(1, 7)]
    assert store.last_seq("s") == seq + 6


# -- typed refusals ------------------------------------------------------------------


def test_a_bad_durability_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="durability") as info:
        SessionStore(tmp_path / "x", durability="sometimes")  # type: ignore[arg-type]
    assert isinstance(info.value, EventStoreError) and isinstance(info.value, ValueError)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "options",
    [
        {"cached_sessions": 0},
        {"cached_sessions": "many"},
        {"caches": "yes"},
        {"tuning": {"read_piece": 4096}},
        {"auto_compact": 1 << 20},
    ],
    ids=lambda o: next(iter(o)),
)
def test_a_refused_option_is_a_typed_error_and_creates_nothing(
    tmp_path: Path, options: dict[str, object]
) -> None:
    with pytest.raises(InvalidArgumentError, match=next(iter(options))):
        SessionStore(tmp_path / "x", **options)  # type: ignore[arg-type]
    assert not (tmp_path / "x").exists()


def test_an_unknown_projection_is_a_typed_error(store: SessionStore) -> None:
    with pytest.raises(UnknownProjectionError, match="'nope'") as info:
        store.load("s", "nope")
    assert isinstance(info.value, EventStoreError) and isinstance(info.value, KeyError)
    assert "bootstrap" in str(info.value)  # the known names are listed


@pytest.mark.parametrize("projection", [["x"], None, 3, b"bootstrap"])
def test_a_projection_that_is_no_name_nor_projection_is_a_typed_error(
    store: SessionStore, projection: object
) -> None:
    """0.1.0 raised a bare AttributeError (issue 29, item 7)."""
    with pytest.raises(UnknownProjectionError, match="no name"):
        store.load("s", projection)  # type: ignore[arg-type]


def test_state_at_accepts_an_iso_string(store: SessionStore) -> None:
    store.append_progress_entry("s", make_entry(1))
    now = datetime.now(UTC) + timedelta(seconds=1)
    want = store.state_at("s", at=now)
    assert store.state_at("s", at=now.isoformat()) == want
    naive = now.replace(tzinfo=None).isoformat()  # no offset: UTC, as on the command line
    assert store.state_at("s", at=naive) == want
    assert store.transcript_at("s", at=now.isoformat()) == store.transcript_at("s", at=now)
    assert store.state_at("s", at="2000-01-01").manifest is None
    with pytest.raises(InvalidArgumentError, match="ISO 8601"):
        store.state_at("s", at="yesterday")
    with pytest.raises(InvalidArgumentError):
        store.state_at("s", at=12)  # type: ignore[arg-type]


def test_a_manifest_of_another_session_is_refused(store: SessionStore) -> None:
    before = _log(store)
    with pytest.raises(InvalidRecordError, match="OTHER"):
        store.save_manifest("s", make_manifest("OTHER"))
    with pytest.raises(InvalidRecordError, match="OTHER"):
        store.initialize_session_if_missing("t", make_manifest("OTHER"), make_features(1))
    assert _log(store) == before and not store.is_initialized("t")


def test_duplicate_feature_ids_are_refused(store: SessionStore) -> None:
    twice = [
        *make_features(2),
        FeatureRecord(id="f1", category="c", description="d", steps=[], passes=False),
    ]
    before = _log(store)
    with pytest.raises(InvalidRecordError, match="'f1'"):
        store.replace_feature_list("s", twice)
    with pytest.raises(InvalidRecordError, match="'f1'"):
        store.initialize_session_if_missing("t", make_manifest("t"), twice)
    assert _log(store) == before and not store.is_initialized("t")


def test_an_empty_root_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsafePathError, match="empty") as info:
        SessionStore("")
    assert isinstance(info.value, EventStoreError)
    assert list(tmp_path.iterdir()) == []  # the current directory was not used
