"""EventStoreSession: the OpenAI Agents SDK `Session` protocol over an eventstore log.

Proved against the SDK itself: its `Runner` with a fake model (no network), and the
SDK's own `SQLiteSession` as the reference for every sequence of protocol calls
(hypothesis). Attacked with retries after a committed append, pops racing across
processes, adds from several processes at once, and input that is not JSON.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import multiprocessing
import threading
import uuid
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from agents import Agent, Runner, set_tracing_disabled
from agents.items import ModelResponse, TResponseInputItem
from agents.memory import Session, SQLiteSession
from agents.models.interface import Model
from agents.usage import Usage
from conftest import same_value
from engines import ENGINES, EngineCase, after_each_read_of_the_end
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

from eventstore import (
    CorruptLogError,
    EventStoreError,
    HistoryUnavailableError,
    InvalidArgumentError,
    InvalidRecordError,
    NestingTooDeepError,
    SessionDeletedError,
    SessionStore,
    StorageError,
    StoreClosedError,
)
from eventstore.aio import AsyncSessionStore
from eventstore.engines.base import SeqEngine
from eventstore.engines.file.layout import SessionPaths
from eventstore.integrations import openai_agents as oa
from eventstore.integrations.openai_agents import (
    EventStoreSession,
    ItemsAdded,
)

T = TypeVar("T")
set_tracing_disabled(True)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def msg(text: str, role: str = "user") -> TResponseInputItem:
    return {"role": role, "content": text}  # type: ignore[return-value,misc]


def plain_store(root: Path | str) -> SessionStore:
    return SessionStore(root, event_types=oa.EVENT_TYPES, projections=oa.PROJECTIONS)


def adds(root: Path, sid: str) -> int:
    return sum(1 for e in plain_store(root).read_events(sid) if isinstance(e, ItemsAdded))


# -- the SDK's Runner with a fake model ------------------------------------------------


class CountingModel(Model):
    """Answers with how many user messages it was shown; remembers every input."""

    def __init__(self) -> None:
        self.inputs: list[list[Any]] = []

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        self.inputs.append(items)
        users = [i for i in items if i.get("role") == "user"]
        text = f"seen {len(users)} user messages, last: {users[-1]['content']}"
        out = ResponseOutputMessage(
            id=f"msg_{len(self.inputs)}",
            type="message",
            role="assistant",
            status="completed",
            content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
        )
        return ModelResponse(output=[out], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


def test_runner_keeps_the_conversation_across_turns_and_new_session_objects(tmp_path: Path) -> None:
    model = CountingModel()
    agent = Agent(name="echo", instructions="count", model=model)

    async def main() -> list[str]:
        outputs = []
        session = EventStoreSession("chat-1", tmp_path)
        assert isinstance(session, Session)  # the SDK's runtime-checkable protocol
        r1 = await Runner.run(agent, "hello", session=session)
        outputs.append(r1.final_output)
        r2 = await Runner.run(agent, "again", session=session)
        outputs.append(r2.final_output)
        await session.close()
        # a new object (another process, a restart) continues the same conversation
        later = EventStoreSession("chat-1", tmp_path)
        r3 = await Runner.run(agent, "third", session=later)
        outputs.append(r3.final_output)
        items = await later.get_items()
        assert [i.get("role") for i in items] == ["user", "assistant"] * 3
        await later.close()
        return outputs

    outputs = run(main())
    assert outputs == [
        "seen 1 user messages, last: hello",
        "seen 2 user messages, last: again",
        "seen 3 user messages, last: third",
    ]
    # the model was shown the history the session kept
    assert [i.get("content") for i in model.inputs[2] if i.get("role") == "user"] == [
        "hello",
        "again",
        "third",
    ]
    assert plain_store(tmp_path).verify("chat-1").ok


# -- the protocol, against the SDK's SQLiteSession --------------------------------------

ITEM = st.builds(
    msg,
    st.text(max_size=8),
    st.sampled_from(["user", "assistant", "system"]),
)
OP = st.one_of(
    st.tuples(st.just("add"), st.lists(ITEM, max_size=3)),
    st.tuples(st.just("pop"), st.none()),
    st.tuples(st.just("clear"), st.none()),
    st.tuples(st.just("get"), st.one_of(st.none(), st.integers(-2, 6))),
)
OPS = st.lists(OP, max_size=25)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
async def _same_answer(ours: EventStoreSession, ref: SQLiteSession, op: str, arg: Any) -> None:
    """One operation on both sessions: the same answer from each (the shared oracle of
    the properties below is `SQLiteSession` itself)."""
    if op == "add":
        await ours.add_items(list(arg))
        await ref.add_items(list(arg))
    elif op == "pop":
        assert await ours.pop_item() == await ref.pop_item()
    elif op == "clear":
        await ours.clear_session()
        await ref.clear_session()
    else:
        assert await ours.get_items(arg) == await ref.get_items(arg), (op, arg)


@given(ops=OPS, default_limit=st.one_of(st.none(), st.integers(0, 4)))
def test_every_call_answers_as_the_sdks_sqlite_session_does(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, Any]], default_limit: int | None
) -> None:
    root = tmp_path_factory.mktemp("agents")
    settings_ = {"limit": default_limit}

    async def main() -> None:
        ours = EventStoreSession("s", root, session_settings=settings_)
        ref = SQLiteSession("s", session_settings=settings_)
        for op, arg in ops:
            await _same_answer(ours, ref, op, arg)
        assert await ours.get_items() == await ref.get_items()
        await ours.close()
        ref.close()

    run(main())
    if plain_store(root).last_seq("s"):
        assert plain_store(root).verify("s").ok


def test_limit_semantics(tmp_path: Path) -> None:
    async def main() -> None:
        s = EventStoreSession("s", tmp_path, session_settings={"limit": 2})
        await s.add_items([msg(str(i)) for i in range(5)])
        assert [i["content"] for i in await s.get_items()] == ["3", "4"]  # type: ignore[typeddict-item]
        assert [i["content"] for i in await s.get_items(3)] == ["2", "3", "4"]  # type: ignore[typeddict-item]
        assert await s.get_items(0) == []
        assert len(await s.get_items(-1)) == 5
        assert len(await s.get_items(50)) == 5
        unlimited = EventStoreSession("s", tmp_path)
        assert len(await unlimited.get_items()) == 5
        assert await EventStoreSession("empty", tmp_path).get_items(3) == []

    run(main())


def test_pop_on_empty_returns_none_and_writes_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        s = EventStoreSession("s", tmp_path)
        assert await s.pop_item() is None
        await s.add_items([msg("a")])
        assert await s.pop_item() == msg("a")
        assert await s.pop_item() is None

    run(main())
    assert plain_store(tmp_path).last_seq("s") == 2  # the add and one pop


def test_pops_and_clears_are_events_and_the_history_stays_readable(tmp_path: Path) -> None:
    async def main() -> None:
        s = EventStoreSession("s", tmp_path)
        await s.add_items([msg("a"), msg("b", "assistant")])  # seq 1
        await s.add_items([msg("c")])  # seq 2
        assert await s.pop_item() == msg("c")  # seq 3
        await s.clear_session()  # seq 4
        await s.add_items([msg("d")])  # seq 5
        assert await s.get_items() == [msg("d")]
        assert await s.items_at(seq=2) == [msg("a"), msg("b", "assistant"), msg("c")]
        assert await s.items_at(seq=3) == [msg("a"), msg("b", "assistant")]
        assert await s.items_at(seq=4) == []
        assert await s.items_at() == [msg("d")]
        assert await EventStoreSession("never", tmp_path).items_at(seq=3) == []
        with pytest.raises(ValueError):
            await s.items_at(seq=1, at=__import__("datetime").datetime.now())

    run(main())
    store = plain_store(tmp_path)
    kinds = [type(e).__name__ for e in store.read_events("s")]
    assert kinds == ["ItemsAdded", "ItemsAdded", "ItemPopped", "SessionCleared", "ItemsAdded"]
    at = next(e for e in store.read_events("s") if e.seq == 3).ts

    async def after_compaction() -> None:
        store.compact("s", force=True)
        s = EventStoreSession("s", tmp_path)
        assert await s.get_items() == [msg("d")]
        assert await s.items_at(at=at) == [msg("a"), msg("b", "assistant")]

    run(after_compaction())
    assert plain_store(tmp_path).verify("s").ok


def test_a_retry_after_a_committed_append_does_not_append_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = plain_store(tmp_path)
    real_append = store.append
    fail_once = [True]

    def append_then_fail(*args: Any, **kwargs: Any) -> Any:
        result = real_append(*args, **kwargs)
        if fail_once[0] and kwargs.get("idempotency_key"):
            fail_once[0] = False
            raise StorageError("the acknowledgement was lost", None)
        return result

    monkeypatch.setattr(store, "append", append_then_fail)

    async def main() -> None:
        s = EventStoreSession("s", store)
        items = [msg("pay the invoice"), msg("ok", "assistant")]
        with pytest.raises(StorageError):
            await s.add_items(items)
        await s.add_items([dict(reversed(list(i.items()))) for i in items])  # type: ignore[misc]
        assert await s.get_items() == items  # once, though retried (keys in any order)
        await s.add_items(items)  # a real second add of the same items after a success
        assert await s.get_items() == items + items
        await s.close()

    run(main())
    assert adds(tmp_path, "s") == 2


def test_a_retry_after_a_cancelled_add_does_not_append_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = plain_store(tmp_path)
    real_append = store.append
    started = __import__("threading").Event()

    def slow_append(*args: Any, **kwargs: Any) -> Any:
        started.set()
        __import__("time").sleep(0.2)  # the caller gives up meanwhile; the append goes on
        return real_append(*args, **kwargs)

    monkeypatch.setattr(store, "append", slow_append)

    async def main() -> None:
        s = EventStoreSession("s", store)
        first = asyncio.ensure_future(s.add_items([msg("once")]))
        while not started.is_set():
            await asyncio.sleep(0.005)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await s.add_items([msg("once")])  # the retry runs after the cancelled call ended
        assert await s.get_items() == [msg("once")]
        await s.close()

    run(main())
    assert adds(tmp_path, "s") == 1


def test_a_failed_add_then_other_items_then_the_first_again_appends_each(tmp_path: Path) -> None:
    async def main() -> None:
        s = EventStoreSession("s", tmp_path)
        await s.add_items([msg("x")])
        await s.add_items([msg("y")])
        await s.add_items([msg("x")])
        assert [i["content"] for i in await s.get_items()] == ["x", "y", "x"]  # type: ignore[typeddict-item]

    run(main())


def test_two_session_objects_adding_the_same_items_both_count(tmp_path: Path) -> None:
    async def main() -> None:
        store = AsyncSessionStore(plain_store(tmp_path))
        a, b = EventStoreSession("s", store), EventStoreSession("s", store)
        await asyncio.gather(a.add_items([msg("yes")]), b.add_items([msg("yes")]))
        assert await a.get_items() == [msg("yes"), msg("yes")]
        await store.close()

    run(main())


def test_concurrent_adds_on_one_object_keep_submission_order(tmp_path: Path) -> None:
    async def main() -> None:
        s = EventStoreSession("s", tmp_path)
        await asyncio.gather(*(s.add_items([msg(str(i))]) for i in range(60)))
        await asyncio.gather(*(s.add_items([msg("same")]) for _ in range(3)))
        got = [i["content"] for i in await s.get_items()]  # type: ignore[typeddict-item]
        assert got == [str(i) for i in range(60)] + ["same"] * 3
        await s.close()

    run(main())


def test_input_that_is_not_json_is_refused_and_nothing_written(tmp_path: Path) -> None:
    async def main() -> None:
        s = EventStoreSession("s", tmp_path)
        with pytest.raises(InvalidRecordError, match=r"items\[1\]"):
            await s.add_items([msg("ok"), {"role": "user", "content": object()}])  # type: ignore[list-item,misc]
        with pytest.raises(InvalidRecordError):
            await s.add_items("not a list")  # type: ignore[arg-type]

    run(main())
    assert plain_store(tmp_path).last_seq("s") == 0


# keys the json module writes as names (SQLiteSession stores json.dumps(item)), with
# names some of them share ("true" and True, 1 and "1", two NaNs: "NaN")
ODD_KEY = st.one_of(
    st.booleans(),
    st.none(),
    st.floats(),
    st.integers(-2, 2),
    st.sampled_from(["true", "null", "1", "1.5", "NaN", "x"]),
)
ODD_KEYED = st.dictionaries(ODD_KEY, st.one_of(st.integers(), st.text(max_size=3)), max_size=4)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(extra=ODD_KEYED, nested=ODD_KEYED)
def test_attack_keys_that_are_not_str_read_back_as_sqlite_sessions_do(
    tmp_path: Path, extra: dict[Any, Any], nested: dict[Any, Any]
) -> None:
    """Attack: an item holding a dict keyed by True, None or a float was refused
    (InvalidRecordError) where `SQLiteSession` stores `json.dumps(item)` and reads it
    back with the keys as JSON names them. Now such an item reads back as
    SQLiteSession's does; one with two keys of one JSON name, of which SQLiteSession
    keeps only the last, is refused and nothing written."""
    item: Any = {"role": "user", "content": "x", "extra": extra, "deep": [{"d": nested}]}

    async def main() -> None:
        ours = EventStoreSession(f"s-{uuid.uuid4().hex}", tmp_path)
        ref = SQLiteSession("s")
        await ref.add_items([item])
        want = await ref.get_items()
        if len(want[0]["extra"]) < len(extra) or len(want[0]["deep"][0]["d"]) < len(nested):
            with pytest.raises(InvalidRecordError, match=r"items\[0\].*'"):  # names the key
                await ours.add_items([item])
            assert await ours.get_items() == []
        else:
            await ours.add_items([item])
            assert await ours.get_items() == want
            assert await EventStoreSession(ours.session_id, tmp_path).get_items() == want
        await ours.close()
        ref.close()

    run(main())


@pytest.mark.parametrize("levels", [300, 5000])
def test_an_item_nested_too_deep_is_a_typed_error_and_nothing_written(
    tmp_path: Path, levels: int
) -> None:
    """An item nesting past the log's depth limit is refused with NestingTooDeepError,
    nothing written, however deep (0.1.0: ~5000 deep, a bare RecursionError)."""
    deep: Any = "x"
    for _ in range(levels):
        deep = [deep]

    async def main() -> None:
        s = EventStoreSession("s", tmp_path)
        with pytest.raises(NestingTooDeepError):
            await s.add_items([msg("ok"), {"role": "user", "content": deep}])  # type: ignore[list-item]
        await s.close()

    run(main())
    assert plain_store(tmp_path).last_seq("s") == 0


def test_a_plainly_opened_store_learns_the_agents_events(tmp_path: Path) -> None:
    async def main() -> None:
        with SessionStore(tmp_path) as store:
            s = EventStoreSession("s", store)
            await s.add_items([msg("hi"), msg("there", "assistant")])
            assert await s.pop_item() == msg("there", "assistant")
            assert await s.get_items() == [msg("hi")]
            assert store.verify("s").problems == []

    run(main())


# -- several processes on one session ---------------------------------------------------


def _add_worker(root: str, worker: int, n: int, go: Any) -> None:
    go.wait()

    async def main() -> None:
        s = EventStoreSession("shared", root)
        for i in range(n):
            await s.add_items([msg(f"{worker}:{i}")])
        await s.close()

    asyncio.run(main())


def _pop_worker(root: str, n: int, out: Any, go: Any) -> None:
    go.wait()

    async def main() -> list[Any]:
        s = EventStoreSession("shared", root)
        popped = [await s.pop_item() for _ in range(n)]
        await s.close()
        return popped

    for item in asyncio.run(main()):
        out.put(item["content"] if item else None)


def test_adds_from_several_processes_all_land_in_each_ones_order(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    procs = [ctx.Process(target=_add_worker, args=(str(tmp_path), w, 15, go)) for w in range(4)]
    for p in procs:
        p.start()
    go.set()  # all at once
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    items = run(EventStoreSession("shared", tmp_path).get_items())
    contents = [str(i["content"]) for i in items]  # type: ignore[typeddict-item]
    assert len(contents) == 60
    for w in range(4):
        assert [c for c in contents if c.startswith(f"{w}:")] == [f"{w}:{i}" for i in range(15)]
    assert plain_store(tmp_path).verify("shared").ok


def test_pops_from_several_processes_never_pop_one_item_twice(tmp_path: Path) -> None:
    run(EventStoreSession("shared", tmp_path).add_items([msg(str(i)) for i in range(40)]))
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    go = ctx.Event()
    procs = [ctx.Process(target=_pop_worker, args=(str(tmp_path), 6, out, go)) for _ in range(4)]
    for p in procs:
        p.start()
    go.set()
    popped = [out.get(timeout=120) for _ in range(24)]
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert sorted(popped, key=int) == [str(i) for i in range(16, 40)]  # the newest 24, once each
    left = run(EventStoreSession("shared", tmp_path).get_items())
    assert [i["content"] for i in left] == [str(i) for i in range(16)]  # type: ignore[typeddict-item]
    assert plain_store(tmp_path).verify("shared").ok


def test_a_pop_judged_on_a_state_another_store_made_stale_pops_the_newest_item(
    tmp_path: Path,
) -> None:
    """Two stores on one session (two processes): the one that has folded the
    conversation pops with no read, so its state may be stale. An item the other added
    since is the one popped, and an emptied state that is stale does not answer None."""

    async def main() -> None:
        mine, theirs = plain_store(tmp_path), plain_store(tmp_path)
        a, b = EventStoreSession("s", mine), EventStoreSession("s", theirs)
        await a.add_items([msg("a")])
        assert await a.get_items() == [msg("a")]  # folded by `mine`: pops judge its state
        await b.add_items([msg("b")])
        assert await a.pop_item() == msg("b")
        assert oa.PROJECTION.name in mine.cache_info("s").folds
        assert await a.pop_item() == msg("a")
        await b.add_items([msg("c")])  # `mine` still holds an empty conversation
        assert await a.pop_item() == msg("c")
        assert await a.pop_item() is None
        assert await b.pop_item() is None
        await b.add_items([msg("d")])
        assert await b.pop_item() == msg("d")  # `theirs` never folded: read from the end

    run(main())
    kinds = [type(e).__name__ for e in plain_store(tmp_path).read_events("s")]
    assert (
        kinds
        == ["ItemsAdded", "ItemsAdded", "ItemPopped", "ItemPopped"]
        + [
            "ItemsAdded",
            "ItemPopped",
        ]
        * 2
    )


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(st.tuples(st.integers(0, 1), OP), max_size=16))
def test_two_stores_on_one_session_answer_as_one_sqlite_session(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[int, tuple[str, Any]]]
) -> None:
    """Calls from two stores on one session in any interleaving (each store's state
    stale whenever the other wrote last) answer as one `SQLiteSession` does."""
    root = tmp_path_factory.mktemp("agents-two")

    async def main() -> None:
        objs = [EventStoreSession("s", root) for _ in range(2)]  # each opens its store
        ref = SQLiteSession("s")
        for who, (op, arg) in ops:
            await _same_answer(objs[who], ref, op, arg)
        for ours in objs:
            assert await ours.get_items() == await ref.get_items()
            await ours.close()
        ref.close()

    run(main())


def test_a_cleared_conversation_compacted_without_archive_shrinks_to_its_snapshot(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        s = EventStoreSession("s", tmp_path)
        for i in range(50):
            await s.add_items([msg(f"{i} " + "words " * 100)])
        await s.clear_session()
        await s.close()

    run(main())
    store = plain_store(tmp_path)
    log = SessionPaths(tmp_path, "s").log
    before = log.stat().st_size
    store.compact("s", archive=False, force=True)
    assert log.stat().st_size < before / 10  # what stays: the newest idempotency keys
    assert run(EventStoreSession("s", tmp_path).get_items()) == []


def test_a_memory_url_store_works() -> None:
    async def main() -> list[TResponseInputItem]:
        s = EventStoreSession("chat", "memory://")
        await s.add_items([msg("a"), msg("b")])
        assert await s.pop_item() == msg("b")
        items = await s.get_items()
        await s.close()
        return items

    assert run(main()) == [msg("a")]


def test_items_and_events_are_not_tracked_by_the_gc(tmp_path: Path) -> None:
    """A cold load of a long conversation decodes thousands of them: tracked, they would
    wake the cyclic garbage collector, whose passes cost more than the fold."""
    import gc

    async def go() -> None:
        session = EventStoreSession("s", tmp_path)
        await session.add_items(
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
        )
        await session.pop_item()
        await session.clear_session()
        await session.close()

    asyncio.run(go())
    store = SessionStore(tmp_path, event_types=oa.EVENT_TYPES, projections=oa.PROJECTIONS)
    events = list(store.read_events("s"))
    assert {type(e) for e in events} == {oa.ItemsAdded, oa.ItemPopped, oa.SessionCleared}
    items = oa.PROJECTION.apply(oa.AgentItems(), events[0]).items
    assert len(items) == 2 and not any(gc.is_tracked(o) for o in [*events, *items])
    store.close()


# -- attacks -------------------------------------------------------------------------------


def _agents() -> Any:
    pytest.importorskip("agents")
    from eventstore.integrations import openai_agents

    return openai_agents


# SQLiteSession (the SDK's reference) stores json.dumps(item): NaN and infinities read
# back as themselves, and bytes, datetimes and sets are refused with TypeError
ODD_ITEMS = {
    "nan": {"role": "user", "content": "x", "score": float("nan")},
    "inf": {"role": "user", "content": "x", "score": float("inf")},
    "bytes": {"role": "user", "content": b"raw bytes"},
    "datetime": {"role": "user", "content": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)},
    "set": {"role": "user", "content": {"a"}},
}


@pytest.mark.parametrize("kind", sorted(ODD_ITEMS))
def test_agents_an_item_is_read_back_equal_or_refused(tmp_path: Path, kind: str) -> None:
    """README: EventStoreSession "answers the same" as SQLiteSession, and input that is
    not JSON is refused with InvalidRecordError and nothing written. An item is either
    read back equal or refused; never silently stored as another value."""
    oa = _agents()
    item = ODD_ITEMS[kind]

    async def main() -> list[Any] | None:
        s = oa.EventStoreSession("odd", tmp_path)
        try:
            try:
                await s.add_items([item])
            except InvalidRecordError:
                assert await s.get_items() == []  # refused: nothing written
                return None
            return list(await s.get_items())
        finally:
            await s.close()

    got = asyncio.run(main())
    if got is not None:
        assert len(got) == 1
        assert same_value(got[0], item), f"stored {item!r}, read back {got[0]!r}"


def test_agents_items_at_a_naive_time_is_a_typed_error(tmp_path: Path) -> None:
    """Guarantees: every error is an EventStoreError; `SessionStore.state_at(at=naive)`
    raises InvalidArgumentError. `items_at(at=naive)` must refuse the same way."""
    oa = _agents()

    async def main() -> None:
        s = oa.EventStoreSession("t", tmp_path)
        try:
            await s.add_items([{"role": "user", "content": "hi"}])
            with pytest.raises(EventStoreError):
                await s.items_at(at=dt.datetime(2026, 1, 1))  # no tzinfo
        finally:
            await s.close()

    asyncio.run(main())


# -- cold reads from the log's end (issue 34) -------------------------------------------

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 4)),
        st.tuples(st.sampled_from(["pop", "clear", "compact", "other"]), st.just(0)),
    ),
    max_size=14,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_OPS, n=st.integers(1, 6))
def test_a_fresh_stores_newest_items_and_pop_equal_the_fold(
    case: EngineCase, tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]], n: int
) -> None:
    """Adds, pops, clears, compactions and other events in any order, on every engine:
    a fresh store's `get_items(n)` (read from the log's end: by bytes on files, by seq
    on PostgreSQL and Redis) equals the newest n of the whole conversation, and its
    `pop_item` pops the newest item, leaving what a fold leaves."""
    root = case.fresh(tmp_path_factory.mktemp("agents-cold"))

    async def build() -> list[str]:
        s = EventStoreSession("s", root)
        k = 0
        for op, count in ops:
            if op == "add":
                await s.add_items([msg(f"i{k + j}") for j in range(count)])
                k += count
            elif op == "pop":
                await s.pop_item()
            elif op == "clear":
                await s.clear_session()
            elif op == "compact":
                if s.store.last_seq("s"):
                    s.store.compact("s", force=True)
            else:
                s.store.append_transcript_messages("s", [])  # another kind of event
        got = [i["content"] for i in await s.get_items()]  # type: ignore[typeddict-item]
        await s.close()
        return got

    whole = run(build())

    async def cold() -> tuple[list[str], Any, list[str]]:
        s = EventStoreSession("s", root)
        newest = [i["content"] for i in await s.get_items(n)]  # type: ignore[typeddict-item]
        await s.close()
        s = EventStoreSession("s", root)
        popped = await s.pop_item()
        await s.close()
        s = EventStoreSession("s", root)
        after = [i["content"] for i in await s.get_items()]  # type: ignore[typeddict-item]
        await s.close()
        return newest, popped, after

    newest, popped, after = run(cold())
    assert newest == whole[-n:]
    if whole:
        assert popped is not None and popped["content"] == whole[-1]  # type: ignore[index]
        assert after == whole[:-1]
    else:
        assert popped is None and after == []


def _agents_log(root: str, turns: int) -> None:
    async def build() -> None:
        s = EventStoreSession("s", root)
        for i in range(turns):
            await s.add_items([msg(f"q{i:04d}"), msg(f"a{i:04d}" + "x" * 200, "assistant")])
        await s.close()

    run(build())


def _edit(case: EngineCase, root: str, old: bytes, new: bytes) -> None:
    """Replace `old` by `new` in session "s"'s live log, bypassing every check."""
    store = plain_store(root)
    try:
        case.rewrite(store, "s", lambda b: b.replace(old, new))
    finally:
        store.close()


_EDITS = {
    # an item's text: the page that would return it
    "item": (b"q0049", b"q9999", 3, "pop_item"),
    # Attack: the newest item's line with its type made another word (its `h` kept):
    # `get_items(1)` passed over it unchecked, as a line of no type it reads, and
    # returned the item before it as the newest
    "type": (b'"agents_items_added","seq":50,', b'"agents_items_addex","seq":50,', 1, "all"),
}


@pytest.mark.parametrize("edit", list(_EDITS))
def test_a_cold_newest_page_never_returns_an_edited_item(
    case: EngineCase, url: str, edit: str
) -> None:
    """A line edited in the log, on every engine: a fresh store's `get_items(n)` (and
    `pop_item`, or the whole conversation) raise CorruptLogError as the fold does: every
    line a read from the end passes is checked against its link, never the edited item
    returned nor the edited line skipped."""
    old, new, n, then = _EDITS[edit]
    _agents_log(url, 50)
    _edit(case, url, old, new)
    with pytest.raises(CorruptLogError):
        run(EventStoreSession("s", url).get_items(n))
    with pytest.raises(CorruptLogError):
        session = EventStoreSession("s", url)
        run(session.pop_item() if then == "pop_item" else session.get_items())


def test_a_cold_newest_page_reads_only_the_logs_end(case: EngineCase, url: str) -> None:
    """A fresh store's `get_items(20)` of a 2,000-turn conversation reads the log from
    its end only, on every engine: an edit far before the newest items never reaches it
    (a full load, which folds the whole log, reports it)."""
    _agents_log(url, 2000)
    _edit(case, url, b"q0010", b"q9010")
    got = run(EventStoreSession("s", url).get_items(20))
    assert [i["content"][:5] for i in got] == [  # type: ignore[typeddict-item]
        f"{kind}{t:04d}" for t in range(1990, 2000) for kind in "qa"
    ]
    with pytest.raises(CorruptLogError):
        run(EventStoreSession("s", url).get_items())


class _Stopped(Exception):
    """A delete stopped between its fence and its erase (what a kill there leaves)."""


def test_a_cold_newest_page_of_a_deleted_unerased_session_is_empty(
    case: EngineCase, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a delete stopped before its erase leaves the tombstone ending the live
    log, the items before it. A fresh store's `get_items(n)` read them from the log's
    end (it looked for the conversation's lines only) on every engine, while `get_items()`
    (a fold) reads none: the scan now stops at a tombstone, and a pop writes nothing."""
    _agents_log(url, 5)
    store = plain_store(url)

    def stop(*args: object, **kw: object) -> object:
        raise _Stopped

    with monkeypatch.context() as m:
        m.setattr(store.engine, "install_snapshot", stop)
        with pytest.raises(_Stopped):
            store.delete_session("s")
    store.close()
    for n in (1, 3, 40):
        assert run(EventStoreSession("s", url).get_items(n)) == []
    assert run(EventStoreSession("s", url).get_items()) == []
    with pytest.raises(SessionDeletedError):
        run(EventStoreSession("s", url).pop_item())


_SEQ_CASES = [c for c in ENGINES if c.name in ("postgres", "redis")]


@pytest.mark.parametrize("seq_case", _SEQ_CASES, ids=[c.name for c in _SEQ_CASES])
def test_a_cold_newest_page_read_by_seq_never_mixes_two_logs(
    seq_case: EngineCase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an engine that reads lines by seq, in batches: the log replaced by another,
    valid one between two batches (a restore, a bad tool) gives the newest items of one
    log or the other, never some of each (each batch must chain to the one after it)."""
    url = seq_case.fresh(tmp_path)
    _agents_log(url, 100)
    other = plain_store(url)
    run(_add_turns(other, "t", 100))
    replacement: list[bytes] = []
    seq_case.rewrite(other, "t", lambda b: replacement.append(b) or b)
    store = plain_store(url)
    real = store.engine.tail  # type: ignore[attr-defined]
    reads: list[int] = []

    def tail(session_id: str, count: int) -> Any:
        head, got = real(session_id, count)  # the head and the first batch
        reads.append(len(got))
        seq_case.rewrite(other, "s", lambda b: replacement[0])  # before the second
        return head, got

    monkeypatch.setattr(store.engine, "tail", tail)
    got = [i["content"][:1] for i in run(EventStoreSession("s", store).get_items(60))]  # type: ignore[typeddict-item]
    store.close()
    other.close()
    assert reads and reads[0] < 30, "the page was read in one batch: the race was not run"
    assert got in (list("qa" * 30), list("QA" * 30))
    assert got == list("QA" * 30)  # (the read gave up and folded the log as it is now)


def test_a_cold_pop_never_lands_on_another_log_of_as_many_lines(
    case: EngineCase, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: between a cold `pop_item`'s read of the newest item and its append, the
    session's log is replaced by another of as many lines (deleted, restored and
    written again; a bad tool). The pop was appended at the seq it read alone: it took
    the other log's newest item out and returned the first log's, a mix of both. Now it
    appends only at the head it read (its `h` too), else judges the log as it is."""
    store = plain_store(url)
    for sid, p in (("s", "q"), ("t", "Q")):
        run(_add_turns_as(store, sid, p, 5))
    other: list[bytes] = []
    case.rewrite(store, "t", lambda b: other.append(b) or b)
    store.close()
    store = plain_store(url)
    replaced: list[bool] = []

    def replace() -> None:
        if not replaced:  # once, right after the pop's read
            replaced.append(True)
            case.rewrite(store, "s", lambda b: other[0])

    after_each_read_of_the_end(store, monkeypatch, replace)
    popped = run(EventStoreSession("s", store).pop_item())
    store.close()
    assert replaced, "the race was not run"
    after = [i["content"] for i in run(EventStoreSession("s", url).get_items())]  # type: ignore[typeddict-item]
    assert popped is not None and after == ["Q0", "Q1", "Q2", "Q3"]
    assert popped["content"] == "Q4"  # type: ignore[typeddict-item]


def test_a_cold_pop_reads_the_end_of_the_log_once_where_lines_are_read_by_seq(
    case: EngineCase, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack (a round trip): on PostgreSQL and Redis a cold `pop_item` read the log's
    newest lines with its head, then the head and its line again (`tail(1)`) for the
    first write's lifecycle state. The first read holds that line with that head: the
    state is judged from it (the append stays conditional on that head), one read."""
    store = plain_store(url)
    if not isinstance(store.engine, SeqEngine):
        store.close()
        pytest.skip("the engine reads byte ranges: no read of lines by seq")
    run(_add_turns_as(store, "s", "q", 5))
    store.close()
    store = plain_store(url)
    engine: Any = store.engine
    real_tail, tails = engine.tail, []

    def tail(session_id: str, count: int) -> Any:
        tails.append(count)
        return real_tail(session_id, count)

    monkeypatch.setattr(engine, "tail", tail)
    popped = run(EventStoreSession("s", store).pop_item())
    store.close()
    assert popped is not None and popped["content"] == "q4"  # type: ignore[typeddict-item]
    assert len(tails) == 1, tails
    after = [i["content"] for i in run(EventStoreSession("s", url).get_items())]  # type: ignore[typeddict-item]
    assert after == ["q0", "q1", "q2", "q3"]


@pytest.mark.parametrize("then", ["deleted", "added"])
def test_a_cold_pop_judged_on_its_read_of_the_end_lands_only_at_that_head(
    case: EngineCase, url: str, then: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Coverage (held): another store deletes the session, or adds an item, right after a
    cold `pop_item`'s one read of the log's end (whose head line judges the lifecycle
    state on PostgreSQL and Redis). The pop raises SessionDeletedError with the
    tombstone still ending the log, or pops the item added, on every engine."""
    store = plain_store(url)
    run(_add_turns_as(store, "s", "q", 3))
    store.close()
    store = plain_store(url)
    raced: list[int] = []

    def race() -> None:
        if not raced:  # once, right after the pop's read
            with plain_store(url) as other:
                if then == "deleted":
                    other.delete_session("s")
                else:
                    run(_add_turns_as(other, "s", "late", 1))
                raced.append(other.last_seq("s"))

    after_each_read_of_the_end(store, monkeypatch, race)
    if then == "deleted":
        with pytest.raises(SessionDeletedError):
            run(EventStoreSession("s", store).pop_item())
    else:
        popped = run(EventStoreSession("s", store).pop_item())
        assert popped is not None and popped["content"] == "late0"  # type: ignore[typeddict-item]
    store.close()
    assert raced, "the race was not run"
    with plain_store(url) as plain:
        if then == "deleted":
            assert plain.last_seq("s") == raced[0] and plain.tombstone_of("s") is not None
        else:
            assert plain.last_seq("s") == raced[0] + 1  # the pop, after the add
    if then == "added":
        after = [i["content"] for i in run(EventStoreSession("s", url).get_items())]  # type: ignore[typeddict-item]
        assert after == ["q0", "q1", "q2"]


async def _add_turns_as(store: SessionStore, sid: str, prefix: str, turns: int) -> None:
    s = EventStoreSession(sid, store)
    for i in range(turns):
        await s.add_items([msg(f"{prefix}{i}")])
    await s.close()


async def _add_turns(store: SessionStore, sid: str, turns: int) -> None:
    s = EventStoreSession(sid, store)
    for i in range(turns):
        await s.add_items([msg(f"Q{i:04d}"), msg(f"A{i:04d}", "assistant")])
    await s.close()


# -- attacks: limits that are no int ----------------------------------------------------

_BAD_LIMIT = st.one_of(st.floats(), st.text(max_size=3), st.binary(max_size=2))


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(limit=_BAD_LIMIT)
def test_a_limit_that_is_no_int_is_refused_warm_or_cold(url: str, limit: Any) -> None:
    """Attack: `get_items(2.5)` answered the newest 3 items on a store that had not folded
    the conversation (read from the log's end) and raised a bare TypeError ("slice
    indices must be integers") on one that had: one call, two answers. A limit that is
    no int is now InvalidArgumentError, before any read, warm or cold, on every engine
    (`SQLiteSession` refuses 2.5 too; it takes 2.0 as 2, by its SQL: a documented
    difference)."""
    sid = uuid.uuid4().hex  # a session of its own per example

    async def main() -> None:
        warm = EventStoreSession(sid, url)
        await warm.add_items([msg(str(i)) for i in range(5)])
        assert len(await warm.get_items()) == 5  # folded: a limit slices the state
        cold = EventStoreSession(sid, url)
        for session in (warm, cold):
            with pytest.raises(InvalidArgumentError):
                await session.get_items(limit)
            await session.close()

    run(main())


def test_items_at_history_compacted_away_is_an_error_never_a_wrong_conversation(
    url: str,
) -> None:
    """Attack: `items_at` folded whatever `read_events` gave. After a compaction without
    an archive, `items_at(seq=2)` and `items_at(at=<the time of event 2>)` answered `[]`
    (the conversation was ["a", "b"]), `items_at(seq=9)` of a 4-event log answered the
    current conversation and `items_at(seq=-1)` answered `[]`, where
    `SessionStore.transcript_at` raises. It now replays as the store does, on every
    engine: HistoryUnavailableError for history that is gone or not written yet,
    InvalidArgumentError for a bad seq (and for seq with at)."""

    async def main() -> None:
        s = EventStoreSession("s", url)
        for text in "abc":
            await s.add_items([msg(text)])
        at_two = next(e.ts for e in s.store.read_events("s") if e.seq == 2)
        assert await s.items_at(at=at_two) == [msg("a"), msg("b")]  # all history kept
        s.store.compact("s", archive=False, force=True)
        await s.add_items([msg("d")])
        for gone in ({"seq": 2}, {"at": at_two}, {"seq": 9}):
            with pytest.raises(HistoryUnavailableError):
                await s.items_at(**gone)
        for bad in ({"seq": -1}, {"seq": 1, "at": at_two}):
            with pytest.raises(InvalidArgumentError):
                await s.items_at(**bad)
        assert await s.items_at(seq=3) == [msg(t) for t in "abc"]  # the snapshot's own
        assert await s.items_at() == [msg(t) for t in "abcd"]
        await s.close()

    run(main())


def test_two_cancelled_adds_of_the_same_items_retried_append_them_twice_not_thrice(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: two `add_items` of the same items on one session object, both cancelled
    (a task group torn down): the first while its append ran (committed), the second
    while it waited behind it (never ran). The object kept one key per fingerprint, so
    the second's key replaced the first's: the first retry appended under the unused
    key and the second under a new one, three copies for two adds. Every unacknowledged
    key is kept now, each retry takes one: two copies, on every engine."""
    store = plain_store(url)
    real_append = store.append
    started, release = threading.Event(), threading.Event()

    def held_append(*args: Any, **kwargs: Any) -> Any:
        started.set()
        release.wait(10)
        return real_append(*args, **kwargs)

    monkeypatch.setattr(store, "append", held_append)

    async def main() -> None:
        s = EventStoreSession("s", store)
        tasks = [asyncio.ensure_future(s.add_items([msg("yes")])) for _ in range(2)]
        while not started.is_set():
            await asyncio.sleep(0.005)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        release.set()
        for _ in tasks:  # one retry per attempt whose outcome was never seen
            await s.add_items([msg("yes")])
        assert await s.get_items() == [msg("yes")] * 2
        await s.close()

    run(main())
    store.close()


def test_a_closed_session_refuses_every_add_the_empty_one_too(url: str) -> None:
    """Attack: after `close()`, every call raised StoreClosedError but `add_items([])`,
    which returned as if it had worked. The SDK's `SQLiteSession` checks for a closed
    session before its empty-list fast path (its comment says why: it "would otherwise
    return successfully on a closed session"); this one now does too, on every engine."""

    async def main() -> None:
        s = EventStoreSession("s", url)
        await s.add_items([msg("a")])
        await s.close()
        for call in (lambda: s.add_items([]), lambda: s.add_items([msg("b")]), s.get_items):
            with pytest.raises(StoreClosedError):
                await call()

    run(main())
    with plain_store(url) as store:
        assert [e.seq for e in store.read_events("s")] == [1]
