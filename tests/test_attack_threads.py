"""Attacks from outside on what threads sharing one store (or map) instance may rely on:
whole batches in every load, results that are the caller's own, a cached state that
always equals the fold of the log, idempotent retries, compaction / close / session
eviction beside live callers, and only `EventStoreError`s.

The failing tests here pin broken promises (see each docstring); the passing ones are
kept as coverage of the strongest attacks that found nothing.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import every_transcript_load

from eventstore import (
    FeatureRecord,
    HarnessSessionMap,
    Message,
    ProgressEntry,
    Role,
    SessionManifest,
    SessionStore,
)
from eventstore.aio import AsyncSessionStore
from eventstore.errors import (
    EventStoreError,
    StoreClosedError,
)
from eventstore.format.events import (
    Event,
    MessagesAppended,
    ProgressAppended,
)
from eventstore.records import (
    TextBlock,
    ToolUseBlock,
)
from eventstore.store import AppendResult
from projections.base import StructProjection


@pytest.fixture(autouse=True)
def _fast_switches() -> Iterator[None]:
    """Hand the GIL over as often as possible: every window between two bytecodes opens."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def _run_threads(targets: list[Callable[[], None]]) -> list[BaseException]:
    """Start every target at once (a barrier), join them, return what they raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(targets))

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            barrier.wait()
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported by the caller
                errors.append(exc)

        return run

    threads = [threading.Thread(target=wrap(fn)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


# -- finding 1: concurrent cold `last=N` pages raise a bare KeyError -------------------


def test_concurrent_cold_last_pages_raise_nothing_but_event_store_errors(tmp_path: Path) -> None:
    """Cold `load_transcript_messages(sid, last=N)` pages of a compacted log cut the
    newest messages from the snapshot line, remembering per session (lock-free) the
    digests of the blocks a cut checked (`_Session.checked_snapshots`). A later, longer
    cut finds the entry, needs a block it does not hold (`_Unproven`) and deletes the
    entry with `del checked_snapshots[h]`: two threads doing that at once, the second
    `del` raises KeyError out of the load (about 95 of 100 pages here)."""
    sid = "s"
    with SessionStore(tmp_path) as s:
        s.append_transcript_messages(
            sid, [Message(Role.USER, f"m{i} " + "x" * 200) for i in range(2000)]
        )
        assert s.compact(sid, force=True).compacted  # the transcript lives in the snapshot
        expected = s.load_transcript_messages(sid)[-1500:]
    failures: list[BaseException] = []
    pages: list[list[Message]] = []
    for _ in range(10):
        store = SessionStore(tmp_path)  # cold: the transcript is never folded here
        try:
            # a short cut checks the snapshot line whole and remembers its last blocks
            assert store.load_transcript_messages(sid, last=1) == expected[-1:]

            def page(store: SessionStore = store) -> None:
                pages.append(store.load_transcript_messages(sid, last=1500))

            failures += _run_threads([page] * 6)
        finally:
            store.close()
    wrong = [repr(e) for e in failures if not isinstance(e, EventStoreError)]
    assert not wrong, f"{len(wrong)} of 60 pages raised {wrong[:2]}"
    assert all(p == expected for p in pages)


# -- finding 2: an interrupted fold leaves a half-folded state that is folded again -----


class _Interrupted(BaseException):
    """What a KeyboardInterrupt (or a timeout raised by a signal handler) is."""


class _Flaky(StructProjection[list[str]]):
    """Progress summaries; `fail_at` names a summary whose fold is interrupted once
    (after the state was changed in place, as `apply` may do)."""

    name = "flaky"
    version = 1
    event_types = frozenset({"progress_appended"})
    state_type = list[str]

    def __init__(self) -> None:
        self.fail_at: str | None = None
        self.error: type[BaseException] = _Interrupted

    def initial(self) -> list[str]:
        return []

    def apply(self, state: list[str], event: Event) -> list[str]:
        if isinstance(event, ProgressAppended):
            state.append(event.entry.summary)
            if event.entry.summary == self.fail_at:
                self.fail_at = None
                raise self.error
        return state


def _batch(*summaries: str) -> list[Event]:
    return [ProgressAppended(entry=ProgressEntry("r", s)) for s in summaries]


def test_an_append_whose_cache_fold_is_interrupted_never_doubles_the_cached_state(
    tmp_path: Path,
) -> None:
    """`_write` advances every cached fold by the batch it committed, in place
    (`f.state = fold(...)`, then `f.head = new`). Interrupted in the middle of that
    (the append is committed), the state keeps the batch's first events while its
    head stays before the batch; the next load folds the batch from the log onto it
    again: ['a', 'b0', 'b1', 'b0', 'b1', 'b2'] for the log's a, b0, b1, b2."""
    flaky = _Flaky()
    store = SessionStore(tmp_path, projections=[flaky])
    try:
        store.append_progress_entry("s", ProgressEntry("r", "a"))
        assert store.load("s", "flaky") == ["a"]
        flaky.fail_at = "b1"
        with pytest.raises(_Interrupted):
            store.append("s", _batch("b0", "b1", "b2"))
        assert store.last_seq("s") == 4  # committed before the fold was interrupted
        assert store.load("s", "flaky") == ["a", "b0", "b1", "b2"]
    finally:
        store.close()


def test_a_load_whose_fold_is_interrupted_never_doubles_the_cached_state(
    tmp_path: Path,
) -> None:
    """The same in a load (`_catch_up` / `_fold_pieces`): a fold interrupted inside a
    piece keeps what it changed in place while `f.head` stays where the piece began
    (only a fold checked against a checked prefix is reset), so the next load folds
    the piece again onto the half-folded state."""
    with SessionStore(tmp_path) as s:
        s.append("s", _batch("a"))
        s.append("s", _batch("b0", "b1", "b2"))
    flaky = _Flaky()
    store = SessionStore(tmp_path, projections=[flaky])
    try:
        assert store.load("s", "flaky") == ["a", "b0", "b1", "b2"]
        with SessionStore(tmp_path) as other:  # another writer: this store's load folds it
            other.append("s", _batch("c0", "c1"))
        flaky.fail_at = "c1"
        with pytest.raises(_Interrupted):
            store.load("s", "flaky")
        assert store.load("s", "flaky") == ["a", "b0", "b1", "b2", "c0", "c1"]
    finally:
        store.close()


def test_an_append_whose_cache_fold_raises_returns_and_the_next_load_folds_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A projection's error while an append advances the cached folds comes after the
    batch is committed: raising it would make the caller write the batch again. The
    append returns (with a warning), the half-folded state is dropped, and the next load
    folds the log again (where the projection's error, if it recurs, belongs)."""
    flaky = _Flaky()
    flaky.error = ValueError
    store = SessionStore(tmp_path, projections=[flaky])
    try:
        assert store.load("s", "flaky") == []
        flaky.fail_at = "b1"
        with caplog.at_level(logging.WARNING, logger="eventstore"):
            result = store.append("s", _batch("b0", "b1", "b2"))
        assert (result.first_seq, result.last_seq) == (1, 3)
        assert "folding 's' into 'flaky' failed" in caplog.text
        assert store.load("s", "flaky") == ["b0", "b1", "b2"]
        assert store.last_seq("s") == 3  # written once
    finally:
        store.close()


# -- aside: the async store's typed refusal of a bad id --------------------------------


def test_the_async_store_refuses_an_unhashable_session_id_as_the_store_does(
    tmp_path: Path,
) -> None:
    """`SessionStore` refuses an id that is not a str with InvalidSessionIdError (an
    EventStoreError); `AsyncSessionStore._submit` first uses the id as its lane's dict
    key, so an unhashable one raises a bare TypeError ("unhashable type: 'list'")."""

    async def main() -> None:
        async with AsyncSessionStore(tmp_path) as a:
            with pytest.raises(EventStoreError):
                await a.load_bootstrap_state(["s"])  # type: ignore[arg-type]

    with SessionStore(tmp_path) as s, pytest.raises(EventStoreError):
        s.load_bootstrap_state(["s"])  # type: ignore[arg-type]
    asyncio.run(main())


# -- coverage: attacks that found nothing ----------------------------------------------


@pytest.mark.parametrize("engine", ["file", "memory"])
def test_loads_pages_and_history_beside_writers_and_a_compactor_see_whole_batches(
    tmp_path: Path, engine: str
) -> None:
    """Two threads append 3-event batches (two progress entries and a message), one
    compacts in a loop, two load (bootstrap, transcript, a warm page) and one reads
    the history: every load holds whole batches, grows monotonically and never holds
    an entry twice; read_events yields 1..N, each once, ending on a closed batch."""
    store = SessionStore(tmp_path if engine == "file" else "memory://")
    sid = "s"
    stop = threading.Event()
    problems: list[object] = []

    def writer(w: int) -> Callable[[], None]:
        def run() -> None:
            for i in range(150):
                store.append(
                    sid,
                    [
                        *_batch(f"w{w}b{i}-0", f"w{w}b{i}-1"),
                        MessagesAppended(messages=[Message(Role.USER, f"w{w}b{i}")]),
                    ],
                )

        return run

    def compactor() -> None:
        while not stop.is_set():
            store.compact(sid, force=True)

    def loader() -> None:
        prev: list[str] = []
        while not stop.is_set():
            got = [p.summary for p in store.load_bootstrap_state(sid).recent_progress]
            batches = {s[:-2] for s in got}
            if len(got) != 2 * len(batches) or got[: len(prev)] != prev:
                problems.append(("bootstrap", len(got), len(prev)))
            prev = got
            messages = [m.content for m in store.load_transcript_messages(sid)]
            if not batches <= set(messages):  # appended after the bootstrap load
                problems.append(("transcript behind", len(messages), len(batches)))
            tail = messages[-2:]
            page = store.load_transcript_messages(sid, start=len(messages) - len(tail))
            if [m.content for m in page][: len(tail)] != tail:
                problems.append(("page", page))

    def historian() -> None:
        while not stop.is_set():
            events = list(store.read_events(sid))
            if [e.seq for e in events] != list(range(1, len(events) + 1)):
                problems.append(("history", len(events)))
            if events and events[-1].more:
                problems.append(("history ends mid-batch", events[-1].seq))

    def writers() -> None:
        errors = _run_threads([writer(0), writer(1)])
        stop.set()
        if errors:
            raise errors[0]

    try:
        errors = _run_threads([writers, compactor, loader, loader, historian])
        assert not errors
        assert not problems, problems[:5]
        final = store.load_bootstrap_state(sid).recent_progress
        assert len(final) == len({p.summary for p in final}) == 600
        assert store.last_seq(sid) == 900
        assert store.verify(sid).ok
    finally:
        store.close()


def test_one_idempotency_key_from_many_threads_writes_once_beside_eviction_and_compaction(
    tmp_path: Path,
) -> None:
    """Five threads retry the same keyed append while a sixth opens another session
    (dropping this one from a one-session cache, so threads hold two session objects)
    and compacts: one append is written, every other call replays its seqs."""
    store = SessionStore(tmp_path, cached_sessions=1)
    try:
        for k in range(15):
            results: list[AppendResult] = []

            def put(k: int = k, results: list[AppendResult] = results) -> None:
                entry = ProgressEntry("r", f"k{k}")
                results.append(store.append_progress_entry("s", entry, idempotency_key=f"key{k}"))

            def churn(k: int = k) -> None:
                store.load_bootstrap_state(f"other{k}")
                store.compact("s", force=True)

            assert not _run_threads([put] * 5 + [churn])
            assert len({(r.first_seq, r.last_seq) for r in results}) == 1
            assert sum(not r.replayed for r in results) == 1
        summaries = [p.summary for p in store.load_bootstrap_state("s").recent_progress]
        assert summaries == [f"k{k}" for k in range(15)]
    finally:
        store.close()


def test_close_beside_appending_and_loading_threads_loses_nothing_acknowledged(
    tmp_path: Path,
) -> None:
    """close() while threads append and load (warm and cold pages): they see only
    StoreClosedError, and every append acknowledged before it is in the log."""
    acked: list[tuple[str, str]] = []
    for r in range(8):
        store = SessionStore(tmp_path)
        sid = f"c{r}"
        for i in range(20):
            store.append_progress_entry(sid, ProgressEntry("r", f"pre{i}"))

        def append(j: int, store: SessionStore = store, sid: str = sid) -> None:
            try:
                for i in range(300):
                    store.append_progress_entry(sid, ProgressEntry("r", f"{j}-{i}"))
                    acked.append((sid, f"{j}-{i}"))
            except StoreClosedError:
                pass

        def load(store: SessionStore = store, sid: str = sid) -> None:
            try:
                for _ in range(300):
                    store.load_bootstrap_state(sid)
                    store.load_transcript_messages(sid, last=2)
            except StoreClosedError:
                pass

        def close(store: SessionStore = store, r: int = r) -> None:
            time.sleep(0.003 * r)
            store.close()

        errors = _run_threads([lambda: append(1), lambda: append(2), load, load, close])
        assert not errors, errors[:2]
    with SessionStore(tmp_path) as fresh:
        for sid, summary in acked:
            assert summary in {p.summary for p in fresh.load_bootstrap_state(sid).recent_progress}


def _rich(i: int) -> Message:
    return Message(
        Role.ASSISTANT,
        f"turn {i}",
        blocks=[TextBlock(f"turn {i}"), ToolUseBlock("t", "run", {"argv": ["ls"], "n": i})],
        metadata={"tags": [i]},
    )


def test_threads_changing_what_they_loaded_never_change_the_store_or_each_other(
    tmp_path: Path,
) -> None:
    """Threads load (bootstrap, whole transcript, warm pages) and change everything
    mutable in what they got — manifest metadata and init plan, feature steps and
    flags, message blocks, tool-call inputs and metadata — while another appends;
    a fresh store and every later load agree with the log."""
    sid = "s"
    manifest = SessionManifest(sid, "main", "obj", metadata={"k": "v"})
    features = [FeatureRecord(f"f{i}", "c", "d", ["a"], False) for i in range(5)]
    store = SessionStore(tmp_path)
    try:
        store.initialize_session_if_missing(sid, manifest, features)
        store.append_transcript_messages(sid, [_rich(i) for i in range(20)])

        def vandal() -> None:
            for _ in range(100):
                st = store.load_bootstrap_state(sid)
                assert st.manifest is not None
                st.manifest.metadata["k"] = "changed"
                st.feature_list[0].steps.append("x")
                st.feature_list[0].passes = True
                st.feature_list.reverse()
                st.recent_progress.clear()
                for page in every_transcript_load(store, sid):
                    for m in page:
                        m.blocks.append(TextBlock("x"))
                        m.tool_calls[0].input["argv"].append("-l")
                        m.metadata["tags"].append(-1)

        def writer() -> None:
            for i in range(20, 60):
                store.append_transcript_messages(sid, [_rich(i)])
                store.append_progress_entry(sid, ProgressEntry("r", f"p{i}"))

        assert not _run_threads([vandal, vandal, writer])
        with SessionStore(tmp_path) as fresh:
            assert store.load_bootstrap_state(sid) == fresh.load_bootstrap_state(sid)
            assert store.load_transcript_messages(sid) == fresh.load_transcript_messages(sid)
        assert store.load_transcript_messages(sid) == [_rich(i) for i in range(60)]
        st = store.load_bootstrap_state(sid)
        assert st.manifest == manifest and st.feature_list == features
    finally:
        store.close()


def test_async_tasks_on_one_session_see_whole_batches_in_submission_order(
    tmp_path: Path,
) -> None:
    """Tasks on one AsyncSessionStore (4 workers) append batches to two sessions and
    load between them: each load sees exactly the batches submitted before it."""

    async def main() -> None:
        async with AsyncSessionStore(tmp_path) as a:

            async def task(sid: str) -> None:
                for i in range(40):
                    await a.append(sid, _batch(f"{i}-0", f"{i}-1"))
                    got = (await a.load_bootstrap_state(sid)).recent_progress
                    assert [p.summary for p in got][-2:] == [f"{i}-0", f"{i}-1"]
                    assert len(got) == 2 * (i + 1)

            await asyncio.gather(task("a"), task("b"), a.compact("a", force=True))

    asyncio.run(main())


def test_threads_sharing_one_harness_map_keep_created_ms_and_a_consistent_history(
    tmp_path: Path,
) -> None:
    """Threads put, get and forget on one HarnessSessionMap: every get is a session id
    some put bound, created_ms survives every rewrite, and the history holds every
    put and forget once."""
    from eventstore.harness_sessions import read_history

    hmap = HarnessSessionMap(tmp_path / "map")
    hmap.put("ctx", "first", "h", "d")
    path = hmap.entry_path("ctx")
    assert path is not None
    created = path.read_bytes()
    seen: list[str | None] = []

    def putter(w: int) -> Callable[[], None]:
        def run() -> None:
            for i in range(25):
                hmap.put("ctx", f"w{w}-{i}", "h", "d")

        return run

    def getter() -> None:
        for _ in range(200):
            seen.append(hmap.get("ctx"))

    try:
        assert not _run_threads([putter(0), putter(1), getter, getter])
        import json

        entry = json.loads(path.read_bytes())
        assert entry["created_ms"] == json.loads(created)["created_ms"]
        bound = {"first"} | {f"w{w}-{i}" for w in (0, 1) for i in range(25)}
        assert set(seen) <= bound
        assert hmap.forget("ctx", by="cli") in bound
        history = read_history(tmp_path / "map")
        assert [h.action for h in history].count("put") == 51
        assert [h.seq for h in history] == list(range(1, 53))
    finally:
        hmap.close()
