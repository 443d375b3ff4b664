"""The session API as a new user meets it (issue 13): honest results and clear, typed
refusals that change nothing. Idempotency keys carry a fingerprint of the request: the
same request replays, a different one is refused; the writers return what they wrote."""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import make_checkpoint, make_entry, make_features, make_manifest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore import (
    AppendResult,
    Event,
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
    SessionManifest,
    SessionStore,
    StorageError,
    UnknownProjectionError,
    UnsafePathError,
)
from eventstore.aio import AsyncSessionStore
from eventstore.engines.base import open_engine
from eventstore.errors import UnsupportedError
from eventstore.ops.lifecycle import parse_age
from projections import Retention


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


@pytest.mark.parametrize(
    ("root", "options"),
    [
        ("store\0x", {}),
        (5, {}),
        (b"store", {}),
        ("DIR", {"durability": 5}),
        ("DIR", {"bogus": 1}),
    ],
    ids=repr,
)
def test_a_store_url_or_engine_option_that_is_none_is_a_typed_error(
    tmp_path: Path, root: object, options: dict[str, object]
) -> None:
    """`SessionStore("store\\0x")` and `open_engine` of it raised Python's own
    `ValueError` (embedded null byte); `open_engine(5)` or bytes a `TypeError`, the file
    engine's bad durability a plain `ValueError` and an unknown option a `TypeError`.
    Each is an `InvalidArgumentError`, and nothing is made."""
    if root == "DIR":
        root = str(tmp_path / "x")
    with pytest.raises(InvalidArgumentError):
        open_engine(root, **options)  # type: ignore[arg-type]
    if not options:
        with pytest.raises(InvalidArgumentError):
            SessionStore(root)  # type: ignore[arg-type]
    assert not (tmp_path / "x").exists()


class _Named:
    """Has a projection's name and nothing else of one."""

    name = "named"


@pytest.mark.parametrize(
    "options",
    [
        {"projections": [1]},
        {"projections": ["bootstrap"]},
        {"projections": [_Named()]},
        {"projections": 5},
        {"projections": "bootstrap"},
        {"event_types": 5},
        {"event_types": None},
        {"upcasters": [(1, 2, 3)]},
        {"upcasters": [None]},
        {"upcasters": "abc"},
        {"upcasters": [(ProgressAppended, 0, None)]},
        {"upcasters": [(ProgressAppended, "0", lambda d: d)]},
    ],
    ids=repr,
)
def test_a_projection_event_type_or_upcaster_that_is_none_is_a_typed_error_and_creates_nothing(
    tmp_path: Path, options: dict[str, object]
) -> None:
    """`SessionStore(root, projections=[1])` (or a projection lacking a method) raised
    Python's own AttributeError, after it had made the store's directory; event types
    or upcasters that are no list raised TypeError or ValueError, and an upcaster that
    is no function was taken, to fail at the first line it was to upcast. Each is an
    `InvalidArgumentError` or `InvalidRecordError`, before anything is made."""
    with pytest.raises((InvalidArgumentError, InvalidRecordError)):
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


# -- wrong-typed arguments: every public method (issue 29, item 7) --------------------

GOOD_TIME = datetime(2020, 1, 1, tzinfo=UTC)
STOPPED = threading.Event()  # a follow given it ends at once (none waits for appends)
STOPPED.set()


def _ints(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _opt(ok: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: v is None or ok(v)


def _seq_of(cls: type) -> Callable[[object], bool]:
    return lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, cls) for x in v)


def _is(*classes: type) -> Callable[[object], bool]:
    return lambda v: isinstance(v, classes)


def _event_types(v: object) -> bool:
    if v is None:
        return True
    if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple, set, frozenset)):
        return False
    return all(isinstance(x, str) or (isinstance(x, type) and issubclass(x, Event)) for x in v)


_STR = _is(str)
_KEY = _opt(_STR)

# method: (good arguments, {parameter: what it accepts}); a value it does not accept is
# drawn for one parameter at a time
API: dict[str, tuple[dict[str, Any], dict[str, Callable[[object], bool]]]] = {
    "is_initialized": ({"session_id": "s"}, {"session_id": _STR, "idempotency_key": _KEY}),
    "initialize_session_if_missing": (
        {"session_id": "t", "manifest": make_manifest("t"), "feature_list": make_features(1)},
        {
            "session_id": _STR,
            "manifest": _is(SessionManifest),
            "feature_list": _seq_of(FeatureRecord),
            "initial_progress_entry": _opt(_is(ProgressEntry)),
            "initial_checkpoint": _opt(_is(RunCheckpoint)),
            "idempotency_key": _KEY,
        },
    ),
    "load_bootstrap_state": ({"session_id": "s"}, {"session_id": _STR, "idempotency_key": _KEY}),
    "save_manifest": (
        {"session_id": "s", "manifest": make_manifest("s")},
        {"session_id": _STR, "manifest": _is(SessionManifest), "idempotency_key": _KEY},
    ),
    "append_progress_entry": (
        {"session_id": "s", "entry": make_entry(1)},
        {"session_id": _STR, "entry": _is(ProgressEntry), "idempotency_key": _KEY},
    ),
    "replace_feature_list": (
        {"session_id": "s", "features": make_features(2)},
        {"session_id": _STR, "features": _seq_of(FeatureRecord), "idempotency_key": _KEY},
    ),
    "update_feature_pass": (
        {"session_id": "s", "feature_id": "f1", "passes": True},
        {"session_id": _STR, "feature_id": _STR, "passes": _is(bool), "idempotency_key": _KEY},
    ),
    "record_run_checkpoint": (
        {"session_id": "s", "checkpoint": make_checkpoint()},
        {"session_id": _STR, "checkpoint": _is(RunCheckpoint), "idempotency_key": _KEY},
    ),
    "load_transcript_messages": (
        {"session_id": "s"},
        {
            "session_id": _STR,
            "start": _opt(_ints),
            "limit": _opt(_ints),
            "last": _opt(_ints),
            "idempotency_key": _KEY,
        },
    ),
    "append_transcript_messages": (
        {"session_id": "s", "messages": [Message(role=Role.USER, content="hi")]},
        {"session_id": _STR, "messages": _seq_of(Message), "idempotency_key": _KEY},
    ),
    "append": (
        {"session_id": "s", "events": [ProgressAppended(entry=make_entry(5))]},
        {
            "session_id": _STR,
            "events": _seq_of(ProgressAppended),
            "expected_seq": _opt(_ints),
            "idempotency_key": _KEY,
        },
    ),
    "append_decided": (
        {
            "session_id": "s",
            "projection": "bootstrap",
            "decide": lambda state: [ProgressAppended(entry=make_entry(5))],
        },
        {"session_id": _STR, "projection": _STR, "decide": callable},
    ),
    "last_seq": ({"session_id": "s"}, {"session_id": _STR}),
    "load": (
        {"session_id": "s", "projection": "bootstrap"},
        {"session_id": _STR, "projection": _STR},
    ),
    "delete_session": ({"session_id": "nope"}, {"session_id": _STR}),
    "read_events": (
        {"session_id": "s"},
        {"session_id": _STR, "from_seq": _ints, "to_seq": _opt(_ints), "types": _event_types},
    ),
    "state_at": (
        {"session_id": "s", "seq": 1},
        {"session_id": _STR, "seq": _ints},
    ),
    "transcript_at": (
        {"session_id": "s", "at": GOOD_TIME},
        {"session_id": _STR, "at": _is(datetime, str)},
    ),
    "verify": ({"session_id": "s"}, {"session_id": _STR}),
    "follow": (
        {"session_id": "s", "stop": STOPPED},
        {
            "session_id": _STR,
            "from_seq": _ints,
            "poll_interval": _is(int, float),
            "stop": _opt(_is(threading.Event)),
        },
    ),
    "compact": (
        {"session_id": "s", "force": True},
        {
            "session_id": _STR,
            "archive": _is(bool),
            "retention": _opt(_is(Retention)),
            "force": _is(bool),
            "dry_run": _is(bool),
        },
    ),
    "first_kept_seq": ({"session_id": "s"}, {"session_id": _STR}),
    "prune_archive": (
        {"session_id": "s", "before": 1},
        {"session_id": _STR, "before": _is(int, datetime)},
    ),
    "delete_older_than": (
        {"age": timedelta(days=9999), "dry_run": True},
        {"age": _is(timedelta), "now": _opt(_is(datetime)), "dry_run": _is(bool)},
    ),
    "cache_info": ({"session_id": "s"}, {"session_id": _STR}),
    "forget_cached_state": ({"session_id": "s"}, {"session_id": _opt(_STR)}),
    "feed": ({}, {"limit": _ints}),  # (`after` is any position an engine gave)
}

CASES = [(m, p) for m, (_, params) in API.items() for p in params]

WRONG = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.lists(st.integers(), max_size=2),
    st.lists(st.text(max_size=2), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.tuples(st.none()),
    st.sets(st.integers(), max_size=2),
    st.builds(object),
    st.just(make_entry(1)),
    st.just(make_features(1)),
    st.just(["x"]),
    st.just([{}]),
    st.just(GOOD_TIME),
    st.just(timedelta(seconds=1)),
)


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(root.rglob("*"))
    }


def _call(target: Any, method: str, kwargs: dict[str, Any]) -> None:
    result = getattr(target, method)(**kwargs)
    if method in ("read_events", "follow"):
        it = iter(result)
        try:
            next(it)
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()


@pytest.mark.parametrize(("method", "param"), CASES, ids=[f"{m}-{p}" for m, p in CASES])
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_every_method_refuses_a_wrong_typed_argument_and_writes_nothing(
    store: SessionStore, method: str, param: str, data: st.DataObject
) -> None:
    """Promise (CONTRIBUTING, standards): bad input gets a typed error and changes
    nothing. Broken (issue 29, item 7): read_events(from_seq=[1]) and types=[{}] raised
    TypeError, compact(retention=[1]) AttributeError, and more. Each parameter of each
    method gets a value of a type it does not take: an EventStoreError, and the store's
    files are as they were."""
    good, params = API[method]
    ok = params[param]
    value = data.draw(WRONG.filter(lambda v: not ok(v)), label=param)
    assert store.root is not None
    before = _tree(store.root)
    with pytest.raises(EventStoreError):
        _call(store, method, {**good, param: value})
    assert _tree(store.root) == before


@pytest.mark.parametrize(("method", "param"), CASES[::3], ids=[f"{m}-{p}" for m, p in CASES[::3]])
@settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_the_async_store_refuses_a_wrong_typed_argument_too(
    store: SessionStore, method: str, param: str, data: st.DataObject
) -> None:
    """The same sweep through `AsyncSessionStore` over the same store (a third of the
    parameters: it delegates each call to the same checks)."""
    good, params = API[method]
    ok = params[param]
    value = data.draw(WRONG.filter(lambda v: not ok(v)), label=param)
    assert store.root is not None
    before = _tree(store.root)

    kwargs = {**good, param: value}
    if method == "follow":
        if param == "stop":
            return  # the async follow stops when closed: it takes no `stop`
        del kwargs["stop"]

    async def run() -> None:
        astore = AsyncSessionStore(store)
        try:
            result = getattr(astore, method)(**kwargs)
            if method == "follow":
                it = result.__aiter__()
                try:
                    await it.__anext__()
                finally:
                    await it.aclose()
            else:
                await result
        finally:
            await astore.close()

    with pytest.raises(EventStoreError):
        asyncio.run(run())
    assert _tree(store.root) == before


@pytest.mark.parametrize(
    "root",
    [None, 3, ["x"], b"", "file://relative/dir", "postgresql://u@localhost/db?schema=Bad-Schema"],
)
def test_a_root_that_names_no_store_is_a_typed_error(tmp_path: Path, root: object) -> None:
    """Broken (issue 29, item 7): SessionStore(None) raised a bare TypeError,
    "file://relative/dir" and a PostgreSQL URL with ?schema=Bad-Schema a plain
    ValueError. (A wrong-typed root stays a TypeError, a bad URL a ValueError.)"""
    with pytest.raises(EventStoreError) as info:
        SessionStore(root)  # type: ignore[arg-type]
    assert isinstance(info.value, (TypeError, ValueError))
    assert not Path("relative").exists()


def test_parse_age_of_no_str_is_a_typed_error() -> None:
    """Broken (issue 29, item 7): parse_age({}) raised a bare TypeError."""
    for value in ({}, None, 30, b"30d"):
        with pytest.raises(InvalidArgumentError, match="age"):
            parse_age(value)  # type: ignore[arg-type]


def test_the_feed_of_an_engine_without_one_is_a_typed_error(store: SessionStore) -> None:
    """0.1.0 raised a bare NotImplementedError (still one: UnsupportedError is both)."""
    with pytest.raises(UnsupportedError, match="no global feed") as info:
        store.feed()
    assert isinstance(info.value, NotImplementedError)


def test_a_root_this_user_cannot_reach_is_a_storage_error() -> None:
    """Broken (issue 29, item 7): SessionStore(root) under a directory the user cannot
    read raised a bare PermissionError. Run as a user who cannot (as root: in a forked
    child that drops to `nobody`)."""
    with tempfile.TemporaryDirectory() as tmp:  # (pytest's tmp_path is closed to others)
        _check_unreachable_root(Path(tmp))


def _check_unreachable_root(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    (locked / "inner").mkdir(parents=True)
    locked.chmod(0o700)
    if os.geteuid() != 0:
        locked.chmod(0o000)
        try:
            with pytest.raises(StorageError, match="Permission denied"):
                SessionStore(locked / "inner")
        finally:
            locked.chmod(0o700)
        return
    tmp_path.chmod(0o755)  # `nobody` may reach tmp_path, not what is inside `locked`
    for parent in tmp_path.parents:
        if not os.stat(parent).st_mode & 0o001:
            pytest.skip(f"{parent} is closed to other users: cannot run the check as nobody")
    SessionStore(tmp_path / "warm").close()  # the engine's modules imported before the drop
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, report what SessionStore raised
        os.close(r)
        try:
            os.setgid(65534)
            os.setuid(65534)
            try:
                SessionStore(locked / "inner")
                out = "opened"
            except BaseException as exc:
                out = f"{type(exc).__name__}|{isinstance(exc, StorageError)}|{exc}"
            os.write(w, out.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    name, typed, message = out.split("|", 2)
    assert typed == "True", out
    assert "Permission denied" in message and str(locked / "inner") in message
