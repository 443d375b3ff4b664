"""`EventStoreSessionStore`: a Claude Agent SDK `SessionStore` kept in eventstore sessions.

One eventstore session per SDK key: the main transcript of `session_id` in
`project_key` is the session `claude-sdk.<project_key>.<session_id>`, a subagent's
transcript `claude-sdk.<project_key>.<session_id>.<subpath>` (each part percent-encoded,
`.` included, so any key maps to one session and back; `session_key_of` and
`session_id_of` are the two directions).

- **Entries are the Claude Code lines they are**: each is kept as a `claude_code_line`
  event (`eventstore.integrations.claude_code`), its JSON as msgspec writes it, so
  `eventstore export ROOT SID --format claude-code` gives the lines back byte for byte
  and `load` gives entries equal to those appended.
- **One append, one atomic batch**: the lines and, for a main transcript, a
  `claude_sdk_summary` event (the SDK's `fold_session_summary` of the batch), appended
  only if the session is still at the head the summary and the held uuids were folded
  to (`SessionStore.append_decided`: no read when this store's state is at the head; a
  racing append makes it fold again), so summaries never lose an append and nothing
  spans two sessions.
- **Deduplicated by `uuid`**, as the SDK asks: an entry whose `uuid` the transcript
  holds with the same contents (a retried batch, or a line `eventstore
  import-claude-code --claude-agent-sdk` brought: it names sessions as this store does)
  is not appended again; one whose uuid comes with other contents is kept (real
  transcripts have them), and so is every entry without a uuid, and every entry of one
  batch (a file may repeat a line).
- **Listings** read the names of the store's sessions and, per session of the project,
  the small `claude_sdk` projection: `mtime` is the time of the newest
  append, on the store's clock, in epoch ms, for both listings.
- `delete` of a main transcript removes its subagent transcripts too, those appended
  while it runs included.

Any `SessionStore` (or `AsyncSessionStore`) will do: the store learns the event types and
projections (`SessionStore.learn`), so one store can serve every adapter at once.
"""

from __future__ import annotations

import os
from typing import Any, cast

import msgspec

try:
    from claude_agent_sdk import fold_session_summary
    from claude_agent_sdk.types import (
        SessionKey,
        SessionListSubkeysKey,
        SessionStoreEntry,
        SessionStoreListEntry,
        SessionSummaryEntry,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "eventstore.integrations.claude_agent_sdk needs the Claude Agent SDK:"
        " pip install 'harness-eventstore[claude-agent-sdk]'"
    ) from exc

from eventstore.aio import AsyncSessionStore
from eventstore.errors import EventStoreError, InvalidRecordError
from eventstore.format.events import Event
from eventstore.integrations import claude_code
from eventstore.integrations.claude_agent_sdk_state import (
    EVENT_TYPES,
    PREFIX,
    PROJECTION,
    PROJECTIONS,
    SdkSession,
    SummarySet,
    entry_key,
    key_part,
    session_id_of,
    session_key_of,
    session_of_file,
)
from eventstore.integrations.claude_code import ClaudeCodeLine, ClaudeCodeProjection, KeptLines
from eventstore.store import SessionStore
from projections import Projection

__all__ = [
    "EVENT_TYPES",
    "PROJECTIONS",
    "PREFIX",
    "EventStoreSessionStore",
    "session_id_of",
    "session_key_of",
    "session_of_file",
]

_encoder = msgspec.json.Encoder()
_LISTING = "claude-sdk listing"  # the lane of listings (they read many sessions)


class EventStoreSessionStore:
    """The Claude Agent SDK `SessionStore` (append, load, list_sessions,
    list_session_summaries, delete, list_subkeys) over an eventstore store.

    `store_or_url`: an `AsyncSessionStore` or `SessionStore` to share (it learns this
    module's event types and projections), or what `SessionStore` takes (a directory or
    a store URL), opened here and closed by `close()`.
    """

    def __init__(self, store_or_url: AsyncSessionStore | SessionStore | str | os.PathLike[str]):
        types = EVENT_TYPES
        projections: tuple[Projection[Any], ...] = (*PROJECTIONS, *claude_code.PROJECTIONS)
        if isinstance(store_or_url, AsyncSessionStore):
            self.aio, self._owns = store_or_url, False
        elif isinstance(store_or_url, SessionStore):
            self.aio, self._owns = AsyncSessionStore(store_or_url), True
        else:
            store = SessionStore(store_or_url, event_types=types, projections=projections)
            self.aio, self._owns = AsyncSessionStore(store), True
        self.store = self.aio.store
        self.store.learn(types, projections)

    async def close(self) -> None:
        """Release what this object opened (a store it was given stays open)."""
        if self._owns:
            await self.aio.close()

    # -- required -----------------------------------------------------------------------

    async def append(self, key: SessionKey, entries: list[SessionStoreEntry]) -> None:
        """Append the entries as one atomic batch (those whose `uuid` is held skipped)."""
        sid = session_id_of(key)
        if not isinstance(entries, list):
            raise InvalidRecordError(f"entries must be a list, got {type(entries).__name__}")
        if not entries:
            return
        lines = [_line(e, i) for i, e in enumerate(entries)]
        main = key.get("subpath") is None
        await self.aio.call(sid, lambda: self._append(sid, key, entries, lines, main))

    def _append(
        self,
        sid: str,
        key: SessionKey,
        entries: list[SessionStoreEntry],
        lines: list[ClaudeCodeLine],
        main: bool,
    ) -> None:
        """The batch, less the entries held, and the summary folded from the state it was
        judged on, committed only at the head that state was folded to
        (`SessionStore.append_decided`: one engine round trip when this store's state is
        at the head; a racing append makes it fold again)."""

        def decide(state: SdkSession) -> list[Event]:
            fresh: list[tuple[SessionStoreEntry, ClaudeCodeLine]] = []
            for entry, line in zip(entries, lines, strict=True):
                uuid = entry.get("uuid")
                if isinstance(uuid, str) and entry_key(uuid, bytes(line.line)) in state.uuids:
                    continue  # a retried batch's entry (a uuid alone may repeat)
                fresh.append((entry, line))
            if not fresh:
                # an error, not "no events": nothing is written only on what the log
                # holds now, never on a state this store kept
                raise _AllHeld(sid)
            events: list[Event] = [line for _, line in fresh]
            if main:
                folded = fold_session_summary(_summary_of(state), key, [e for e, _ in fresh])
                events.append(SummarySet(summary=msgspec.Raw(_encoder.encode(folded))))
            return events

        try:
            self.store.append_decided(sid, PROJECTION, decide)
        except _AllHeld:
            return  # every entry is held: a retried batch

    async def load(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        """The entries appended under `key`, in order; None if it holds none."""
        sid = session_id_of(key)

        def load() -> list[SessionStoreEntry] | None:
            if not self.store.last_seq(sid) or self.store.tombstone_of(sid) is not None:
                return None  # never written, or deleted (a tombstone)
            kept = cast(KeptLines, self.store.load(sid, ClaudeCodeProjection.name))
            return [cast(SessionStoreEntry, msgspec.json.decode(line)) for line in kept.lines]

        return await self.aio.call(sid, load)

    # -- optional -----------------------------------------------------------------------

    async def list_sessions(self, project_key: str) -> list[SessionStoreListEntry]:
        """The project's main transcripts, each with the time of its newest append."""
        return [
            {"session_id": key["session_id"], "mtime": state.mtime}
            for key, state in await self._mains(project_key)
        ]

    async def list_session_summaries(self, project_key: str) -> list[SessionSummaryEntry]:
        """The project's summaries as the SDK folded them, `mtime` stamped."""
        out: list[SessionSummaryEntry] = []
        for _key, state in await self._mains(project_key):
            summary = _summary_of(state)
            if summary is not None:
                out.append(summary)
        return out

    async def delete(self, key: SessionKey) -> None:
        """Remove the transcript (a main one with its subagents' transcripts, as the SDK
        asks: none is left an orphan). A subagent transcript appended while the delete
        runs goes with it: the subagents are listed again until a listing finds no new
        one, so one first appended after that is an append after the delete (kept, as
        the SDK's own in-memory store keeps it)."""
        sid = session_id_of(key)

        def delete() -> None:
            self.store.delete_session(sid)
            if key.get("subpath") is not None:
                return
            # each part of a key is percent-encoded, "." included: only the main's
            # subagents start with its id and a "."; each is deleted once (a listing
            # that still names one cannot make this loop forever)
            done: set[str] = set()
            while fresh := [s for s in self.store.list_sessions(sid + ".") if s not in done]:
                for s in fresh:
                    self.store.delete_session(s)
                    done.add(s)

        await self.aio.call(sid, delete)

    async def list_subkeys(self, key: SessionListSubkeysKey) -> list[str]:
        """The subpaths of the session's subagent transcripts."""
        sid = session_id_of(_main(key))

        def subkeys() -> list[str]:
            found = (session_key_of(s) for s in self.store.list_sessions())
            return [
                k["subpath"]
                for k in found
                if k is not None and "subpath" in k and session_id_of(_main(k)) == sid
            ]

        return await self.aio.call(_LISTING, subkeys)

    async def _mains(self, project_key: str) -> list[tuple[dict[str, str], SdkSession]]:
        prefix = f"{PREFIX}.{key_part(project_key, 'project_key')}."

        def mains() -> list[tuple[dict[str, str], SdkSession]]:
            out = []
            for s in self.store.list_sessions():
                key = session_key_of(s) if s.startswith(prefix) else None
                if key is not None and "subpath" not in key:
                    out.append((key, cast(SdkSession, self.store.load(s, PROJECTION))))
            return out

        return await self.aio.call(_LISTING, mains)


class _AllHeld(EventStoreError):
    """Raised by an append's decision that finds every entry held: an error, so a state
    this store kept is judged again on a fresh read before nothing is written."""


def _main(key: Any) -> Any:
    """The main transcript's key of `key` (what is no dict stays, for `session_id_of`
    to refuse: a missing part is its InvalidArgumentError, not a KeyError)."""
    if not isinstance(key, dict):
        return key
    return {"project_key": key.get("project_key"), "session_id": key.get("session_id")}


def _line(entry: object, i: int) -> ClaudeCodeLine:
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
        raise InvalidRecordError(f"entries[{i}] must be a dict with a str 'type', got {entry!r}")
    try:
        data = _encoder.encode(entry)
        if msgspec.json.decode(data) != entry:
            raise TypeError("it does not read back equal (NaN, bytes, a non-str key?)")
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        raise InvalidRecordError(f"entries[{i}] is not JSON: {exc}") from None
    return ClaudeCodeLine(line=msgspec.Raw(data))


def _summary_of(state: SdkSession) -> SessionSummaryEntry | None:
    if bytes(state.summary) == b"null":
        return None
    summary = cast(dict[str, Any], msgspec.json.decode(state.summary))
    summary["mtime"] = state.mtime  # the store's clock, stamped at the append
    return cast(SessionSummaryEntry, summary)
