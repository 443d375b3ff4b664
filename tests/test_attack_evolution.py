"""An outside attack on schema evolution, custom events and projections, and the async
API (README "Schema evolution", "Custom events and projections", "Async API").

What it attacks: upcasters that build a new dict, forge the envelope, raise or return
garbage; fold caches and snapshots shared by stores opened with other upcasters; a user
projection whose `apply` changes the events it is given (what the built-in projections
and later loads then return); projection names, versions and states msgspec cannot
encode; async calls cancelled mid-append, raising StopIteration, and a store closed from
one event loop while another loop's calls run. Each finding test fails on the code
before its fix; the coverage tests say what held.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tuning import tune

from eventstore import (
    CorruptLogError,
    Event,
    FeatureRecord,
    IdempotencyConflictError,
    InvalidArgumentError,
    InvalidRecordError,
    Message,
    ProgressEntry,
    Role,
    SessionManifest,
    SessionStore,
    SnapshotVersionError,
)
from eventstore.aio import AsyncSessionStore
from eventstore.core import fold_cache
from eventstore.format.codec import EventCodec
from projections import StructProjection

SID = "s"


# -- schema evolution --------------------------------------------------------------------


class TaskV1(Event, tag="task", kw_only=True):
    """The old shape: a title."""

    title: str


class TaskV2(Event, tag="task", kw_only=True):
    """The new shape: `title` renamed to `name`, and a priority added."""

    VERSION = 2
    name: str
    prio: int = 0


def _old_log(root: Path) -> None:
    """Two v1 lines, the second under an idempotency key."""
    with SessionStore(root, event_types=[TaskV1]) as s:
        s.append(SID, [TaskV1(title="a")])
        s.append(SID, [TaskV1(title="b")], idempotency_key="k")


def test_an_upcaster_that_builds_a_new_payload_dict_keeps_the_lines_envelope(
    tmp_path: Path,
) -> None:
    """Promise: an upcaster "turns the old payload (a dict) into the next version".
    Broken: one that returned a new dict of payload fields (the natural way to write
    one) dropped the line's seq, key and hash with it, so every old line read as
    seq 0 and the load raised CorruptLogError ("the log starts at sequence 0"); one
    that set `key` changed which batch an idempotency key names. The envelope is the
    line's (checked by the hash chain) and is put back after upcasting."""
    _old_log(tmp_path)

    def new_dict(d: dict[str, Any]) -> dict[str, Any]:
        return {"name": d["title"], "prio": 1}

    def forge(d: dict[str, Any]) -> dict[str, Any]:
        d["name"] = d.pop("title")
        d["key"], d["seq"] = None, 7
        return d

    for fn in (new_dict, forge):
        with SessionStore(tmp_path, event_types=[TaskV2], upcasters=[(TaskV2, 1, fn)]) as s:
            events = list(s.read_events(SID))
            assert [(e.seq, e.key, e.name) for e in events] == [(1, None, "a"), (2, "k", "b")]  # type: ignore[attr-defined]
            assert s.verify(SID).ok


@pytest.mark.parametrize(
    "fn, why",
    [
        (lambda d: d["missing"], "KeyError"),
        (lambda d: None, "returned a NoneType"),
        (lambda d: [d], "returned a list"),
    ],
)
def test_an_upcaster_that_fails_is_a_corrupt_log_error_naming_the_line(
    tmp_path: Path, fn: Any, why: str
) -> None:
    """Promise: every error is an EventStoreError; a line that cannot be read raises
    CorruptLogError naming file, offset and seq; verify never raises on what it reads.
    Broken: an upcaster raising (KeyError) or returning something other than a dict
    escaped from loads, read_events and verify as a bare KeyError/TypeError/
    AttributeError naming no line."""
    _old_log(tmp_path)
    with SessionStore(tmp_path, event_types=[TaskV2], upcasters=[(TaskV2, 1, fn)]) as s:
        with pytest.raises(CorruptLogError) as info:
            list(s.read_events(SID))
        assert info.value.seq == 1 and info.value.offset == 0 and why in str(info.value)
        assert isinstance(info.value.path, (str, Path)) and "log.jsonl" in str(info.value.path)
        report = s.verify(SID)
        assert not report.ok
        assert {p.kind for p in report.problems if p.severity == "error"} == {"undecodable"}


class Prios(StructProjection[list[int]]):
    """The priority of every task, in order; kept in the fold cache."""

    name = "prios"
    version = 1
    event_types = frozenset({"task"})
    state_type = list[int]
    cache_folds = True

    def initial(self) -> list[int]:
        return []

    def apply(self, state: list[int], event: Event) -> list[int]:
        if type(event) is TaskV2:
            state.append(event.prio)
        return state


def upcaster_giving(prio: int) -> Any:
    """An upcaster v1 -> v2 giving old tasks priority `prio`."""

    def up(d: dict[str, Any]) -> dict[str, Any]:
        d["name"] = d.pop("title")
        d["prio"] = prio if d["name"] in {"a", "b"} else -1
        return d

    return up


def test_a_fold_cache_folded_with_other_upcasters_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Promise: a fold cache "only saves time" and is "used only when it checks against
    the log": a load returns what folding the log returns. Broken: the cache's `known`
    digest named the event types, not how old lines were upcast, so a store opened with
    a corrected upcaster (priority 2 where a buggy one gave 1) got the old upcaster's
    state back from the cache, and one opened without the upcaster (which cannot read
    the v1 lines: CorruptLogError) got a state instead. The digest now holds each read
    type's version and a fingerprint of its upcasters; the same upcaster still reuses
    the cache (also in another process, whatever its hash seed)."""
    tune(monkeypatch, cache_on_close=0)  # every close saves
    _old_log(tmp_path)

    def opened(*upcasters: Any) -> SessionStore:
        ups = [(TaskV2, 1, fn) for fn in upcasters]
        return SessionStore(tmp_path, event_types=[TaskV2], projections=[Prios()], upcasters=ups)

    buggy = upcaster_giving(1)
    with opened(buggy) as s:
        assert s.load(SID, "prios") == [1, 1]
    with opened(buggy) as s:  # the same upcaster: the cache is used
        assert fold_cache.load(s.engine, SID, Prios(), s.core.caches.cached["prios"]) is not None
    with opened(upcaster_giving(2)) as s:
        assert s.load(SID, "prios") == [2, 2]
    with opened() as s, pytest.raises(CorruptLogError, match="needs an upcaster"):
        s.load(SID, "prios")
    # a fingerprint is the same in another process (another hash seed: the set above)
    code = (
        "import sys; sys.path.insert(0, 'tests'); from test_attack_evolution import *;"
        " from eventstore.format.codec import EventCodec; c = EventCodec([TaskV2]);"
        " c.register_upcaster(TaskV2, 1, upcaster_giving(1)); print(c.reading('task'))"
    )
    here = EventCodec([TaskV2])
    here.register_upcaster(TaskV2, 1, upcaster_giving(1))
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent.parent,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert out.stdout.strip() == here.reading("task")


# -- custom projections ------------------------------------------------------------------


class Meddler(StructProjection[int]):
    """A user projection whose apply changes the events it is given: it empties each
    `messages` list, tags each message's metadata and adds a step to each feature."""

    name = "meddler"
    version = 1
    event_types: frozenset[str] | None = None
    state_type = int

    def initial(self) -> int:
        return 0

    def apply(self, state: int, event: Event) -> int:
        for f in getattr(event, "features", ()):
            f.steps.append("meddled")
        messages = getattr(event, "messages", None)
        if messages is not None:
            for m in messages:
                m.metadata["meddled"] = "yes"
            messages.clear()
        return state + 1


def _manifest() -> SessionManifest:
    return SessionManifest(session_id=SID, active_branch="main", current_objective="o")


def _feature() -> FeatureRecord:
    return FeatureRecord(id="f1", category="c", description="d", steps=["a"], passes=False)


def test_a_projection_that_changes_its_events_does_not_change_the_built_in_states(
    tmp_path: Path,
) -> None:
    """Promise: a load returns the state folded from the log: the same in this store
    and in a fresh one. Broken: an append folded its events into every cached state,
    sharing the event objects, so a user projection loaded first that emptied
    `event.messages` left the transcript without the appended messages, and one that
    changed a record's list (a feature's steps, a message's metadata) changed the
    bootstrap and transcript states this store returned. A user projection now folds
    the batch decoded from the bytes written (as a cold load would give it)."""
    with SessionStore(tmp_path, projections=[Meddler()]) as s:
        assert s.load(SID, "meddler") == 0  # folded first: applied first on append
        s.load_transcript_messages(SID)
        s.load_bootstrap_state(SID)
        s.initialize_session_if_missing(SID, _manifest(), [_feature()])
        s.append_transcript_messages(SID, [Message(role=Role.USER, content="hi")])
        s.append_transcript_messages(SID, [Message(role=Role.USER, content="there")])
        warm = (s.load_bootstrap_state(SID), s.load_transcript_messages(SID))
        assert s.load(SID, "meddler") == 4
    with SessionStore(tmp_path) as fresh:
        cold = (fresh.load_bootstrap_state(SID), fresh.load_transcript_messages(SID))
    assert warm == cold
    assert warm[0].feature_list == [_feature()]
    assert [m.content for m in warm[1]] == ["hi", "there"]
    assert all(m.metadata == {} for m in warm[1])


def test_compaction_with_a_projection_that_changes_its_events_saves_a_true_fold_cache(
    tmp_path: Path,
) -> None:
    """Promise: a fold cache holds the state folded from the log ("used only while it
    checks against the log"). Broken: compaction folds the built-in projections, then
    the user's, over the same decoded events, and saves the bootstrap state it folded
    to the fold cache after them: a user projection that added a step to each feature
    record changed the bootstrap state cached, which every later cold load (in any
    process, with or without that projection) returned, though the snapshot is right.
    Fixed in eventstore/compaction.py: each user projection folds a decode of its own
    (what a cold load gives it)."""
    with SessionStore(tmp_path) as s:
        s.initialize_session_if_missing(SID, _manifest(), [_feature()])
        for _ in range(20):
            s.append_progress_entry(SID, ProgressEntry(run_id="r", summary="x" * 200))
    with SessionStore(tmp_path, projections=[Meddler()]) as s:
        assert s.compact(SID).compacted
    with SessionStore(tmp_path) as fresh:
        assert fresh.load_bootstrap_state(SID).feature_list == [_feature()]


# -- the async API -----------------------------------------------------------------------


def test_a_call_raising_stop_iteration_raises_and_frees_its_session(tmp_path: Path) -> None:
    """Promise: a call's error is raised by its coroutine, "and a failed call does not
    hold up the calls behind it". Broken: a function given to `call` that raised
    StopIteration (`next()` of an exhausted iterator, e.g. of `read_events`) could not
    be set on the asyncio future (TypeError in a loop callback): its caller and every
    call queued behind it on that session waited forever. It is raised as a
    RuntimeError caused by the StopIteration (what PEP 479 does for generators)."""

    async def main() -> None:
        async with AsyncSessionStore(tmp_path) as st:
            await st.append_progress_entry(SID, ProgressEntry(run_id="r", summary="x"))
            first = st.call(SID, lambda: next(iter(st.store.read_events(SID, from_seq=2))))
            behind = st.last_seq(SID)
            got = await asyncio.wait_for(
                asyncio.gather(first, behind, return_exceptions=True), timeout=5
            )
            assert isinstance(got[0], RuntimeError)
            assert isinstance(got[0].__cause__, StopIteration)
            assert got[1] == 1

    asyncio.run(main())


def test_close_waits_for_a_call_submitted_from_another_event_loop(tmp_path: Path) -> None:
    """Promise: `close()` "waits for the calls already submitted", then closes the
    store. Broken: a call submitted from an event loop in another thread (a store
    shared by two loops) was waited for with asyncio.wait on the closing loop, which
    never hears of a future of another loop: close() never returned. It waits for
    those in a thread, until their own loop finishes them."""
    st = AsyncSessionStore(tmp_path)
    started, release = threading.Event(), threading.Event()
    result: dict[str, Any] = {}

    def slow() -> int:
        started.set()
        release.wait(5)
        return st.store.append_progress_entry(SID, ProgressEntry(run_id="r", summary="x")).last_seq

    def other_loop() -> None:
        async def run() -> None:
            result["seq"] = await st.call(SID, slow)

        asyncio.run(run())

    t = threading.Thread(target=other_loop)
    t.start()
    try:
        assert started.wait(5)

        async def closer() -> None:
            closing = asyncio.ensure_future(st.close())
            await asyncio.sleep(0.2)
            assert not closing.done()  # it waits for the running call
            release.set()
            await asyncio.wait_for(closing, timeout=5)

        asyncio.run(closer())
    finally:
        release.set()
        t.join(10)
    assert result == {"seq": 1}
    assert st.store.core.closed
    with SessionStore(tmp_path) as s:
        assert len(s.load_bootstrap_state(SID).recent_progress) == 1


def test_a_caller_cancelled_mid_append_then_retrying_with_its_key_stores_once(
    tmp_path: Path,
) -> None:
    """Coverage (held): a caller cancelled while its append runs in a worker gets
    CancelledError, the append is written whole, the next call on the session waits
    for it, and a retry with the same idempotency key replays it: stored once."""
    store = SessionStore(tmp_path)
    writing = threading.Event()
    real_append = store.engine.append

    def slow_append(*args: Any, **kwargs: Any) -> Any:
        writing.set()
        time.sleep(0.3)
        return real_append(*args, **kwargs)

    store.engine.append = slow_append  # type: ignore[method-assign]
    entry = ProgressEntry(run_id="r", summary="once")

    async def main() -> None:
        async with AsyncSessionStore(store) as st:
            task = asyncio.ensure_future(st.append_progress_entry(SID, entry, idempotency_key="k"))
            while not writing.is_set():
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            again = await st.append_progress_entry(SID, entry, idempotency_key="k")
            assert (again.first_seq, again.replayed) == (1, True)
            with pytest.raises(IdempotencyConflictError):
                other = ProgressEntry(run_id="r", summary="other")
                await st.append_progress_entry(SID, other, idempotency_key="k")

    asyncio.run(main())
    store.close()
    with SessionStore(tmp_path) as s:
        assert [p.summary for p in s.load_bootstrap_state(SID).recent_progress] == ["once"]


class Unencodable(StructProjection[Any]):
    """A projection whose state holds a value msgspec cannot encode (a complex)."""

    name = "unencodable"
    version = 1
    event_types = frozenset({"progress_appended"})
    state_type = Any

    def initial(self) -> Any:
        return {"n": 0j}

    def apply(self, state: Any, event: Event) -> Any:
        return state


def test_a_projection_state_msgspec_cannot_encode_is_a_typed_error_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """Promise: every error is an EventStoreError naming what; bad input changes
    nothing. Broken: a projection state msgspec cannot encode made `load` and
    `compact` raise a bare TypeError ("Encoding objects of type complex is
    unsupported") naming no projection; and two projections of one name raised a bare
    ValueError. Now InvalidRecordError naming the projection (a TypeError still), and
    InvalidArgumentError (a ValueError still); the log is unchanged."""
    with SessionStore(tmp_path, projections=[Unencodable()]) as s:
        for _ in range(20):
            s.append_progress_entry(SID, ProgressEntry(run_id="r", summary="x" * 100))
        before = s.engine.read(SID, None).data
        with pytest.raises(InvalidRecordError, match="unencodable"):
            s.load(SID, "unencodable")
        with pytest.raises(InvalidRecordError, match="unencodable"):
            s.compact(SID)
        assert s.engine.read(SID, None).data == before
        assert len(s.load_bootstrap_state(SID).recent_progress) == 20
    with pytest.raises(InvalidArgumentError, match="bootstrap"):
        SessionStore(tmp_path, projections=[Prios(), type("P", (Prios,), {"name": "bootstrap"})()])
    with pytest.raises(InvalidArgumentError, match="prios"):
        SessionStore(tmp_path, projections=[Prios(), Prios()])


def test_the_async_store_takes_every_argument_the_store_takes(tmp_path: Path) -> None:
    """Promise: the async store "has every SessionStore method as a coroutine", and
    every session operation accepts an `idempotency_key`. Broken: its
    `load_transcript_messages` took no `start`/`limit`/`last` (a page of a long
    transcript could only be had by loading all of it, or raised TypeError), and its
    reads took no `idempotency_key`. Every public method now takes every parameter
    of the store's (but `follow`'s `stop`: closing the async iterator stops it)."""
    for name, fn in inspect.getmembers(SessionStore, predicate=inspect.isfunction):
        if name.startswith("_"):
            continue
        ours = inspect.signature(getattr(AsyncSessionStore, name)).parameters
        missing = set(inspect.signature(fn).parameters) - set(ours) - {"stop"}
        assert not missing, f"AsyncSessionStore.{name} lacks {sorted(missing)}"

    async def main() -> None:
        async with AsyncSessionStore(tmp_path) as st:
            turns = [Message(role=Role.USER, content=f"turn {i}") for i in range(10)]
            await st.append_transcript_messages(SID, turns)
            newest = await st.load_transcript_messages(SID, last=3, idempotency_key="r")
            assert [m.content for m in newest] == ["turn 7", "turn 8", "turn 9"]
            page = await st.load_transcript_messages(SID, start=2, limit=2)
            assert [m.content for m in page] == ["turn 2", "turn 3"]
            assert await st.is_initialized(SID, idempotency_key="r") is False
            assert (await st.load_bootstrap_state(SID, idempotency_key="r")).manifest is None

    asyncio.run(main())


# -- coverage: what held -----------------------------------------------------------------


def test_an_unknown_old_version_line_kept_by_an_older_compactor_is_upcast_by_the_newer(
    tmp_path: Path,
) -> None:
    """Coverage (held): v1 `task` lines, compacted by a process that does not know
    `task` (kept verbatim in the snapshot's `unknown`), are read by a process that
    knows `task` at v2 through its upcaster, with and without the archive; and a
    process at v1 reading v2 lines of a type it reads refuses with CorruptLogError,
    its compaction changing nothing."""
    _old_log(tmp_path)
    with SessionStore(tmp_path) as older:  # knows no `task`
        report = older.compact(SID, force=True)
        assert report.compacted and report.unknown_kept == 2
    up = [(TaskV2, 1, upcaster_giving(3))]
    with SessionStore(tmp_path, event_types=[TaskV2], projections=[Prios()], upcasters=up) as s:
        assert s.load(SID, "prios") == [3, 3]
        s.append(SID, [TaskV2(name="c", prio=9)])
        assert s.load(SID, "prios") == [3, 3, 9]
    with SessionStore(tmp_path, event_types=[TaskV2], projections=[Prios()], upcasters=up) as s:
        assert s.load(SID, "prios") == [3, 3, 9]
    with SessionStore(tmp_path, event_types=[TaskV1]) as v1:
        before = v1.engine.read(SID, None).data
        with pytest.raises(CorruptLogError, match="newer than this reader"):
            v1.compact(SID, force=True)
        assert v1.engine.read(SID, None).data == before


class PriosV2(Prios):
    """`prios` with a new state shape (version 2): the tasks' names by priority."""

    version = 2
    state_type = dict[str, int]

    def initial(self) -> Any:
        return {}

    def apply(self, state: Any, event: Event) -> Any:
        if type(event) is TaskV2:
            state[event.name] = event.prio
        return state


def test_a_projection_version_bump_ignores_its_fold_cache_and_snapshot_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Coverage (held): after a projection's `version` is bumped, neither its fold
    cache nor a snapshot's state of the old version is read as the new shape: the
    state is rebuilt from the archive, and without an archive SnapshotVersionError."""
    tune(monkeypatch, cache_on_close=0)
    for archive in (True, False):
        root = tmp_path / str(archive)
        with SessionStore(root, event_types=[TaskV2], projections=[Prios()]) as s:
            for i in range(30):
                s.append(SID, [TaskV2(name=f"t{i}", prio=i)])
            assert s.load(SID, "prios") == list(range(30))
            assert s.compact(SID, archive=archive).compacted
            s.append(SID, [TaskV2(name="late", prio=99)])
            assert s.load(SID, "prios")[-1] == 99  # a fold cache beside the snapshot
        with SessionStore(root, event_types=[TaskV2], projections=[PriosV2()]) as s:
            if archive:
                want = {f"t{i}": i for i in range(30)} | {"late": 99}
                assert s.load(SID, "prios") == want
            else:
                with pytest.raises(SnapshotVersionError):
                    s.load(SID, "prios")
