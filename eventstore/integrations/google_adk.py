"""`EventStoreSessionService`: a Google ADK `BaseSessionService` kept in eventstore logs.

Sessions (the events and projections are in `eventstore.integrations.google_adk_state`):

- `adk.<app>.<user>.<session>`: one per ADK session (each part percent-encoded, `.`
  included). `create_session` writes `adk_session_created`; each ADK `Event` is **one
  atomic append** of two events: a `messages_appended` holding the event as a transcript
  message (its text as `content`, the whole event, as ADK's JSON, in
  `metadata["adk_event"]`) and an `adk_state_delta` with its session, `app:` and
  `user:` deltas (`temp:` is never stored). So an event and all of its deltas are
  committed together or not at all.
- `adk-app.<app>`: the app's index of sessions (what `list_sessions` reads) and its
  app-scoped state; `adk-user.<app>.<user>`: the user-scoped state.

**App and user state.** Nothing writes two sessions at once: the commit point of every
delta is its own session's log. The app's and user's logs hold copies, made right after
the append by the writer (idempotent: each copy names its source session, the creation
of it (an id deleted and created again starts its seqs over) and seq, and the newest
value of a key by ADK's event time wins whatever order copies land in). A
crash between the append and the copy loses nothing: the session's log still holds the
delta, `get_session` of that session overlays what was not copied yet (a read writes
nothing), and its next `append_event` or `create_session` copies it. Why this and not
one batch across sessions: an append is atomic because it is one session's; the copies
can be redone from that log at any time, so they need no atomicity of their own, and no
engine has to learn a write spanning sessions. (Until then, other sessions of the app
do not see the delta a crashed writer left uncopied.)

**Reads cost what they return.** `get_session(config=GetSessionConfig(num_recent_events=N))`
reads the newest N messages through the transcript's paging (from the end of the log,
also cold); `after_timestamp` reads pages from the end, doubling, until one reaches an
older event. `list_sessions(app, user)` reads the app's index and one small projection
per session it returns, never the other sessions of the store.

**Writers.** A session object read before another writer appended gets ADK's
`StaleSessionError` (its `last_update_time` is older than the stored one), as the
database service does; the append itself is conditional on the head that check was
made at, so two writers racing cannot both pass it. An event whose id the session holds
(a re-delivery) writes nothing.

**One engine call per event.** Those checks are made against the state the store holds
(`SessionStore.append_decided`), with no read when it is at the session's head: one
round trip on PostgreSQL and Redis, one write on files. A state another writer made
stale costs a read and a retry; a refusal or a re-delivery judged on a cached state is
judged again on a fresh read (`_Stored` is an error for that reason).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, cast

try:
    from google.adk.errors import StaleSessionError
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event as AdkEvent
    from google.adk.platform import uuid as platform_uuid
    from google.adk.sessions.base_session_service import (
        BaseSessionService,
        GetSessionConfig,
        ListSessionsResponse,
    )
    from google.adk.sessions.session import Session
    from google.adk.sessions.state import State
    from typing_extensions import override
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "eventstore.integrations.google_adk needs Google ADK:"
        " pip install 'harness-eventstore[google-adk]'"
    ) from exc

from eventstore import entropy
from eventstore.aio import AsyncSessionStore
from eventstore.errors import (
    ConcurrencyError,
    EventStoreError,
    InvalidArgumentError,
    SessionDeletedError,
)
from eventstore.format.events import Event, MessagesAppended
from eventstore.integrations.google_adk_state import (
    EVENT_TYPES,
    INDEX,
    PROJECTIONS,
    SESSION,
    SHARED,
    AdkIndex,
    AdkSession,
    AdkShared,
    SessionCreated,
    SessionListed,
    SessionUnlisted,
    SharedDelta,
    StateDelta,
    index_key,
    source_of,
)
from eventstore.records import Message, Role
from eventstore.session_ids import id_part, validate_session_id
from eventstore.store import SessionStore

__all__ = [
    "EVENT_TYPES",
    "PROJECTIONS",
    "AdkSessionExistsError",
    "AdkSessionNotFoundError",
    "AdkStaleSessionError",
    "EventStoreSessionService",
]

FIRST_PAGE = 32  # events read first for `after_timestamp` alone (then doubled)


class AdkStaleSessionError(StaleSessionError, EventStoreError):
    """ADK's `StaleSessionError`: the session object is older than what is stored."""


class AdkSessionExistsError(AlreadyExistsError, EventStoreError):
    """ADK's `AlreadyExistsError`: `create_session` of an id the user already has."""


class AdkSessionNotFoundError(SessionNotFoundError, EventStoreError):
    """ADK's `SessionNotFoundError`: `append_event` to a session that is not stored."""


class _Stored(EventStoreError):
    """Raised by a decision that finds its write stored already: an error, so the store
    judges it again on a fresh read when it was judged on a cached state."""


def _part(text: object, what: str) -> str:
    return id_part(text, what)


def _stripped(session_id: Any) -> Any:
    """A session id as ADK's services take it: stripped of surrounding whitespace (any
    other value is left to `session_id_of` to refuse)."""
    return session_id.strip() if isinstance(session_id, str) else session_id


def session_id_of(app_name: str, user_id: str, session_id: str) -> str:
    """The eventstore session of an ADK session."""
    app, user = _part(app_name, "app_name"), _part(user_id, "user_id")
    # checked here: a create must fail before it lists an id no engine can hold
    return validate_session_id(f"adk.{app}.{user}.{_part(session_id, 'session_id')}")


def _app_sid(app_name: str) -> str:
    return f"adk-app.{_part(app_name, 'app_name')}"


def _user_sid(app_name: str, user_id: str) -> str:
    return f"adk-user.{_part(app_name, 'app_name')}.{_part(user_id, 'user_id')}"


def _split(delta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(session, app, user) parts of a state delta, prefixes removed; `temp:` dropped."""
    if not isinstance(delta, dict):
        raise InvalidArgumentError(f"state must be a dict, got {type(delta).__name__}")
    if not all(isinstance(k, str) for k in delta):
        raise InvalidArgumentError("state keys must be str")
    own: dict[str, Any] = {}
    app: dict[str, Any] = {}
    user: dict[str, Any] = {}
    for key, value in delta.items():
        if key.startswith(State.APP_PREFIX):
            app[key.removeprefix(State.APP_PREFIX)] = value
        elif key.startswith(State.USER_PREFIX):
            user[key.removeprefix(State.USER_PREFIX)] = value
        elif not key.startswith(State.TEMP_PREFIX):
            own[key] = value
    return own, app, user


def _merged(app: dict[str, Any], user: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    out = {State.APP_PREFIX + k: v for k, v in app.items()}
    out.update({State.USER_PREFIX + k: v for k, v in user.items()})
    out.update(own)
    return out


def _message(event: AdkEvent) -> Message:
    """The ADK event as a transcript message (the whole event in its metadata)."""
    parts = event.content.parts if event.content and event.content.parts else []
    text = "".join(p.text for p in parts if p.text)
    try:
        created: datetime | None = datetime.fromtimestamp(event.timestamp, UTC)
    except (OverflowError, OSError, ValueError):
        created = None
    return Message(
        role=Role.USER if event.author == "user" else Role.ASSISTANT,
        content=text,
        name=event.author or None,
        created_at=created,
        metadata={"adk_event": event.model_dump(mode="json", exclude_none=True)},
    )


def _event(message: Message) -> AdkEvent:
    return AdkEvent.model_validate(message.metadata["adk_event"])


def _timestamp(message: Message) -> float:
    return float(message.metadata["adk_event"].get("timestamp", 0.0))


class EventStoreSessionService(BaseSessionService):
    """A Google ADK session service over an eventstore store (see the module doc).

    `store_or_url`: an `AsyncSessionStore` or `SessionStore` to share (it learns this
    module's event types and projections), or what `SessionStore` takes (a directory or
    a store URL), opened here and closed by `close()`.
    """

    def __init__(
        self, store_or_url: AsyncSessionStore | SessionStore | str | os.PathLike[str]
    ) -> None:
        if isinstance(store_or_url, AsyncSessionStore):
            self.aio, self._owns = store_or_url, False
        elif isinstance(store_or_url, SessionStore):
            self.aio, self._owns = AsyncSessionStore(store_or_url), True
        else:
            store = SessionStore(store_or_url, event_types=EVENT_TYPES, projections=PROJECTIONS)
            self.aio, self._owns = AsyncSessionStore(store), True
        self.store = self.aio.store
        self.store.learn(EVENT_TYPES, PROJECTIONS)

    async def close(self) -> None:
        """Release what this service opened (a store it was given stays open)."""
        if self._owns:
            await self.aio.close()

    # -- sessions -----------------------------------------------------------------------

    @override
    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """A new session (AdkSessionExistsError if the user has one of that id); the id
        stripped, a new one when none is given or it is blank (as ADK's services do)."""
        session_id = _stripped(session_id)
        if session_id is None or session_id == "":
            session_id = platform_uuid.new_uuid()
        sid = session_id_of(app_name, user_id, session_id)
        own, app, user = _split({} if state is None else state)
        created = SessionCreated(
            app_name=app_name,
            user_id=user_id,
            session_id=session_id,
            created=time.time(),
            state=own,
            app=app,
            user=user,
            incarnation=entropy.token_hex(16),
        )

        self.store.codec.check(created)  # a state that is not JSON: nothing written

        def create() -> dict[str, Any]:
            # listed first: a crash after it leaves a listed session that is not there,
            # which `list_sessions` skips; never one that is not listed
            self._list(app_name, user_id, session_id)
            try:
                try:
                    # conditional on an empty log: one head read and the append (a state
                    # folded from a log this store has not read would cost a read a fold)
                    result = self.store.append(sid, [created], expected_seq=0)
                except SessionDeletedError:
                    # ADK's contract: a deleted id may be created again, on purpose (a
                    # late append_event still finds it gone: stale, or not found)
                    self.store.restore(sid)
                    result = self.store.append(sid, [created], expected_seq=0)
                    # the delete's unlisting may have landed after the listing above
                    self._list(app_name, user_id, session_id)
            except ConcurrencyError:
                raise AdkSessionExistsError(
                    f"Session with id {session_id} already exists."
                ) from None
            sess = AdkSession(
                seq=result.last_seq, created=True, state=own, incarnation=created.incarnation
            )
            sess.app_seq = result.last_seq if app else 0
            sess.user_seq = result.last_seq if user else 0
            self._copy_shared(sid, app_name, user_id, AdkSession(), sess, created)
            return self._shared_view(sid, app_name, user_id, sess)

        merged = await self.aio.call(sid, create)
        return Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=merged,
            events=[],
            last_update_time=created.created,
        )

    @override
    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """The session with its events (those `config` asks for); None if unknown. The
        id is stripped as `create_session` strips it (blank: None, as ADK's services)."""
        session_id = _stripped(session_id)
        if session_id == "":
            _user_sid(app_name, user_id)  # a bad app or user is still refused
            return None
        sid = session_id_of(app_name, user_id, session_id)

        def get() -> Session | None:
            sess = cast(AdkSession, self.store.load(sid, SESSION))
            if not sess.created:
                return None
            return Session(
                id=session_id,
                app_name=app_name,
                user_id=user_id,
                state=self._shared_view(sid, app_name, user_id, sess),
                events=[_event(m) for m in self._messages(sid, config)],
                last_update_time=sess.update_time,
            )

        return await self.aio.call(sid, get)

    def _messages(self, sid: str, config: GetSessionConfig | None) -> list[Message]:
        """The messages (events) `config` asks for, reading no more than it needs."""
        n = config.num_recent_events if config is not None else None
        after = config.after_timestamp if config is not None else None
        if n == 0:
            return []
        if not after:
            return self.store.load_transcript_messages(sid, last=n)
        size = n or FIRST_PAGE
        while True:
            page = self.store.load_transcript_messages(sid, last=size)
            if len(page) < size or _timestamp(page[0]) < after or size == n:
                break
            size *= 2
        kept = [m for m in page if _timestamp(m) >= after]
        return kept[-n:] if n else kept

    @override
    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """The app's sessions (of `user_id`, or of every user), oldest update first,
        without events: read from the app's index, one small projection each."""
        app_sid = _app_sid(app_name)
        if user_id is not None:
            _part(user_id, "user_id")

        def listing() -> ListSessionsResponse:
            index = cast(AdkIndex, self.store.load(app_sid, INDEX))
            app = _values(cast(AdkShared, self.store.load(app_sid, SHARED)))
            users: dict[str, dict[str, Any]] = {}
            out: list[Session] = []
            for user, session_id in index.sessions.values():
                if user_id is not None and user != user_id:
                    continue
                sid = session_id_of(app_name, user, session_id)
                sess = cast(AdkSession, self.store.load(sid, SESSION))
                if not sess.created:
                    continue  # listed by a create that did not finish, or deleted
                if user not in users:
                    shared = self.store.load(_user_sid(app_name, user), SHARED)
                    users[user] = _values(cast(AdkShared, shared))
                out.append(
                    Session(
                        id=session_id,
                        app_name=app_name,
                        user_id=user,
                        state=_merged(app, users[user], sess.state),
                        events=[],
                        last_update_time=sess.update_time,
                    )
                )
            out.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
            return ListSessionsResponse(sessions=out)

        return await self.aio.call(app_sid, listing)

    @override
    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Remove the session's log (its app and user deltas stay, as ADK's do). The id
        is stripped as `create_session` strips it (blank: nothing to delete, as ADK's
        services)."""
        session_id = _stripped(session_id)
        if session_id == "":
            _user_sid(app_name, user_id)  # a bad app or user is still refused
            return
        sid = session_id_of(app_name, user_id, session_id)

        def delete() -> None:
            self.store.delete_session(sid)
            if self.store.tombstone_of(sid) is None:
                return  # never created, or created again since: its listing stands
            unlisted = SessionUnlisted(user_id=user_id, session_id=session_id)
            if (
                index_key(user_id, session_id)
                in self.store.load(_app_sid(app_name), INDEX).sessions
            ):
                self.store.append(_app_sid(app_name), [unlisted])
                if cast(AdkSession, self.store.load(sid, SESSION)).created:
                    # created again by another writer since the delete: listed again
                    self._list(app_name, user_id, session_id)

        await self.aio.call(sid, delete)

    def _list(self, app_name: str, user_id: str, session_id: str) -> None:
        """List the session in its app's index unless the index lists it (judged on the
        index as it is now: each append is judged against the store's state, with no read
        when it is at the head)."""
        key = index_key(user_id, session_id)

        def unlisted_only(index: AdkIndex) -> list[Event]:
            if key in index.sessions:
                # an error, so judged again on a fresh read: another process may have
                # unlisted it since this store's state was folded
                raise _Stored(_app_sid(app_name))
            return [SessionListed(user_id=user_id, session_id=session_id)]

        try:
            self.store.append_decided(_app_sid(app_name), INDEX, unlisted_only)
        except _Stored:
            pass  # listed already (by the log as it is now)

    @override
    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user-scoped state, keys without `user:`."""
        usid = _user_sid(app_name, user_id)

        def get() -> dict[str, Any]:
            return _values(cast(AdkShared, self.store.load(usid, SHARED)))

        return await self.aio.call(usid, get)

    # -- events -------------------------------------------------------------------------

    @override
    async def append_event(self, session: Session, event: AdkEvent) -> AdkEvent:
        """Append the event and its deltas as one atomic batch (see the module doc)."""
        if event.partial:
            return event
        sid = session_id_of(session.app_name, session.user_id, session.id)
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        own, app, user = _split(dict(event.actions.state_delta) if event.actions else {})
        delta = StateDelta(
            event_id=event.id, timestamp=event.timestamp, state=own, app=app, user=user
        )
        batch = [MessagesAppended(messages=[_message(event)]), delta]
        since = session.last_update_time

        judged: list[AdkSession] = []  # the state the batch was appended at

        def decide(sess: AdkSession) -> list[Event]:
            # judged against the state this store holds, with no read when it is at
            # the head: the append is conditional on that head, and a refusal or a
            # re-delivery judged on it is judged again on a fresh read (append_decided)
            if not sess.created:
                raise AdkSessionNotFoundError(f"Session {session.id} not found.")
            if event.id in sess.event_ids:
                raise _Stored(sid)  # a re-delivery (an error: judged again on a fresh read)
            if sess.update_time > since:
                raise AdkStaleSessionError(
                    "The last_update_time provided in the session object is earlier"
                    " than the update_time in storage. Please check if it is a stale"
                    " session."
                )
            judged[:] = [
                AdkSession(
                    seq=sess.seq,
                    app_seq=sess.app_seq,
                    user_seq=sess.user_seq,
                    incarnation=sess.incarnation,
                )
            ]
            return batch

        def append() -> None:
            try:
                result = self.store.append_decided(sid, SESSION, decide)
            except _Stored:
                # a re-delivered event: stored already, but maybe by a call that failed
                # before its copies (its retry): copy what the log holds and they lack
                sess = cast(AdkSession, self.store.load(sid, SESSION))
                self._copy_shared(sid, session.app_name, session.user_id, sess, sess, delta)
                return
            except SessionDeletedError:
                # a tombstone: ADK's answer for a session gone
                raise AdkSessionNotFoundError(f"Session {session.id} not found.") from None
            assert result is not None  # `decide` appends or raises
            before = judged[0]
            after = AdkSession(seq=result.last_seq, created=True, incarnation=before.incarnation)
            after.app_seq = result.last_seq if app else before.app_seq
            after.user_seq = result.last_seq if user else before.user_seq
            self._copy_shared(sid, session.app_name, session.user_id, before, after, delta)

        await self.aio.call(sid, append)
        session.last_update_time = event.timestamp
        if any(e.id == event.id for e in session.events):
            return event
        return self._commit_event_to_session(session, event)

    # -- app and user state -------------------------------------------------------------

    def _copy_shared(
        self,
        sid: str,
        app_name: str,
        user_id: str,
        before: AdkSession,
        after: AdkSession,
        fresh: SessionCreated | StateDelta,
    ) -> None:
        """Copy the session's app and user deltas up to `after` into their logs: `fresh`
        (just appended) alone when every earlier one is copied, else from the log (a
        copy a crash interrupted is completed by the session's next write)."""
        for target, field, old, new in (
            (_app_sid(app_name), "app", before.app_seq, after.app_seq),
            (_user_sid(app_name, user_id), "user", before.user_seq, after.user_seq),
        ):
            if new == 0:
                continue  # the session never changed this scope
            copier = self._copier(sid, after.incarnation, field, old, new, fresh)
            self.store.append_decided(target, SHARED, copier)

    def _copier(
        self,
        sid: str,
        incarnation: str,
        field: str,
        old: int,
        new: int,
        fresh: SessionCreated | StateDelta,
    ) -> Callable[[AdkShared], list[Event]]:
        """What copies the session's `field` deltas up to seq `new` into a shared log:
        nothing if copied already, `fresh` alone if every delta up to `old` was."""

        source = source_of(sid, incarnation)

        def copy(shared: AdkShared) -> list[Event]:
            done = shared.applied.get(source, 0)
            if done >= new:
                return []  # (from a cached state too: `applied` only ever grows)
            if done >= old:
                changes = _changes([fresh], field)
            else:
                changes = _changes(self._deltas(sid, done, new), field)
            return [SharedDelta(source=source, upto=new, changes=changes)]

        return copy

    def _shared_view(
        self, sid: str, app_name: str, user_id: str, sess: AdkSession
    ) -> dict[str, Any]:
        """The session's state merged with its app's and user's, overlaid with what this
        session's log holds that a crash kept from being copied (a read writes nothing)."""
        merged: list[dict[str, Any]] = []
        for target, field, upto in (
            (_app_sid(app_name), "app", sess.app_seq),
            (_user_sid(app_name, user_id), "user", sess.user_seq),
        ):
            shared = cast(AdkShared, self.store.load(target, SHARED))
            done = shared.applied.get(source_of(sid, sess.incarnation), 0)
            if upto > done:
                for key, (ts, value) in _changes(self._deltas(sid, done, upto), field).items():
                    held = shared.values.get(key)
                    if held is None or ts >= held[0]:
                        shared.values[key] = (ts, value)
            merged.append(_values(shared))
        return _merged(merged[0], merged[1], sess.state)

    def _deltas(self, sid: str, after: int, upto: int) -> list[SessionCreated | StateDelta]:
        events = self.store.read_events(
            sid, from_seq=after + 1, to_seq=upto, types=(SessionCreated, StateDelta)
        )
        return [cast(SessionCreated | StateDelta, e) for e in events]


def _changes(events: Iterable[SessionCreated | StateDelta], field: str) -> dict[str, Any]:
    out: dict[str, tuple[float, Any]] = {}
    for e in events:
        ts = e.created if isinstance(e, SessionCreated) else e.timestamp
        for key, value in getattr(e, field).items():
            out[key] = (ts, value)
    return out


def _values(shared: AdkShared) -> dict[str, Any]:
    return {key: value for key, (_ts, value) in shared.values.items()}
