"""The Google ADK session service (eventstore.integrations.google_adk).

The contract section states ADK's session-service contract as ADK's own tests state it
for every backend (tests/unittests/sessions/test_session_service.py of adk-python,
Apache-2.0: written here afresh from what those tests check, not copied), plus the
stale-writer and re-delivered-event cases (adk-python #5723); it runs on a directory,
`memory://`, PostgreSQL (when EVENTSTORE_TEST_POSTGRES_URL is set) and over an open
`SessionStore`. Then what eventstore adds: app and user state copied after a crash,
reads that cost what they return, and bad input."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from conftest import cli_in_process, run_threads
from engines import EngineCase
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import lone_surrogated

pytest.importorskip("google.adk")

from google.adk.errors import StaleSessionError  # noqa: E402
from google.adk.errors.already_exists_error import AlreadyExistsError  # noqa: E402
from google.adk.errors.session_not_found_error import SessionNotFoundError  # noqa: E402
from google.adk.events.event import Event  # noqa: E402
from google.adk.events.event_actions import EventActions  # noqa: E402
from google.adk.sessions.base_session_service import GetSessionConfig  # noqa: E402
from google.adk.sessions.in_memory_session_service import InMemorySessionService  # noqa: E402
from google.genai import types  # noqa: E402

from eventstore import (  # noqa: E402
    EventStoreError,
    InvalidArgumentError,
    InvalidRecordError,
    SessionStore,
    StorageError,
)
from eventstore.integrations.google_adk import (  # noqa: E402
    EventStoreSessionService,
    session_id_of,
)
from eventstore.integrations.google_adk_state import StateDelta  # noqa: E402

T = TypeVar("T")
APP, USER = "my_app", "user"


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture(params=["url", "open store"])
def service(request: pytest.FixtureRequest, case: EngineCase, tmp_path: Path) -> Iterator[Any]:
    """A service on a fresh store of each engine, from its URL or over an open store."""
    url = case.fresh(tmp_path)
    if request.param == "url":
        svc = EventStoreSessionService(url)
        yield svc
        run(svc.close())
    else:
        with SessionStore(url) as store:
            yield EventStoreSessionService(store)


def text_event(text: str = "text", **kw: Any) -> Event:
    return Event(
        invocation_id="invocation",
        author="user",
        content=types.Content(role="user", parts=[types.Part(text=text)]),
        **kw,
    )


# -- ADK's session-service contract -------------------------------------------------------


def test_contract_get_of_an_unknown_session_is_none(service: Any) -> None:
    assert run(service.get_session(app_name=APP, user_id=USER, session_id="123")) is None


def test_contract_create_get_delete(service: Any) -> None:
    async def main() -> None:
        s = await service.create_session(app_name=APP, user_id=USER, state={"key": "value"})
        assert (s.app_name, s.user_id, s.state) == (APP, USER, {"key": "value"}) and s.id
        assert await service.get_session(app_name=APP, user_id=USER, session_id=s.id) == s
        await service.delete_session(app_name=APP, user_id=USER, session_id=s.id)
        assert await service.get_session(app_name=APP, user_id=USER, session_id=s.id) is None
        listed = await service.list_sessions(app_name=APP, user_id=USER)
        assert listed.sessions == []

    run(main())


def test_contract_list_sessions_in_creation_order(service: Any) -> None:
    async def main() -> None:
        ids = [f"session{i}" for i in range(5)]
        for sid in ids:
            await service.create_session(app_name=APP, user_id=USER, session_id=sid)
        await service.create_session(app_name=APP, user_id="other", session_id="x")
        listed = (await service.list_sessions(app_name=APP, user_id=USER)).sessions
        assert [s.id for s in listed] == ids and all(not s.events for s in listed)
        everyone = (await service.list_sessions(app_name=APP)).sessions
        assert sorted(s.id for s in everyone) == sorted([*ids, "x"])
        assert (await service.list_sessions(app_name="another")).sessions == []

    run(main())


def test_contract_app_user_and_temp_state(service: Any) -> None:
    async def main() -> None:
        s11 = await service.create_session(
            app_name=APP, user_id="user1", state={"key11": "value11"}, session_id="session11"
        )
        await service.create_session(
            app_name=APP, user_id="user1", state={"key12": "value12"}, session_id="session12"
        )
        await service.create_session(app_name=APP, user_id="user2", session_id="session2")
        delta = {"app:key": "value", "user:key1": "value1", "temp:key": "temp"}
        event = text_event(actions=EventActions(state_delta={**delta, "key11": "value11_new"}))
        await service.append_event(session=s11, event=event)
        assert s11.state["app:key"] == "value" and s11.state["user:key1"] == "value1"
        assert s11.state["key11"] == "value11_new"
        s12 = await service.get_session(app_name=APP, user_id="user1", session_id="session12")
        assert s12.state == {"app:key": "value", "user:key1": "value1", "key12": "value12"}
        s2 = await service.get_session(app_name=APP, user_id="user2", session_id="session2")
        assert s2.state == {"app:key": "value"}  # another user's state is not visible
        again = await service.get_session(app_name=APP, user_id="user1", session_id="session11")
        assert again.state == {
            "app:key": "value",
            "user:key1": "value1",
            "key11": "value11_new",
        }
        assert "temp:key" not in again.events[0].actions.state_delta
        assert await service.get_user_state(app_name=APP, user_id="user1") == {"key1": "value1"}
        assert await service.get_user_state(app_name=APP, user_id="user2") == {}

    run(main())


def test_contract_a_new_session_merges_the_stored_app_and_user_state(service: Any) -> None:
    async def main() -> None:
        s1 = await service.create_session(
            app_name=APP, user_id=USER, state={"key1": "value1"}, session_id="session1"
        )
        delta = {"app:key": "value", "user:key1": "value1", "temp:key": "temp"}
        await service.append_event(s1, text_event(actions=EventActions(state_delta=delta)))
        s2 = await service.create_session(
            app_name=APP, user_id=USER, state={}, session_id="session2"
        )
        assert s2.state == {"app:key": "value", "user:key1": "value1"}

    run(main())


def test_contract_events_round_trip_bytes_and_every_field(service: Any) -> None:
    async def main() -> None:
        s = await service.create_session(app_name=APP, user_id=USER)
        content = types.Content(
            role="user",
            parts=[types.Part.from_bytes(data=b"test_image_data", mime_type="image/png")],
        )
        grounding = types.GroundingMetadata(
            search_entry_point=types.SearchEntryPoint(sdk_blob=b"test_sdk_blob")
        )
        await service.append_event(
            s,
            Event(invocation_id="i", author="user", content=content, grounding_metadata=grounding),
        )
        await service.append_event(
            s,
            text_event(
                "test_text",
                turn_complete=True,
                partial=False,
                actions=EventActions(
                    artifact_delta={"file": 0}, transfer_to_agent="agent", escalate=True
                ),
                long_running_tool_ids={"tool1"},
                error_code="error_code",
                error_message="error_message",
                interrupted=True,
            ),
        )
        got = await service.get_session(app_name=APP, user_id=USER, session_id=s.id)
        assert got == s
        assert got.events[0].content == content
        assert got.events[0].grounding_metadata == grounding

    run(main())


def test_contract_get_session_config(service: Any) -> None:
    async def main() -> None:
        s = await service.create_session(app_name=APP, user_id=USER)
        for i in range(1, 6):
            await service.append_event(s, Event(author="user", timestamp=i))

        async def times(**config: Any) -> list[float]:
            got = await service.get_session(
                app_name=APP, user_id=USER, session_id=s.id, config=GetSessionConfig(**config)
            )
            return [e.timestamp for e in got.events]

        assert await times() == [1, 2, 3, 4, 5]
        assert await times(num_recent_events=3) == [3, 4, 5]
        assert await times(num_recent_events=0) == []
        assert await times(after_timestamp=4.0) == [4, 5]
        assert await times(after_timestamp=50) == []
        assert await times(after_timestamp=4.0, num_recent_events=3) == [4, 5]
        assert await times(after_timestamp=2.0, num_recent_events=2) == [4, 5]

    run(main())


def test_contract_a_stale_writer_gets_adks_error_and_writes_nothing(service: Any) -> None:
    async def main() -> None:
        s = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        old = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        await service.append_event(s, text_event("first", timestamp=s.last_update_time + 1))
        with pytest.raises(StaleSessionError) as err:
            await service.append_event(old, text_event("late", timestamp=old.last_update_time + 2))
        assert isinstance(err.value, EventStoreError)
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert [e.content.parts[0].text for e in got.events] == ["first"]

    run(main())


def test_contract_a_redelivered_event_writes_nothing(service: Any) -> None:
    async def main() -> None:
        s = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        event = text_event("once", actions=EventActions(state_delta={"n": 1}))
        await service.append_event(s, event)
        await service.append_event(s, event)
        copy = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        await service.append_event(copy, event.model_copy())
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert [e.id for e in got.events] == [event.id] and got == s

    run(main())


def test_contract_create_of_an_existing_id_and_append_to_a_missing_session(
    service: Any,
) -> None:
    async def main() -> None:
        s = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        with pytest.raises(AlreadyExistsError):
            await service.create_session(app_name=APP, user_id=USER, session_id="s")
        await service.create_session(app_name=APP, user_id="other", session_id="s")  # theirs
        await service.delete_session(app_name=APP, user_id=USER, session_id="s")
        with pytest.raises(SessionNotFoundError):
            await service.append_event(s, text_event())
        again = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        assert again.events == [] and again.id == "s"

    run(main())


# -- what eventstore adds -----------------------------------------------------------------


def test_a_delta_a_crash_left_uncopied_is_read_and_then_copied(tmp_path: Path) -> None:
    """A writer that appended an event (its deltas with it) and died before copying the
    app and user deltas: the session's reads show them at once (a read writes nothing),
    and its next append copies them, so other sessions and get_user_state see them."""
    root = tmp_path / "store"

    async def main() -> None:
        service = EventStoreSessionService(root)
        s = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        other = await service.create_session(app_name=APP, user_id=USER, session_id="o")
        sid = session_id_of(APP, USER, "s")
        crashed = StateDelta(
            event_id="lost", timestamp=s.last_update_time + 1, app={"a": 1}, user={"u": 2}
        )
        service.store.append(sid, [crashed])  # the append, without its copies
        seq = service.store.last_seq(sid)
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got.state == {"app:a": 1, "user:u": 2}
        assert service.store.last_seq(sid) == seq  # the read wrote nothing
        assert await service.get_user_state(app_name=APP, user_id=USER) == {}
        await service.append_event(got, text_event(timestamp=got.last_update_time + 1))
        assert await service.get_user_state(app_name=APP, user_id=USER) == {"u": 2}
        o = await service.get_session(app_name=APP, user_id=USER, session_id=other.id)
        assert o.state == {"app:a": 1, "user:u": 2}
        await service.close()

    run(main())


def test_the_newest_value_by_event_time_wins_across_sessions(tmp_path: Path) -> None:
    async def main() -> None:
        service = EventStoreSessionService(tmp_path / "store")
        a = await service.create_session(app_name=APP, user_id=USER, session_id="a")
        b = await service.create_session(app_name=APP, user_id=USER, session_id="b")
        t = a.last_update_time
        await service.append_event(
            b, text_event(timestamp=t + 2, actions=EventActions(state_delta={"app:k": "new"}))
        )
        await service.append_event(
            a, text_event(timestamp=t + 1, actions=EventActions(state_delta={"app:k": "old"}))
        )
        got = await service.get_session(app_name=APP, user_id=USER, session_id="a")
        assert got.state["app:k"] == "new"
        await service.close()

    run(main())


def test_get_session_pages_read_only_what_they_return(tmp_path: Path) -> None:
    """num_recent_events reads the newest events through the transcript's paging: the
    events come back equal from a cold store, the newest N in order."""
    root = tmp_path / "store"

    async def fill() -> list[str]:
        service = EventStoreSessionService(root)
        s = await service.create_session(app_name=APP, user_id=USER, session_id="long")
        ids = []
        for i in range(200):
            e = text_event(f"m{i}", timestamp=s.last_update_time + i + 1)
            await service.append_event(s, e)
            ids.append(e.id)
        await service.close()
        return ids

    async def read() -> None:
        service = EventStoreSessionService(root)  # cold
        got = await service.get_session(
            app_name=APP,
            user_id=USER,
            session_id="long",
            config=GetSessionConfig(num_recent_events=20),
        )
        assert [e.id for e in got.events] == ids[-20:]
        sid = session_id_of(APP, USER, "long")
        assert "transcript" not in service.store.cache_info(sid).folds  # no full fold
        await service.close()

    ids = run(fill())
    run(read())


def test_bad_ids_are_typed_errors_and_write_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        service = EventStoreSessionService(tmp_path / "store")
        for bad in ({"app_name": "", "user_id": "u"}, {"app_name": "a", "user_id": 7}):
            with pytest.raises(InvalidArgumentError):
                await service.create_session(**bad)
        with pytest.raises(InvalidArgumentError):
            await service.create_session(app_name="a", user_id="u", state=["not a dict"])
        with pytest.raises(InvalidArgumentError):
            await service.create_session(app_name="a", user_id="u", session_id=7)
        with pytest.raises(InvalidRecordError):
            await service.create_session(app_name="a", user_id="u", state={"k": object()})
        with pytest.raises(InvalidArgumentError):
            await service.list_sessions(app_name="")
        assert service.store.list_sessions() == []
        await service.close()

    run(main())


def test_attack_an_id_too_long_for_the_store_lists_nothing(url: str) -> None:
    """Attack: a session id whose eventstore id is over the 1,024-byte limit (`é` is
    six bytes percent-encoded) failed only at the session's append, after its app index
    had listed it: `list_sessions` of the app then raised on every call. Now the id is
    refused before anything is written, and the app still lists."""

    async def main() -> None:
        service = EventStoreSessionService(url)
        await service.create_session(app_name=APP, user_id=USER, session_id="ok")
        seq = service.store.last_seq(f"adk-app.{APP}")
        with pytest.raises(EventStoreError):
            await service.create_session(app_name=APP, user_id=USER, session_id="é" * 200)
        assert service.store.last_seq(f"adk-app.{APP}") == seq  # nothing written
        listed = await service.list_sessions(app_name=APP)
        assert [s.id for s in listed.sessions] == ["ok"]
        await service.close()

    run(main())


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(bad=lone_surrogated, field=st.sampled_from(["app_name", "user_id", "session_id"]))
def test_attack_a_lone_surrogate_in_an_id_is_a_typed_error(url: str, bad: str, field: str) -> None:
    """Attack: an app name, user id or session id holding a lone surrogate raised a bare
    `UnicodeEncodeError` from every call (percent-encoding it for the session id). Now
    each call raises `InvalidArgumentError` and writes nothing."""
    ids = {"app_name": APP, "user_id": USER, "session_id": "s", field: bad}

    async def main() -> None:
        service = EventStoreSessionService(url)
        calls: list[Callable[[], Coroutine[Any, Any, Any]]] = [
            lambda: service.create_session(**ids),
            lambda: service.get_session(**ids),
            lambda: service.delete_session(**ids),
        ]
        if field != "session_id":
            calls += [
                lambda: service.get_user_state(app_name=ids["app_name"], user_id=ids["user_id"]),
                lambda: service.list_sessions(app_name=ids["app_name"], user_id=ids["user_id"]),
            ]
        for call in calls:
            with pytest.raises(InvalidArgumentError):
                await call()
        assert service.store.list_sessions() == []
        await service.close()

    run(main())


PADDING = st.text(alphabet=" \t\n\r\x0b\x0c\u00a0\u2003", max_size=3)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(left=PADDING, right=PADDING)
def test_attack_session_ids_are_stripped_by_every_call_as_adk_strips_them(
    url: str, left: str, right: str
) -> None:
    """Attack: `create_session` stripped its id but `get_session` and `delete_session`
    did not (a padded id read None and deleted nothing), and a whitespace-only id was
    refused where ADK's InMemorySessionService makes a new id. Now every call strips
    the id as ADK's does (blank: get None, delete nothing), answering as it answers."""
    padded, blank = f"{left}s{right}", left + right

    async def script(service: Any, app: str) -> list[Any]:
        made = await service.create_session(app_name=app, user_id=USER, session_id=padded)
        got = await service.get_session(app_name=app, user_id=USER, session_id=padded)
        new = await service.create_session(app_name=app, user_id=USER, session_id=blank)
        answers = [made.id, got.id if got else None, bool(new.id.strip()) and new.id != "s"]
        answers.append(await service.get_session(app_name=app, user_id=USER, session_id=blank))
        await service.delete_session(app_name=app, user_id=USER, session_id=blank)
        await service.delete_session(app_name=app, user_id=USER, session_id=padded)
        answers.append(await service.get_session(app_name=app, user_id=USER, session_id="s"))
        listed = await service.list_sessions(app_name=app, user_id=USER)
        return [*answers, [s.id == new.id for s in listed.sessions]]

    async def main() -> None:
        service = EventStoreSessionService(url)
        app = f"app-{uuid.uuid4().hex}"  # one app per example: the examples share the store
        assert await script(service, app) == await script(InMemorySessionService(), app)
        await service.close()

    run(main())


def test_attack_a_session_created_again_after_a_delete_shares_its_state(url: str) -> None:
    """Attack: the app and user logs knew how far each session's deltas were copied by
    its id and seq alone; a deleted id created again starts its seqs over, so its
    initial `app:`/`user:` state (and its first deltas) counted as copied and were lost:
    not in the session it returned, nor in any other, nor in `get_user_state`. Now each
    creation's copies are its own, and the answers equal ADK's InMemorySessionService."""

    async def script(service: Any) -> list[Any]:
        s = await service.create_session(
            app_name=APP, user_id=USER, session_id="s", state={"app:x": 1}
        )
        for i in range(3):
            delta = {"app:y": i, "user:z": i}
            await service.append_event(s, text_event(actions=EventActions(state_delta=delta)))
        await service.delete_session(app_name=APP, user_id=USER, session_id="s")
        again = await service.create_session(
            app_name=APP, user_id=USER, session_id="s", state={"app:x": 9, "user:w": 5}
        )
        delta = {"app:y": "new", "user:z": "new"}
        await service.append_event(again, text_event(actions=EventActions(state_delta=delta)))
        other = await service.create_session(app_name=APP, user_id=USER, session_id="o")
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        user = await service.get_user_state(app_name=APP, user_id=USER)
        return [again.state, other.state, got.state, user]

    async def main() -> None:
        service = EventStoreSessionService(url)
        assert await script(service) == await script(InMemorySessionService())
        await service.close()

    run(main())


def test_attack_a_retry_of_an_append_whose_copies_failed_completes_them(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: an append_event whose event was stored but whose copy to the user's and
    app's logs failed (an engine error) raised; its retry (the same event) found the
    event stored and returned at once, so the copies were never made: the user's state
    and the app's other sessions never saw its deltas. Now the retry completes them
    and writes nothing to the session."""

    async def main() -> None:
        with SessionStore(url) as store:
            service = EventStoreSessionService(store)
            s = await service.create_session(app_name=APP, user_id=USER, session_id="s")
            await service.create_session(app_name=APP, user_id=USER, session_id="o")
            real = store.engine.append

            def failing(sid: str, *args: Any, **kw: Any) -> Any:
                if sid.startswith(("adk-app.", "adk-user.")):
                    raise StorageError("injected: the shared logs are unreachable")
                return real(sid, *args, **kw)

            event = text_event(actions=EventActions(state_delta={"user:u": 1, "app:a": 2}))
            monkeypatch.setattr(store.engine, "append", failing)
            with pytest.raises(StorageError):
                await service.append_event(s, event)
            monkeypatch.setattr(store.engine, "append", real)
            seq = store.last_seq(session_id_of(APP, USER, "s"))
            await service.append_event(s, event)  # the caller's retry
            assert store.last_seq(session_id_of(APP, USER, "s")) == seq
            assert await service.get_user_state(app_name=APP, user_id=USER) == {"u": 1}
            o = await service.get_session(app_name=APP, user_id=USER, session_id="o")
            assert o is not None and o.state == {"user:u": 1, "app:a": 2}

    run(main())


def test_attack_a_create_racing_a_delete_of_its_id_stays_listed(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: another writer created the id again between `delete_session`'s delete and
    its unlisting (its listing step found the id listed and wrote nothing): the unlisting
    then landed after the creation, and the live session was left out of
    `list_sessions` for good. Now the delete lists it again when it finds it created,
    and a create over a deleted id lists it again after its append."""

    async def main() -> None:
        with SessionStore(url) as one, SessionStore(url) as two:
            deleter, creator = EventStoreSessionService(one), EventStoreSessionService(two)
            await deleter.create_session(app_name=APP, user_id=USER, session_id="s")
            real = one.engine.append
            raced: list[str] = []

            def create_first(sid: str, *args: Any, **kw: Any) -> Any:
                if sid == f"adk-app.{APP}" and not raced:  # the unlisting's append
                    raced.append(sid)
                    run(creator.create_session(app_name=APP, user_id=USER, session_id="s"))
                return real(sid, *args, **kw)

            monkeypatch.setattr(one.engine, "append", create_first)
            await deleter.delete_session(app_name=APP, user_id=USER, session_id="s")
            assert raced
            for service in (deleter, creator):
                got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
                listed = await service.list_sessions(app_name=APP, user_id=USER)
                assert got is not None and [x.id for x in listed.sessions] == ["s"]

    run(main())


@pytest.mark.parametrize("before", ["created", "a create that crashed after its listing"])
def test_attack_a_create_whose_append_lands_after_a_delete_finished_stays_listed(
    url: str, monkeypatch: pytest.MonkeyPatch, before: str
) -> None:
    """Attack: another writer's create of the id being deleted found it listed (before
    the delete's unlisting), and its append landed after the delete had finished,
    unlisting and all: the live session was left out of `list_sessions` for good. Now
    a create over a deleted id lists it again after its append, and a delete that
    deleted nothing (the id listed by a create that crashed) unlists nothing."""

    async def main() -> None:
        with SessionStore(url) as one, SessionStore(url) as two:
            deleter, creator = EventStoreSessionService(one), EventStoreSessionService(two)
            sid = session_id_of(APP, USER, "s")
            real_one, real_two = one.engine.append, two.engine.append
            if before == "created":
                await deleter.create_session(app_name=APP, user_id=USER, session_id="s")
            else:

                def crash(s: str, *args: Any, **kw: Any) -> Any:
                    if s == sid:
                        raise StorageError("injected: a crash after the listing")
                    return real_one(s, *args, **kw)

                monkeypatch.setattr(one.engine, "append", crash)
                with pytest.raises(StorageError):
                    await deleter.create_session(app_name=APP, user_id=USER, session_id="s")
            creating, deleted = threading.Event(), threading.Event()
            creator_thread: list[threading.Thread] = []

            def create() -> None:
                run(creator.create_session(app_name=APP, user_id=USER, session_id="s"))

            def unlist_after_the_creators_listing(s: str, *args: Any, **kw: Any) -> Any:
                if s == f"adk-app.{APP}" and not creator_thread:
                    creator_thread.append(threading.Thread(target=create))
                    creator_thread[0].start()
                    assert creating.wait(30)  # listed (found listed) and restored
                return real_one(s, *args, **kw)

            def append_after_the_delete(s: str, *args: Any, **kw: Any) -> Any:
                if s == sid:
                    creating.set()
                    assert deleted.wait(30)
                return real_two(s, *args, **kw)

            monkeypatch.setattr(one.engine, "append", unlist_after_the_creators_listing)
            monkeypatch.setattr(two.engine, "append", append_after_the_delete)
            await deleter.delete_session(app_name=APP, user_id=USER, session_id="s")
            deleted.set()
            if creator_thread:
                creator_thread[0].join(30)
            else:  # the delete wrote nothing to the index: the create after it
                await creator.create_session(app_name=APP, user_id=USER, session_id="s")
            listed = await deleter.list_sessions(app_name=APP, user_id=USER)
            assert [x.id for x in listed.sessions] == ["s"]

    run(main())


# -- end to end: a Runner with a fake model, reopened in another process --------------------

RUNNER_SCRIPT = r"""
import asyncio, sys
from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.genai import types
from eventstore.integrations.google_adk import EventStoreSessionService

class Echo(BaseLlm):
    model: str = "echo"

    async def generate_content_async(self, llm_request, stream=False):
        said = llm_request.contents[-1].parts[0].text
        reply = types.Content(role="model", parts=[types.Part(text="echo: " + said)])
        yield LlmResponse(content=reply)

async def main(root, text):
    service = EventStoreSessionService(root)
    agent = LlmAgent(name="echo", model=Echo(), output_key="last_reply")
    runner = Runner(app_name="app", agent=agent, session_service=service, auto_create_session=True)
    message = types.Content(role="user", parts=[types.Part(text=text)])
    async for event in runner.run_async(user_id="u", session_id="s", new_message=message):
        pass
    await runner.close()
    await service.close()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.slow  # two processes that import ADK
def test_a_runner_with_a_fake_model_resumes_in_a_new_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two turns, each by a Runner in a process of its own over the same directory: the
    second sees the first's events and state; `verify --all` is clean and names every
    event."""
    root = tmp_path / "store"
    script = tmp_path / "turn.py"
    script.write_text(RUNNER_SCRIPT)
    for text in ("hello", "again"):
        subprocess.run([sys.executable, str(script), str(root), text], check=True, timeout=120)

    async def main() -> None:
        service = EventStoreSessionService(root)
        s = await service.get_session(app_name="app", user_id="u", session_id="s")
        texts = [e.content.parts[0].text for e in s.events if e.content and e.content.parts]
        assert texts == ["hello", "echo: hello", "again", "echo: again"]
        assert s.state["last_reply"] == "echo: again"
        await service.close()

    run(main())
    code, out, err = cli_in_process(capsys, "verify", str(root), "--all", "--json")
    assert code == 0 and "unknown_type" not in out + err


# -- one engine call per append_event, and what a second writer changes --------------------


def _count_engine_calls(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...]
) -> dict[str, int]:
    """Count the calls of the engine's public `names` (the round trips of a database)."""
    calls = dict.fromkeys(names, 0)
    for name in names:
        real = getattr(store.engine, name)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kw)

        monkeypatch.setattr(store.engine, name, counted)
    return calls


def test_append_event_is_one_engine_append_and_no_read(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broken (before `append_decided`), each append_event read what the store had not
    seen (a round trip on PostgreSQL and Redis) before it appended."""

    async def main() -> None:
        with SessionStore(url) as store:
            service = EventStoreSessionService(store)
            s = await service.create_session(app_name=APP, user_id=USER, session_id="s")
            await service.append_event(s, text_event("warm"))
            calls = _count_engine_calls(store, monkeypatch, ("read", "read_some", "head", "append"))
            for i in range(5):
                delta = EventActions(state_delta={"turn": i})
                await service.append_event(s, text_event(f"turn {i}", actions=delta))
            assert calls == {"read": 0, "read_some": 0, "head": 0, "append": 5}
            got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
            assert got is not None and got.state == {"turn": 4} and len(got.events) == 6

    run(main())


def test_a_writer_with_a_cached_state_sees_what_another_appended(url: str) -> None:
    """Two services on one store, each with its own cache: a stale session object is
    refused and an event the other stored is not written twice, though this service's
    cached state knew neither (its append is conditional on the head it judged at)."""

    async def main() -> None:
        with SessionStore(url) as one, SessionStore(url) as two:
            a, b = EventStoreSessionService(one), EventStoreSessionService(two)
            sb = await b.create_session(app_name=APP, user_id=USER, session_id="s")
            await b.append_event(sb, text_event("e1"))  # b's state cached at its head
            sa = await a.get_session(app_name=APP, user_id=USER, session_id="s")
            assert sa is not None
            e2 = text_event("e2", timestamp=sb.last_update_time + 1)
            await a.append_event(sa, e2)
            seq = two.last_seq(session_id_of(APP, USER, "s"))
            with pytest.raises(StaleSessionError):
                await b.append_event(sb, text_event("e3", timestamp=e2.timestamp + 1))
            await b.append_event(sa, e2)  # a re-delivery b's cached state did not know
            assert two.last_seq(session_id_of(APP, USER, "s")) == seq
            got = await b.get_session(app_name=APP, user_id=USER, session_id="s")
            assert got is not None and [e.id for e in got.events] == [
                sb.events[0].id,
                e2.id,
            ]

    run(main())


def test_a_redelivery_judged_on_a_cached_state_is_judged_again(url: str) -> None:
    """Broken, b's cached state (it holds e1) answers "stored" for a session another
    service deleted and created again, which does not hold e1: acknowledged, not stored."""

    async def main() -> None:
        with SessionStore(url) as one, SessionStore(url) as two:
            a, b = EventStoreSessionService(one), EventStoreSessionService(two)
            sb = await b.create_session(app_name=APP, user_id=USER, session_id="s")
            e1 = text_event("e1")
            await b.append_event(sb, e1)
            await a.delete_session(app_name=APP, user_id=USER, session_id="s")
            await a.create_session(app_name=APP, user_id=USER, session_id="s")
            sb.events.clear()  # (ADK returns early for an event the object holds)
            with pytest.raises(StaleSessionError):
                await b.append_event(sb, e1)
            got = await a.get_session(app_name=APP, user_id=USER, session_id="s")
            assert got is not None and got.events == []

    run(main())


def test_two_writers_with_warm_states_racing_one_session_object_one_wins(url: str) -> None:
    """Both services' cached states are at the head and pass the checks; the appends
    are conditional on it, so the loser reads, is judged stale and writes nothing."""

    with SessionStore(url) as one, SessionStore(url) as two:
        services = [EventStoreSessionService(one), EventStoreSessionService(two)]
        s = run(services[0].create_session(app_name=APP, user_id=USER, session_id="s"))
        run(services[0].append_event(s, text_event("warm")))
        for service in services:  # both states folded to the same head
            got = run(service.get_session(app_name=APP, user_id=USER, session_id="s"))
            assert got is not None
        copies = [s.model_copy(deep=True) for _ in services]
        t = s.last_update_time
        outcomes: list[str] = []

        def writer(i: int) -> Callable[[], None]:
            def go() -> None:
                event = text_event(f"writer {i}", timestamp=t + 1 + i)
                try:
                    run(services[i].append_event(copies[i], event))
                    outcomes.append("stored")
                except StaleSessionError:
                    outcomes.append("stale")

            return go

        assert run_threads([writer(0), writer(1)]) == []
        assert sorted(outcomes) == ["stale", "stored"]
        got = run(services[1].get_session(app_name=APP, user_id=USER, session_id="s"))
        assert got is not None and len(got.events) == 2
