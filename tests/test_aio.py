"""AsyncSessionStore: coroutines over the session API that never block the event loop.

Attacks: hundreds of concurrent tasks on one session (order kept, reads see exactly the
writes submitted before them), many sessions at once (in parallel, bounded), errors
raised typed and not breaking a session's lane, cancellation before and during a call,
close with calls in flight. (The loop's lag while 1,000 appends run is a figure:
`python -m bench.loop_lag`.)
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from conftest import run_threads
from engines import EngineCase
from hypothesis import given, settings
from hypothesis import strategies as st

from eventstore import (
    AppendResult,
    ConcurrencyError,
    FeatureNotFoundError,
    FeatureRecord,
    IdempotencyConflictError,
    InvalidRecordError,
    InvalidSessionIdError,
    Message,
    ProgressAppended,
    ProgressEntry,
    Role,
    SessionManifest,
    SessionStore,
    StoreClosedError,
)
from eventstore.aio import AsyncSessionStore
from eventstore.errors import EventStoreError, InvalidArgumentError
from eventstore.format.events import Event

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def note(i: int | str) -> ProgressAppended:
    return ProgressAppended(entry=ProgressEntry(run_id="r", summary=str(i)))


def summaries(store: SessionStore, sid: str) -> list[str]:
    return [p.summary for p in store.load_bootstrap_state(sid).recent_progress]


def test_every_public_method_has_an_async_counterpart() -> None:
    public = {
        name
        for name, member in inspect.getmembers(SessionStore)
        if not name.startswith("_") and callable(member)
    }
    for name in public:
        assert hasattr(AsyncSessionStore, name), f"AsyncSessionStore lacks {name}"
        fn = getattr(AsyncSessionStore, name)
        assert inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn), name


def test_one_session_keeps_submission_order_and_reads_see_every_earlier_write(
    tmp_path: Path,
) -> None:
    async def main() -> list[int]:
        async with AsyncSessionStore(tmp_path, max_workers=4) as store:
            calls: list[Coroutine[Any, Any, Any]] = []
            for i in range(300):
                calls.append(store.append("s", [note(i)]))
                if i % 25 == 0:
                    calls.append(store.load_bootstrap_state("s"))
            results = await asyncio.gather(*calls)
        # each read saw exactly the appends submitted before it, no more, no fewer
        return [len(r.recent_progress) for r in results if not hasattr(r, "first_seq")]

    seen = run(main())
    assert seen == [i + 1 for i in range(0, 300, 25)]
    assert summaries(SessionStore(tmp_path), "s") == [str(i) for i in range(300)]
    assert SessionStore(tmp_path).verify("s").ok


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcde"), st.integers(0, 10**6)), max_size=60))
def test_many_sessions_each_keep_their_order(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]]
) -> None:
    root = tmp_path_factory.mktemp("aio")

    async def main() -> None:
        async with AsyncSessionStore(root, max_workers=3) as store:
            await asyncio.gather(*(store.append(sid, [note(v)]) for sid, v in ops))

    run(main())
    plain = SessionStore(root)
    for sid in "abcde":
        assert summaries(plain, sid) == [str(v) for s, v in ops if s == sid]


def test_calls_on_one_session_never_overlap_and_different_sessions_run_in_parallel(
    tmp_path: Path,
) -> None:
    active: dict[str, int] = {}
    overlaps: list[str] = []
    barrier = threading.Barrier(2, timeout=5)  # breaks unless two sessions run at once
    lock = threading.Lock()

    def work(sid: str, meet: bool) -> str:
        with lock:
            active[sid] = active.get(sid, 0) + 1
            if active[sid] > 1:
                overlaps.append(sid)
        if meet:
            barrier.wait()
        time.sleep(0.002)
        with lock:
            active[sid] -= 1
        return sid

    async def main() -> None:
        async with AsyncSessionStore(tmp_path, max_workers=4) as store:
            same = [store.call("one", lambda: work("one", False)) for _ in range(40)]
            meet = [store.call(sid, lambda sid=sid: work(sid, True)) for sid in ("x", "y")]  # type: ignore[misc]
            await asyncio.gather(*same, *meet)

    run(main())
    assert overlaps == []


def test_the_thread_offload_is_bounded(tmp_path: Path) -> None:
    running = 0
    peak = 0
    lock = threading.Lock()

    def work() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.01)
        with lock:
            running -= 1

    async def main() -> None:
        async with AsyncSessionStore(tmp_path, max_workers=2) as store:
            await asyncio.gather(*(store.call(f"s{i}", work) for i in range(12)))

    run(main())
    assert peak == 2


def test_calls_waiting_for_their_turn_hold_no_thread(tmp_path: Path) -> None:
    release = threading.Event()

    async def main() -> None:
        async with AsyncSessionStore(tmp_path, max_workers=2) as store:
            blocker = asyncio.ensure_future(store.call("a", lambda: release.wait(10)))
            queued = [asyncio.ensure_future(store.append("a", [note(i)])) for i in range(20)]
            await asyncio.sleep(0.05)
            # 21 calls on "a" are submitted, one worker is taken: "b" still gets the other
            await asyncio.wait_for(store.append("b", [note("b")]), 5)
            assert not any(q.done() for q in queued)
            release.set()
            await blocker
            await asyncio.gather(*queued)

    run(main())
    assert summaries(SessionStore(tmp_path), "a") == [str(i) for i in range(20)]


def test_errors_are_raised_typed_and_the_lane_goes_on(tmp_path: Path) -> None:
    manifest = SessionManifest(session_id="s", active_branch="main", current_objective="o")
    feature = FeatureRecord(id="f1", category="c", description="d", steps=[], passes=False)

    async def main() -> None:
        async with AsyncSessionStore(tmp_path) as store:
            assert await store.initialize_session_if_missing("s", manifest, [feature])
            results = await asyncio.gather(
                store.update_feature_pass("s", "nope", True),
                store.append("s", [note(1)], expected_seq=0),
                store.append("s", [note(2)]),
                store.load_bootstrap_state("bad\x00id"),
                store.append("s", []),
                store.update_feature_pass("s", "f1", True),
                return_exceptions=True,
            )
            assert isinstance(results[0], FeatureNotFoundError)
            assert isinstance(results[1], ConcurrencyError) and results[1].actual == 2
            assert isinstance(results[2], AppendResult) and results[2].first_seq == 3
            assert isinstance(results[3], InvalidSessionIdError)
            assert isinstance(results[4], InvalidRecordError)
            assert isinstance(results[5], AppendResult) and results[5].first_seq == 4
            state = await store.load_bootstrap_state("s")
            assert [p.summary for p in state.recent_progress] == ["2"]
            assert state.feature_list[0].passes is True

    run(main())


def test_a_call_cancelled_while_waiting_never_runs(tmp_path: Path) -> None:
    release = threading.Event()

    async def main() -> None:
        async with AsyncSessionStore(tmp_path) as store:
            blocker = asyncio.ensure_future(store.call("s", lambda: release.wait(5)))
            await asyncio.sleep(0.05)  # the blocker holds the lane
            waiting = asyncio.ensure_future(store.append("s", [note("withdrawn")]))
            after = asyncio.ensure_future(store.append("s", [note("after")]))
            await asyncio.sleep(0.01)
            waiting.cancel()
            release.set()
            assert await blocker is True
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await after

    run(main())
    assert summaries(SessionStore(tmp_path), "s") == ["after"]


def test_a_call_cancelled_while_running_completes_before_the_next(tmp_path: Path) -> None:
    started = threading.Event()
    order: list[str] = []

    def slow() -> None:
        started.set()
        time.sleep(0.1)
        order.append("slow done")

    async def main() -> None:
        async with AsyncSessionStore(tmp_path) as store:
            running = asyncio.ensure_future(store.call("s", slow))
            while not started.is_set():
                await asyncio.sleep(0.001)
            nxt = asyncio.ensure_future(store.call("s", lambda: order.append("next")))
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
            await nxt

    run(main())
    assert order == ["slow done", "next"]


def test_close_waits_for_submitted_calls_then_refuses_new_ones(tmp_path: Path) -> None:
    async def main() -> AsyncSessionStore:
        store = AsyncSessionStore(tmp_path)
        tasks = [asyncio.ensure_future(store.append("s", [note(i)])) for i in range(50)]
        await asyncio.sleep(0)  # the calls are submitted
        await store.close()
        assert all(t.done() and t.exception() is None for t in tasks)
        assert store.closed
        with pytest.raises(StoreClosedError):
            await store.append("s", [note("late")])
        with pytest.raises(StoreClosedError):
            await store.list_sessions()
        return store

    store = run(main())
    assert summaries(SessionStore(tmp_path), "s") == [str(i) for i in range(50)]
    with pytest.raises(StoreClosedError):  # the store it opened is closed too
        store.store.load_bootstrap_state("s")


def test_a_shared_store_is_not_closed(tmp_path: Path) -> None:
    plain = SessionStore(tmp_path)

    async def main() -> None:
        async with AsyncSessionStore(plain) as store:
            await store.append("s", [note(1)])
            assert await store.list_sessions() == ["s"]

    run(main())
    assert summaries(plain, "s") == ["1"]  # still open


def test_the_store_can_be_used_from_one_loop_after_another(tmp_path: Path) -> None:
    store = AsyncSessionStore(tmp_path)
    for i in range(3):
        run(store.append("s", [note(i)]))
    assert run(store.last_seq("s")) == 3
    run(store.close())


def test_audit_methods_and_compaction(tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncSessionStore(tmp_path) as store:
            for i in range(5):
                await store.append("s", [note(i)])
            report = await store.compact("s", force=True)
            assert report.events_before == 5
            events = await store.read_events("s", from_seq=2, to_seq=4)
            assert [e.seq for e in events] == [2, 3, 4]
            assert len((await store.state_at("s", seq=3)).recent_progress) == 3
            assert await store.transcript_at("s", seq=3) == []
            assert (await store.verify("s")).ok
            assert await store.load("s", "bootstrap") == await store.load_bootstrap_state("s")
            assert "bootstrap" in store.projections

    run(main())


def test_follow_yields_what_is_appended_later(tmp_path: Path) -> None:
    async def main() -> list[int]:
        async with AsyncSessionStore(tmp_path) as store:
            await store.append("s", [note(0)])
            seen: list[int] = []

            async def consume() -> None:
                async for ev in store.follow("s", poll_interval=0.01):
                    seen.append(ev.seq)
                    if len(seen) == 3:
                        return

            consumer = asyncio.ensure_future(consume())
            await store.append("s", [note(1)])
            await store.append("s", [note(2)])
            await asyncio.wait_for(consumer, 10)
            return seen

    assert run(main()) == [1, 2, 3]


def test_close_ends_a_running_follow(tmp_path: Path) -> None:
    async def main() -> list[int]:
        store = AsyncSessionStore(tmp_path)
        await store.append("s", [note(0)])
        seen: list[int] = []

        async def consume() -> None:
            async for ev in store.follow("s", poll_interval=0.01):
                seen.append(ev.seq)

        consumer = asyncio.ensure_future(consume())
        while not seen:
            await asyncio.sleep(0.005)
        await store.close()
        await asyncio.wait_for(consumer, 5)  # the iteration ended by itself
        with pytest.raises(StoreClosedError):
            async for _ in store.follow("s"):
                pass
        return seen

    assert run(main()) == [1]


def test_delete_session_runs_after_the_calls_before_it(tmp_path: Path) -> None:
    async def main() -> tuple[bool, bool, list[str]]:
        async with AsyncSessionStore(tmp_path) as store:
            writes = [store.append("s", [note(i)]) for i in range(20)]
            deleted = store.delete_session("s")
            again = store.delete_session("s")
            results = await asyncio.gather(*writes, deleted, again)
            first, second = results[-2], results[-1]
            assert isinstance(first, bool) and isinstance(second, bool)
            return first, second, await store.list_sessions()

    assert run(main()) == (True, False, [])


@pytest.mark.parametrize("url", ["memory://", "file"])
def test_urls_open_any_engine(tmp_path: Path, url: str) -> None:
    async def main() -> list[str]:
        async with AsyncSessionStore(str(tmp_path) if url == "file" else url) as store:
            await asyncio.gather(*(store.append(f"s{i % 3}", [note(i)]) for i in range(30)))
            state = await store.load_bootstrap_state("s1")
            assert [p.summary for p in state.recent_progress] == [str(i) for i in range(1, 30, 3)]
            return await store.list_sessions()

    assert run(main()) == ["s0", "s1", "s2"]


def test_bad_max_workers_is_refused(tmp_path: Path) -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_workers"):
            AsyncSessionStore(tmp_path, max_workers=bad)  # type: ignore[arg-type]


# -- attacks -------------------------------------------------------------------------------


def _batch(*summaries: str) -> list[Event]:
    return [ProgressAppended(entry=ProgressEntry("r", s)) for s in summaries]


@pytest.mark.usefixtures("fast_switches")
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


@pytest.mark.usefixtures("fast_switches")
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


# -- attacks: calls cancelled mid-append, raising StopIteration, closed from another loop ---


SID = "s"


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


class _Exhausted(StopIteration):
    """A StopIteration of a library's own (a subclass)."""


def test_a_call_raising_a_stop_iteration_subclass_raises_not_returns(tmp_path: Path) -> None:
    """Attack: a function given to `call` that raised a subclass of StopIteration was
    not turned into a RuntimeError (the check named StopIteration's exact type): the
    future took it, and the caller's `await` read it as the coroutine's return, so the
    call "returned" the exception's value, a failure answered as a success. Any
    StopIteration is raised as a RuntimeError caused by it, and close() still ends."""

    def fails() -> int:
        raise _Exhausted("not a result")

    async def main() -> None:
        async with AsyncSessionStore(tmp_path) as st:
            got = await asyncio.wait_for(
                asyncio.gather(st.call(SID, fails), st.last_seq(SID), return_exceptions=True),
                timeout=30,
            )
            assert isinstance(got[0], RuntimeError)
            assert isinstance(got[0].__cause__, _Exhausted)
            assert got[1] == 0

    asyncio.run(asyncio.wait_for(main(), timeout=60))


def test_a_call_of_an_async_function_or_no_function_is_refused(tmp_path: Path) -> None:
    """Attack: `call(sid, some_async_function)` "succeeded" at once, answering with the
    coroutine it never ran (the work its caller awaited was never done, in order or at
    all), and `call(sid, 5)` raised a bare TypeError. Both are InvalidArgumentError
    naming the session, as is a function returning a coroutine (closed unrun); the
    session's calls go on."""
    ran: list[str] = []

    async def work() -> str:
        ran.append("work")
        return "done"

    async def main() -> None:
        async with AsyncSessionStore(tmp_path) as st:
            for fn in (work, 5, None, lambda: work()):
                with pytest.raises(InvalidArgumentError, match=f"session '{SID}'"):
                    await asyncio.wait_for(st.call(SID, fn), timeout=30)
            assert await asyncio.wait_for(st.call(SID, lambda: "next"), timeout=30) == "next"

    asyncio.run(main())
    assert ran == []


def test_close_waits_for_a_call_submitted_from_another_event_loop(tmp_path: Path) -> None:
    """Promise: `close()` "waits for the calls already submitted", then closes the
    store. Broken: a call submitted from an event loop in another thread (a store
    shared by two loops) was waited for with asyncio.wait on the closing loop, which
    never hears of a future of another loop: close() never returned. It waits for
    those in a thread, until the workers have run them."""
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


# -- attacks: withdrawal while every worker is busy, lanes across event loops ----------------


def test_a_call_cancelled_while_waiting_for_a_free_worker_never_runs(url: str) -> None:
    """Attack: with `max_workers=1` held by a call on "a", an append on "b" (the head of
    its lane, so already handed to the pool) is cancelled while it waits for a thread.
    It was appended anyway once the worker came free, though the docs say a call
    cancelled while it waits is withdrawn and never runs (a `wait_for` timeout that
    still writes). Now a call whose caller was cancelled before a worker picked it up
    is skipped, on every engine."""
    started, release = threading.Event(), threading.Event()

    def hold() -> bool:
        started.set()
        return release.wait(10)

    async def main() -> None:
        async with AsyncSessionStore(url, max_workers=1) as st:
            blocker = asyncio.ensure_future(st.call("a", hold))
            while not started.is_set():
                await asyncio.sleep(0.005)
            waiting = asyncio.ensure_future(st.append("b", [note("withdrawn")]))
            await asyncio.sleep(0)  # submitted: queued in the pool behind the blocker
            waiting.cancel()
            release.set()
            assert await blocker is True
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert await st.last_seq("b") == 0  # runs after the withdrawn call
            await st.append("b", [note("after")])

    run(main())
    with SessionStore(url) as plain:
        assert summaries(plain, "b") == ["after"]


def test_calls_on_one_session_from_two_event_loops_never_overlap(url: str) -> None:
    """Attack: the lanes were kept per event loop, so calls on one session submitted from
    two loops ran at once: a call left running when its loop ended (`asyncio.run` over,
    its caller cancelled) and the next loop's append on that session (a new loop per
    turn, as `Runner.run_sync` makes), or two threads each running a loop. The later
    append landed first: the log's order was not the order of submission. One lane per
    session now serves every loop: the later call waits, on every engine."""
    st = AsyncSessionStore(url)
    started, release = threading.Event(), threading.Event()

    def held(summary: str) -> Any:
        started.set()
        release.wait(10)
        return st.store.append("s", [note(summary)])

    async def then_append(summary: str) -> None:
        later = asyncio.ensure_future(st.append("s", [note(summary)]))
        with pytest.raises(asyncio.TimeoutError):  # it waits for the held call
            await asyncio.wait_for(asyncio.shield(later), 0.3)
        release.set()
        await later

    async def abandon() -> None:
        asyncio.ensure_future(st.call("s", lambda: held("first")))
        while not started.is_set():
            await asyncio.sleep(0.005)
        # returning ends the loop: the call's caller is cancelled, the call runs on

    run(abandon())
    run(then_append("second"))
    started.clear()
    release.clear()
    other = threading.Thread(target=lambda: run(st.call("s", lambda: held("third"))))
    other.start()
    assert started.wait(10)
    run(then_append("fourth"))
    other.join(10)
    run(st.close())
    with SessionStore(url) as plain:
        assert summaries(plain, "s") == ["first", "second", "third", "fourth"]


def test_close_ends_a_follow_whose_read_is_in_flight_cleanly(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: `close()` set a follow's stop and closed the store at once, while the
    follow's thread could be inside a read of the log: on PostgreSQL and Redis that
    read raised StorageError ("the engine is closed") in the consumer, where the docs
    say close ends every follow. close() now waits for a read begun before it stopped
    the follow, then closes the store; the iteration just ends, on every engine."""
    st = AsyncSessionStore(url)
    engine: Any = st.store.engine
    real_read, real_close = engine.read, st.store.close
    reading, store_closed = threading.Event(), threading.Event()

    def read_across_close(*args: Any, **kwargs: Any) -> Any:
        reading.set()
        store_closed.wait(0.5)  # (the whole wait when close waits for this read)
        return real_read(*args, **kwargs)

    def close() -> None:
        real_close()
        store_closed.set()

    monkeypatch.setattr(st.store, "close", close)

    async def main() -> list[int]:
        await st.append("s", [note(0)])
        seen: list[int] = []

        async def consume() -> None:
            async for ev in st.follow("s", poll_interval=0.01):
                seen.append(ev.seq)

        consumer = asyncio.ensure_future(consume())
        while not seen:
            await asyncio.sleep(0.005)
        monkeypatch.setattr(engine, "read", read_across_close)
        while not reading.is_set():
            await asyncio.sleep(0.005)
        await asyncio.wait_for(st.close(), 10)
        await asyncio.wait_for(consumer, 10)  # ended, no error
        return seen

    assert run(main()) == [1]


def test_close_finishes_with_calls_of_an_event_loop_stopped_but_never_closed(url: str) -> None:
    """Attack: an event loop submits calls on a session, then is stopped (`loop.stop()`)
    and never closed; close() from another loop waited for those calls' futures, which
    only a running loop settles: close never returned. close() now waits for the calls
    to run in the workers (each is completed, on every engine), and a caller whose loop
    runs again gets its call's outcome: nothing it was promised is lost."""
    st = AsyncSessionStore(url)
    started, release = threading.Event(), threading.Event()

    def slow() -> int:
        started.set()
        release.wait(10)
        return st.store.append(SID, [note("first")]).last_seq

    stopped = asyncio.new_event_loop()
    try:
        first = stopped.create_task(st.call(SID, slow))
        behind = stopped.create_task(st.append(SID, [note("behind")]))
        stopped.call_soon(stopped.stop)  # one turn: both calls submitted, then stopped
        stopped.run_forever()
        assert started.wait(10)
        closer = threading.Thread(target=lambda: run(st.close()), daemon=True)
        closer.start()
        release.set()
        closer.join(30)  # a hang detector, not a speed limit
        assert not closer.is_alive(), "close() never returned"
        assert st.closed
        with SessionStore(url) as plain:
            assert summaries(plain, SID) == ["first", "behind"]
        # the loop runs again: its callers hear of their calls, in order
        assert stopped.run_until_complete(first) == 1
        assert stopped.run_until_complete(behind).last_seq == 2
    finally:
        release.set()
        stopped.close()


def test_a_close_cancelled_while_it_waits_still_closes_and_a_second_close_is_a_no_op(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a close() cancelled (a timeout, a task cancelled) while it waited for a
    running call left the store open: its threads and engine were never released, and
    only another close() closed them, a second time. The closing now runs on its own,
    begun by the first close(): calls are refused as after any close, the store closes
    once the running call ends (on every engine), and a later close() waits for that
    closing and returns, without closing anything again."""
    st = AsyncSessionStore(url)
    started, release = threading.Event(), threading.Event()
    closes: list[int] = []
    real_close = st.store.close

    def counted_close() -> None:
        closes.append(1)
        real_close()

    monkeypatch.setattr(st.store, "close", counted_close)

    def slow() -> int:
        started.set()
        release.wait(10)
        return st.store.append(SID, [note("first")]).last_seq

    async def main() -> None:
        running = asyncio.ensure_future(st.call(SID, slow))
        assert await asyncio.to_thread(started.wait, 10)
        closing = asyncio.ensure_future(st.close())
        await asyncio.sleep(0)  # close begins: it waits for the running call
        assert st.closed and not closing.done()
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        with pytest.raises(StoreClosedError):  # as after any close
            await st.append(SID, [note("late")])
        release.set()
        assert await running == 1
        for _ in range(3000):  # a hang detector (30 s), not a speed limit
            if st.store.core.closed:
                break
            await asyncio.sleep(0.01)
        assert st.store.core.closed, "the cancelled close never closed the store"
        await asyncio.wait_for(st.close(), 30)  # a no-op: nothing closed twice
        await asyncio.wait_for(asyncio.gather(st.close(), st.close()), 30)

    try:
        run(main())
    finally:
        release.set()
    assert closes == [1]
    with SessionStore(url) as plain:
        assert summaries(plain, SID) == ["first"]


_EXIT_WITH_A_CLOSE_IN_FLIGHT = """
import asyncio, sys, threading, time
from eventstore import ProgressAppended, ProgressEntry
from eventstore.aio import AsyncSessionStore
store = AsyncSessionStore(sys.argv[1])
queued = threading.Event()

def writer() -> None:  # a thread of its own, running its loop while the process exits
    async def main() -> None:
        async def one(i: int) -> None:
            ev = ProgressAppended(entry=ProgressEntry(run_id="r", summary=str(i)))
            print((await store.append("x", [ev])).last_seq, flush=True)

        running = asyncio.ensure_future(store.call("x", lambda: time.sleep(1)))
        appends = [asyncio.ensure_future(one(i)) for i in range(10)]  # queued behind it
        await asyncio.sleep(0)
        queued.set()
        await asyncio.gather(running, *appends)

    asyncio.run(main())

threading.Thread(target=writer).start()
queued.wait(30)

async def close() -> None:
    try:
        await asyncio.wait_for(store.close(), 0.001)  # left in flight
    except asyncio.TimeoutError:
        pass

asyncio.run(close())  # then the main thread ends (the running call sleeps on): an exit
"""


def test_an_exit_with_a_close_in_flight_and_another_loops_calls_queued_ends(
    case: EngineCase, url: str
) -> None:
    """Attack: a process's main thread ends with a close() in flight while another
    thread's loop has calls queued on a session behind a running one: the interpreter
    shuts the workers' pool before joining that thread, so the next call of the lane
    could not be submitted, its caller and the closing waited forever, and the exit
    hung. Each such call gets a thread of its own: the process ends, and every append
    acknowledged (all ten) is read back."""
    if not case.processes:
        pytest.skip(f"the {case.name} engine is not shared across processes")
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_WITH_A_CLOSE_IN_FLIGHT, url],
        capture_output=True,
        text=True,
        timeout=60,  # a hang detector, not a speed limit
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert sorted(int(line) for line in done.stdout.split()) == list(range(1, 11))
    with SessionStore(url) as store:
        assert [e.seq for e in store.read_events("x")] == list(range(1, 11))


def test_a_close_from_inside_a_call_of_the_same_store_does_not_wait_for_itself(
    tmp_path: Path,
) -> None:
    """Attack: a call's function closes its own store (through a loop of its own, as a
    worker has none): close() waited for every call under way, this one among them,
    which waited for close(): a hang (cut here after 5 s by a hang detector). From a
    call, close() begins the closing and returns; the closing ends after the call."""
    st = AsyncSessionStore(tmp_path / "store")

    def closes() -> None:
        asyncio.run(asyncio.wait_for(st.close(), 5))  # a hang detector, not a speed limit

    async def main() -> None:
        await st.append("s", [note("first")])
        await asyncio.wait_for(st.call("s", closes), 30)  # (hang detectors, as above)
        assert st.closed
        with pytest.raises(StoreClosedError):
            await st.append("s", [note("late")])
        await asyncio.wait_for(st.close(), 30)  # waits for the closing the call began

    run(main())
    with SessionStore(tmp_path / "store") as plain:
        assert summaries(plain, "s") == ["first"]


def test_closes_from_loops_in_several_threads_at_once_lose_no_acknowledged_append(
    url: str,
) -> None:
    """Attack: four threads, each running its own loop appending to a session of its own,
    close the store at once mid-stream (each after its own count): every close returns
    (none hangs, none closes twice), later calls are refused, and every append
    acknowledged, on every engine, is in its session, in order."""
    st = AsyncSessionStore(url)
    acked: dict[str, list[int]] = {f"s{k}": [] for k in range(4)}

    def writer(sid: str, until: int) -> Callable[[], None]:
        def go() -> None:
            async def main() -> None:
                with contextlib.suppress(StoreClosedError):
                    for i in range(200):
                        acked[sid].append((await st.append(sid, [note(i)])).last_seq)
                        if i == until:
                            await asyncio.wait_for(st.close(), 30)  # a hang detector

            run(main())

        return go

    errors = run_threads([writer(f"s{k}", 5 + 7 * k) for k in range(4)])
    assert errors == []
    assert st.closed
    with SessionStore(url) as plain:
        for sid, seqs in acked.items():
            assert seqs, f"{sid}: no append was acknowledged"
            assert seqs == list(range(1, len(seqs) + 1))
            assert [e.seq for e in plain.read_events(sid)] == seqs


_FORKS_OF_AN_ASYNC_STORE = """
import asyncio, os, sys, threading
from eventstore import ProgressAppended, ProgressEntry
from eventstore.aio import AsyncSessionStore

def note(i: int) -> ProgressAppended:
    return ProgressAppended(entry=ProgressEntry(run_id="r", summary=str(i)))

store = AsyncSessionStore(sys.argv[1])
started, release = threading.Event(), threading.Event()

def blocked() -> int:
    started.set()
    release.wait(30)
    return store.store.append("parent", [note(0)]).last_seq

thread = threading.Thread(target=lambda: asyncio.run(store.call("parent", blocked)))
thread.start()
started.wait(30)

def in_child(main) -> None:
    pid = os.fork()
    if pid == 0:
        try:
            asyncio.run(asyncio.wait_for(main(), 30))  # a hang detector
        except BaseException as exc:
            print("child:", repr(exc), file=sys.stderr, flush=True)
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "a child failed"

async def writes_and_closes() -> None:
    await store.append("child", [note(1)])
    await store.close()

in_child(writes_and_closes)  # forked with the parent's call running

async def close_in_flight() -> None:
    try:
        await asyncio.wait_for(store.close(), 0.01)
    except asyncio.TimeoutError:
        pass

asyncio.run(close_in_flight())
in_child(store.close)  # forked with the parent's close in flight
release.set()
thread.join(30)
asyncio.run(asyncio.wait_for(store.close(), 30))
print("ok")
"""


def test_a_forked_child_calls_and_closes_its_async_store(case: EngineCase, url: str) -> None:
    """Attack: a child forked while the parent's AsyncSessionStore ran a call (and
    another while its close() was in flight) used the store: the parent's workers and
    closing thread do not exist in a child, so its calls, and its close(), waited
    forever. A child starts with workers, lanes and a closing of its own: it appends
    and closes, the parent's call and close finish, and both appends are read back."""
    if not case.processes:
        pytest.skip(f"the {case.name} engine is not shared across processes")
    done = subprocess.run(
        [sys.executable, "-c", _FORKS_OF_AN_ASYNC_STORE, url],
        capture_output=True,
        text=True,
        timeout=120,  # a hang detector, not a speed limit
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    with SessionStore(url) as store:
        assert summaries(store, "parent") == ["0"]
        assert summaries(store, "child") == ["1"]
