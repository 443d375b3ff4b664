"""`EventStoreSession`: an OpenAI Agents SDK `Session` kept in an eventstore session log.

The conversation is a fold of three custom events, so nothing is ever overwritten:

| call | event |
|---|---|
| `add_items(items)` | `agents_items_added`: the items, as one atomic append |
| `pop_item()` | `agents_item_popped`: the item removed (and which one it was) |
| `clear_session()` | `agents_session_cleared` |

`get_items` reads the `agents_items` projection; `items_at(seq=...)` folds the history up
to any point, so a popped or cleared conversation can still be read back, and
`eventstore log` / `verify` see every step.

Retries: each `add_items` is appended under an idempotency key. A call whose caller saw
no outcome (an exception, a cancellation: its append may have been committed anyway)
leaves its key with the session object, filed under a fingerprint of its items
(canonical JSON, so key order does not matter); the next `add_items` of the same items
reuses that key, and appends nothing if the first attempt was committed (two such
calls of the same items leave two keys, one for each retry). A call that
returned consumed its key: adding the same items again is a new message (a user who
really says "yes" twice is recorded twice). The keys live in the object: a retry from
another process (or a new object) cannot be told from a new message and appends again.
A position-based key would not do: a cancelled call's append finishes in its worker
and moves the position, so the retry would look new.

Several processes may share one session: appends take the log's writers' lock; a pop
removes the item it read only if nothing was appended since, and otherwise reads again.
A store that has folded the conversation pops its newest item with no read
(`SessionStore.append_decided`: the append is conditional on the head that state was
folded to, so a state another writer made stale costs a read and a retry, and an empty
one is read again before the pop answers None); one that has not reads the newest item
from the log's end and appends at the head it read (`expected_seq`).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

import msgspec

try:
    from agents.items import TResponseInputItem
    from agents.memory.session_settings import (
        SessionSettings,
        coerce_session_settings,
        resolve_session_limit,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "eventstore.integrations.openai_agents needs the OpenAI Agents SDK:"
        " pip install 'harness-eventstore[openai-agents]'"
    ) from exc

from eventstore.aio import AsyncSessionStore
from eventstore.core.session_core import core_of
from eventstore.engines.base import EMPTY_HEAD, Head
from eventstore.errors import (
    ConcurrencyError,
    EventStoreError,
    InvalidArgumentError,
    InvalidRecordError,
    NestingTooDeepError,
    SessionDeletedError,
    StoreClosedError,
)
from eventstore.format.depth import MAX_DEPTH
from eventstore.format.events import SessionDeleted
from eventstore.integrations.openai_agents_state import (
    EVENT_TYPES,
    PROJECTION,
    PROJECTIONS,
    AgentItems,
    AgentItemsProjection,
    ItemPopped,
    ItemsAdded,
    SessionCleared,
    StoredItem,
)
from eventstore.ops.history import projection_at
from eventstore.ops.paging import newest_events
from eventstore.store import SessionStore

__all__ = [
    "EVENT_TYPES",
    "PROJECTIONS",
    "AgentItems",
    "AgentItemsProjection",
    "EventStoreSession",
    "ItemPopped",
    "ItemsAdded",
    "SessionCleared",
]

MAX_UNACKNOWLEDGED = 100  # failed adds whose keys a session object keeps for retries
# (and the tombstone: a delete stopped before its erase leaves it ending the log, and a
# pop must refuse it as a write would)
_ITEM_TAGS = frozenset(PROJECTION.event_types) | {"session_deleted"}


_encoder = msgspec.json.Encoder()
_sorted_encoder = msgspec.json.Encoder(order="sorted")


class EventStoreSession:
    """An Agents SDK `Session` (get_items, add_items, pop_item, clear_session) whose
    conversation is the eventstore session `session_id`.

    `store_or_url` is an `AsyncSessionStore` or `SessionStore` to share (it learns this
    module's event types and projection: `SessionStore.learn`), or what `SessionStore`
    takes (a directory or a store URL), opened here with those.
    `session_settings.limit` is the default `get_items` limit.
    """

    session_id: str
    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        store_or_url: AsyncSessionStore | SessionStore | str | os.PathLike[str],
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        self.session_id = session_id
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        if isinstance(store_or_url, AsyncSessionStore):
            self.aio, self._owns = store_or_url, False
        elif isinstance(store_or_url, SessionStore):
            self.aio, self._owns = AsyncSessionStore(store_or_url), True
        else:
            store = SessionStore(store_or_url, event_types=EVENT_TYPES, projections=PROJECTIONS)
            self.aio, self._owns = AsyncSessionStore(store), True
        self.aio.store.learn(EVENT_TYPES, PROJECTIONS)
        self.store = self.aio.store
        # the key of each add whose caller saw no outcome -> the fingerprint of its items
        # (every one kept: two such adds of the same items are two retries' keys)
        self._unacknowledged: dict[str, str] = {}

    # -- the Session protocol -----------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation in order; with a limit, its newest `limit` items (0: none; a
        negative limit: all, as the SDK's SQLite session does; a limit that is no int:
        InvalidArgumentError)."""
        n = resolve_session_limit(limit, self.session_settings)
        if n is not None and not isinstance(n, int):
            # (a float slices no list: refused before any read, warm or cold alike)
            raise InvalidArgumentError(f"limit must be an int or None, not {n!r}")
        if n is not None and n >= 0:

            def newest() -> list[StoredItem]:
                found = self._newest(n) if n else ([], EMPTY_HEAD, None)
                if found is not None:
                    return found[0]
                # (the store's folded state, brought up to date; only the page copied)
                return core_of(self.store).loaded(self.session_id, PROJECTION, _newest_part(n))

            items = await self.aio.call(self.session_id, newest)
        else:
            state = await self.aio.load(self.session_id, PROJECTION)
            items = cast(AgentItems, state).items
        return [_decode(i.item) for i in items]

    def _newest(self, n: int) -> tuple[list[StoredItem], Head, SessionDeleted | None] | None:
        """The newest `n` items, the head of the log read and its tombstone, if it ends
        with one (then no items), read from the end of the log when this store has not
        folded the conversation (`newest_events`: O(what is returned), every line
        checked against its link); None: fold instead."""
        if core_of(self.store).has_fold(self.session_id, PROJECTION.name):
            return None  # warm: a slice of the folded state
        out: list[StoredItem] = []
        popped: set[tuple[int, int]] = set()
        tombstone: list[SessionDeleted] = []

        def visit(ev: object) -> bool:
            # newest first: an item is gone if a pop after its add names it, and
            # everything before a clear is
            if isinstance(ev, SessionCleared):
                return True
            if isinstance(ev, SessionDeleted):
                tombstone.append(ev)
                return True
            if isinstance(ev, ItemPopped):
                popped.add((ev.added_seq, ev.index))
                return False
            assert isinstance(ev, ItemsAdded)
            for i in range(len(ev.items) - 1, -1, -1):
                if (ev.seq, i) in popped:
                    continue
                out.append(StoredItem(ev.seq, i, ev.items[i]))
                if len(out) >= n:
                    return True
            return False

        head = newest_events(self.store, self.session_id, _ITEM_TAGS, visit)
        if head is None:
            return None
        out.reverse()
        return out, head, tombstone[0] if tombstone else None

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append the items as one atomic event; a retry of a failed or cancelled call
        with the same items appends nothing if the first attempt was committed."""
        if self.aio.closed:  # before the empty fast path, as SQLiteSession checks
            raise StoreClosedError("the session's store is closed")
        if not items:
            return
        raws, fingerprint = _encode_items(items)
        # a new attempt gets a new key; a retry of an attempt whose outcome its caller
        # never saw (an error, a cancellation) reuses that attempt's key
        key = next((k for k, f in self._unacknowledged.items() if f == fingerprint), None)
        if key is None:
            key = f"agents-add:{secrets.token_hex(8)}"
        else:
            del self._unacknowledged[key]
        event = ItemsAdded(items=raws)
        try:
            await self.aio.call(
                self.session_id,
                lambda: self.store.append(self.session_id, [event], idempotency_key=key),
            )
        except BaseException:
            self._unacknowledged[key] = fingerprint
            while len(self._unacknowledged) > MAX_UNACKNOWLEDGED:
                del self._unacknowledged[next(iter(self._unacknowledged))]
            raise

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item; None (and nothing written) if there is none."""

        def pop() -> TResponseInputItem | None:
            # a store that has not folded the conversation reads the newest item from
            # the log's end (no fold of a long log for one item), appended only at the
            # head it read; a store that has folded it judges its state with no read
            found = self._newest(1)
            if found is not None:
                newest, head, tombstone = found
                if tombstone is not None:
                    raise SessionDeletedError(self.session_id, tombstone.ts, tombstone.by)
                if not newest:
                    return None
                try:
                    # at the very head read (its seq and `h`): a log replaced since by
                    # another of as many lines would take the pop of an item it lacks
                    self.store.append(
                        self.session_id,
                        [_popped(newest[-1])],
                        expected_seq=head.seq,
                        expected_h=head.h,
                    )
                    return _decode(newest[-1].item)
                except ConcurrencyError:
                    pass  # another writer got in first: fold, and judge again
            return self._pop_decided()

        return await self.aio.call(self.session_id, pop)

    def _pop_decided(self) -> TResponseInputItem | None:
        """Pop the newest item of the projection's state, committed only at the head
        that state was folded to (`SessionStore.append_decided`: one engine round trip
        when this store's state is at the head, a read and a retry when it is stale)."""
        judged: list[StoredItem] = []  # the item of the decision that was committed

        def decide(state: AgentItems) -> list[ItemPopped]:
            if not state.items:
                # an error, not "no events": an empty state may be stale (another
                # process may have added since), so it is judged again on a fresh read
                raise _NothingToPop(self.session_id)
            judged[:] = state.items[-1:]
            return [_popped(judged[0])]

        try:
            self.store.append_decided(self.session_id, PROJECTION, decide)
        except _NothingToPop:
            return None
        return _decode(judged[0].item)

    async def clear_session(self) -> None:
        """Remove every item from the session (the log keeps them: see `items_at`)."""

        await self.aio.call(
            self.session_id, lambda: self.store.append(self.session_id, [SessionCleared()])
        )

    # -- audit ---------------------------------------------------------------------------

    async def items_at(
        self, *, seq: int | None = None, at: datetime | None = None
    ) -> list[TResponseInputItem]:
        """The conversation as it was after event `seq`, or at time `at` (at most one;
        neither: now), read from the whole history (the archive included); an error
        where that history is gone, as `SessionStore.state_at` raises (an unknown
        session: `[]`)."""
        if seq is not None and at is not None:
            raise InvalidArgumentError("give seq or at, not both")
        if at is not None and (not isinstance(at, datetime) or at.utcoffset() is None):
            raise InvalidArgumentError(f"at= must be a timezone-aware datetime, got {at!r}")

        def replay() -> list[TResponseInputItem]:
            last = self.store.last_seq(self.session_id)
            if not last:
                return []  # the store would say it has no such event
            # (the store's own replay: history compacted away is an error, never a fold
            # of what is left of it)
            upto = last if seq is None and at is None else seq
            state = projection_at(self.store, PROJECTION, self.session_id, upto, at)
            return [_decode(i.item) for i in state.items]

        return await self.aio.call(self.session_id, replay)

    async def close(self) -> None:
        """Release the async store if this session made it (a shared one stays open)."""
        if self._owns:
            await self.aio.close()


class _NothingToPop(EventStoreError):
    """Raised by a pop's decision on an empty conversation: an error, so a state held
    by this store is judged again on a fresh read before the pop answers None."""


def _popped(item: StoredItem) -> ItemPopped:
    return ItemPopped(added_seq=item.added_seq, index=item.index, item=item.item)


def _encode_items(items: list[TResponseInputItem]) -> tuple[list[msgspec.Raw], str]:
    if not isinstance(items, list):
        raise InvalidRecordError(f"items must be a list, got {type(items).__name__}")
    digest = hashlib.blake2b(digest_size=16)
    raws: list[msgspec.Raw] = []
    for i, item in enumerate(items):
        try:
            raw, value = _stored(item)
            raws.append(msgspec.Raw(raw))
            canonical = _sorted_encoder.encode(value)
        except RecursionError:  # far past the log's depth limit (which refuses the rest)
            raise NestingTooDeepError(
                f"items[{i}] nests arrays and objects too deep to encode; a log line may"
                f" nest at most {MAX_DEPTH} levels (eventstore.format.depth.MAX_DEPTH)"
            ) from None
        except (TypeError, ValueError, msgspec.EncodeError) as exc:
            raise InvalidRecordError(f"items[{i}] is not JSON-serializable: {exc}") from None
        digest.update(len(canonical).to_bytes(8, "big"))
        digest.update(canonical)
    return raws, digest.hexdigest()


def _stored(item: Any) -> tuple[bytes, Any]:
    """The JSON the log stores of `item`, and the value a read returns of it: `item`
    itself when msgspec's JSON reads back equal; otherwise what SQLiteSession (the SDK's
    reference) reads back of it, `json.loads(json.dumps(item))` (tuples as lists, keys
    True, None, 1.5 as "true", "null", "1.5"), refusing (ValueError) what would lose
    data there (two keys of one JSON name: it keeps the last) or what JSON cannot hold
    (NaN, infinities: msgspec would write null); TypeError for what the json module
    refuses (bytes, datetimes, sets)."""
    try:
        raw = _encoder.encode(item)
        if msgspec.json.decode(raw) == item:
            return raw, item
    except (TypeError, msgspec.EncodeError):
        pass  # keys msgspec does not write (True, None): the json module's judge
    value = json.loads(json.dumps(item), object_pairs_hook=_one_per_name, parse_constant=_refused)
    return _encoder.encode(value), value


def _one_per_name(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object of the json module's writing, refused when two of its keys got one name."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"two keys of one object are both written {key!r} in JSON")
        seen.add(key)
    return dict(pairs)


def _refused(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON (out of range float values are not JSON compliant)")


def _newest_part(n: int) -> Callable[[AgentItems], list[StoredItem]]:
    def cut(state: AgentItems) -> list[StoredItem]:
        return state.items[max(len(state.items) - n, 0) :] if n else []

    return cut


def _decode(raw: msgspec.Raw) -> TResponseInputItem:
    return cast(TResponseInputItem, msgspec.json.decode(raw))
