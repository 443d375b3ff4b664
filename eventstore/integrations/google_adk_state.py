"""What the Google ADK session service stores and how it folds: its events and its
three projections (pure, as every projection).

Three kinds of eventstore session (see `eventstore.integrations.google_adk`):

- an ADK session's own log: `adk_session_created` (its session-scoped initial state,
  and the app and user parts of it), then per ADK event a `messages_appended` (the event
  itself, as a transcript message) and an `adk_state_delta` (its session, app and user
  deltas) in one atomic batch. `adk_session` folds the session's state, its update time,
  the ids of its events (a re-delivered event writes nothing) and the seq of its newest
  app and user deltas.
- an app's log: the index of its sessions (`adk_session_listed` / `adk_session_unlisted`,
  folded by `adk_index`) and the app-scoped state, `adk_shared_delta` events folded by
  `adk_shared`.
- a user's log: the user-scoped state, the same `adk_shared_delta` events.

`adk_shared` keeps, per key, the newest value by the event time that set it (the last
writer by ADK's clock wins, whatever order the copies arrive in), and per source session
the last seq copied: copying is idempotent, and a copy a crash interrupted is completed
from the session's log (it holds every delta) the next time that session is used.

Free of ADK, so the `eventstore` command (which loads `EVENT_TYPES` through the
`eventstore.event_types` entry point) names these events where ADK is not installed.
"""

# no `from __future__ import annotations`: msgspec reads these structs' annotations
# as objects, not strings to evaluate; that keeps decoder builds on cold loads ~3x cheaper

from typing import Any

import msgspec

from eventstore.format.events import Event
from projections import StructProjection

__all__ = [
    "EVENT_TYPES",
    "INDEX",
    "PROJECTIONS",
    "SESSION",
    "SHARED",
    "AdkIndex",
    "AdkIndexProjection",
    "AdkSession",
    "AdkSessionProjection",
    "AdkShared",
    "AdkSharedProjection",
    "SessionCreated",
    "SessionListed",
    "SessionUnlisted",
    "SharedDelta",
    "StateDelta",
    "index_key",
    "source_of",
]


class SessionCreated(Event, tag="adk_session_created", kw_only=True):
    """`create_session`: the session's ids, creation time and initial state by scope."""

    app_name: str
    user_id: str
    session_id: str
    created: float  # seconds since the epoch, ADK's `last_update_time`
    state: dict[str, Any] = msgspec.field(default_factory=dict)
    app: dict[str, Any] = msgspec.field(default_factory=dict)
    user: dict[str, Any] = msgspec.field(default_factory=dict)
    incarnation: str = ""  # unique per create ("": a log written before it was kept)


class StateDelta(Event, tag="adk_state_delta", kw_only=True):
    """An ADK event's id, time and state deltas by scope (`temp:` never stored); the
    event itself is the `messages_appended` of the same batch."""

    event_id: str
    timestamp: float
    state: dict[str, Any] = msgspec.field(default_factory=dict)
    app: dict[str, Any] = msgspec.field(default_factory=dict)
    user: dict[str, Any] = msgspec.field(default_factory=dict)


class SessionListed(Event, tag="adk_session_listed", kw_only=True):
    """The app's index: a session of `user_id` was created."""

    user_id: str
    session_id: str


class SessionUnlisted(Event, tag="adk_session_unlisted", kw_only=True):
    """The app's index: a session was deleted."""

    user_id: str
    session_id: str


class SharedDelta(Event, tag="adk_shared_delta", kw_only=True):
    """App- or user-scoped changes copied from session `source` up to its seq `upto`:
    per key, [time, value]."""

    source: str
    upto: int
    changes: dict[str, tuple[float, Any]]


EVENT_TYPES: tuple[type[Event], ...] = (
    SessionCreated,
    StateDelta,
    SessionListed,
    SessionUnlisted,
    SharedDelta,
)


class AdkSession(msgspec.Struct):
    """`adk_session`'s state (`seq`: the last event folded, of any type)."""

    seq: int = 0
    created: bool = False
    state: dict[str, Any] = msgspec.field(default_factory=dict)
    update_time: float = 0.0
    event_ids: set[str] = msgspec.field(default_factory=set)
    app_seq: int = 0  # the seq of the newest app delta
    user_seq: int = 0
    incarnation: str = ""  # its `adk_session_created`'s


class AdkSessionProjection(StructProjection[AdkSession]):
    """An ADK session's own state, update time, event ids and newest shared deltas."""

    name = "adk_session"
    version = 1
    event_types = frozenset({"adk_session_created", "adk_state_delta"})
    state_type = AdkSession
    cache_folds = True

    def initial(self) -> AdkSession:
        """Not created."""
        return AdkSession()

    def apply(self, state: AdkSession, event: Event) -> AdkSession:
        """Fold one event."""
        if isinstance(event, SessionCreated):
            state.created = True
            state.incarnation = event.incarnation
            state.state.update(event.state)
            state.update_time = event.created
            if event.app:
                state.app_seq = event.seq
            if event.user:
                state.user_seq = event.seq
        elif isinstance(event, StateDelta):
            state.state.update(event.state)
            state.update_time = event.timestamp
            state.event_ids.add(event.event_id)
            if event.app:
                state.app_seq = event.seq
            if event.user:
                state.user_seq = event.seq
        state.seq = event.seq
        return state

    def copy(self, state: AdkSession) -> AdkSession:
        """A copy the caller may change (values are JSON, replaced, never changed)."""
        return AdkSession(
            state.seq,
            state.created,
            dict(state.state),
            state.update_time,
            set(state.event_ids),
            state.app_seq,
            state.user_seq,
            state.incarnation,
        )


class AdkShared(msgspec.Struct):
    """`adk_shared`'s state: per key [time, value], per source session the seq copied."""

    values: dict[str, tuple[float, Any]] = msgspec.field(default_factory=dict)
    applied: dict[str, int] = msgspec.field(default_factory=dict)


def source_of(sid: str, incarnation: str) -> str:
    """The source a session's copies name in `adk_shared`: its id and its incarnation (a
    deleted id created again starts its seqs over, so its copies must not be judged by
    the seqs the deleted one's reached)."""
    return f"{sid} {incarnation}" if incarnation else sid


class AdkSharedProjection(StructProjection[AdkShared]):
    """App- or user-scoped state: the newest value of each key by ADK's clock."""

    name = "adk_shared"
    version = 1
    event_types = frozenset({"adk_shared_delta"})
    state_type = AdkShared
    cache_folds = True

    def initial(self) -> AdkShared:
        """Nothing shared."""
        return AdkShared()

    def apply(self, state: AdkShared, event: Event) -> AdkShared:
        """Keep each change newer than the value held (a tie: the later copy)."""
        if isinstance(event, SharedDelta):
            for key, (ts, value) in event.changes.items():
                held = state.values.get(key)
                if held is None or ts >= held[0]:
                    state.values[key] = (ts, value)
            if event.upto > state.applied.get(event.source, 0):
                state.applied[event.source] = event.upto
        return state

    def copy(self, state: AdkShared) -> AdkShared:
        """A copy the caller may change."""
        return AdkShared(dict(state.values), dict(state.applied))


class AdkIndex(msgspec.Struct):
    """`adk_index`'s state: the app's sessions in order of creation, each as
    `index_key(user_id, session_id)` -> [user_id, session_id]."""

    sessions: dict[str, tuple[str, str]] = msgspec.field(default_factory=dict)


def index_key(user_id: str, session_id: str) -> str:
    """How `adk_index` keys a session (a user's and another's may share a session id)."""
    return f"{len(user_id)}:{user_id}{session_id}"


class AdkIndexProjection(StructProjection[AdkIndex]):
    """The sessions an app holds (what `list_sessions` reads)."""

    name = "adk_index"
    version = 1
    event_types = frozenset({"adk_session_listed", "adk_session_unlisted"})
    state_type = AdkIndex
    cache_folds = True

    def initial(self) -> AdkIndex:
        """No session."""
        return AdkIndex()

    def apply(self, state: AdkIndex, event: Event) -> AdkIndex:
        """List or unlist one session."""
        if isinstance(event, SessionListed):
            key = index_key(event.user_id, event.session_id)
            state.sessions.setdefault(key, (event.user_id, event.session_id))
        elif isinstance(event, SessionUnlisted):
            state.sessions.pop(index_key(event.user_id, event.session_id), None)
        return state

    def copy(self, state: AdkIndex) -> AdkIndex:
        """A copy the caller may change."""
        return AdkIndex(dict(state.sessions))


SESSION = AdkSessionProjection()
SHARED = AdkSharedProjection()
INDEX = AdkIndexProjection()
PROJECTIONS: tuple[AdkSessionProjection | AdkSharedProjection | AdkIndexProjection, ...] = (
    SESSION,
    SHARED,
    INDEX,
)
