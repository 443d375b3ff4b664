"""What the Claude Agent SDK store keeps beside the Claude Code lines, and how it folds.

A Claude Agent SDK transcript entry is a Claude Code line, kept as the `claude_code_line`
event of `eventstore.integrations.claude_code` (so `eventstore export --format
claude-code` gives the lines back). Each append to a main transcript also carries, in the
same atomic batch, a `claude_sdk_summary` event: the SDK's running summary
(`fold_session_summary`'s output, kept verbatim). The `claude_sdk` projection folds
what `list_sessions`, `list_session_summaries` and the deduplication by `uuid` read:
the newest summary, the time of the newest append (the store's clock, in epoch
milliseconds: the `mtime` of both listings) and the key (`entry_key`: the uuid and a
digest of the line) of every line with a `uuid`, whoever wrote it (this store, or
`eventstore import-claude-code --claude-agent-sdk`, which names sessions as this store
does: `session_of_file`).

Free of the SDK, so the `eventstore` command (which loads `EVENT_TYPES` through the
`eventstore.event_types` entry point) names these events where it is not installed.
"""

# no `from __future__ import annotations`: msgspec reads these structs' annotations
# as objects, not strings to evaluate; that keeps decoder builds on cold loads ~3x cheaper

import hashlib
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import msgspec

from eventstore.errors import InvalidArgumentError
from eventstore.format.events import Event
from eventstore.integrations.claude_code import ClaudeCodeLine
from eventstore.session_ids import id_part
from projections import StructProjection

__all__ = [
    "EVENT_TYPES",
    "PREFIX",
    "PROJECTION",
    "PROJECTIONS",
    "SdkSession",
    "SdkSessionProjection",
    "SummarySet",
    "entry_key",
    "key_part",
    "session_id_of",
    "session_key_of",
    "session_of_file",
]

PREFIX = "claude-sdk"


def key_part(text: object, what: str) -> str:
    """One part of a session name: a non-empty str, percent-encoded (`.` too)."""
    return id_part(text, f"a session key's {what}")


def session_id_of(key: Any) -> str:
    """The eventstore session holding the transcript an SDK `SessionKey` names: the
    main transcript `claude-sdk.<project_key>.<session_id>`, a subagent's
    `claude-sdk.<project_key>.<session_id>.<subpath>` (parts percent-encoded, `.` too)."""
    if not isinstance(key, dict):
        raise InvalidArgumentError(f"a session key must be a dict, got {type(key).__name__}")
    sid = f"{PREFIX}.{key_part(key.get('project_key'), 'project_key')}"
    sid += f".{key_part(key.get('session_id'), 'session_id')}"
    if key.get("subpath") is not None:  # absent or None: the main transcript
        sid += f".{key_part(key.get('subpath'), 'subpath')}"
    return sid


def session_key_of(session_id: str) -> dict[str, str] | None:
    """The SDK key (a dict) of an eventstore session so named (None for any other)."""
    parts = session_id.split(".")
    if parts[0] != PREFIX or len(parts) not in (3, 4) or not all(parts[1:]):
        return None
    key = {"project_key": unquote(parts[1]), "session_id": unquote(parts[2])}
    if len(parts) == 4:
        key["subpath"] = unquote(parts[3])
    return key


def session_of_file(path: Path, session_id: str) -> str:
    """For `import_transcript(..., session_of=session_of_file)` and `eventstore
    import-claude-code --claude-agent-sdk`: the session the SDK store keeps a Claude Code
    file's transcript in. Claude Code writes `<project>/<sessionId>.jsonl` under
    `~/.claude/projects/` (the SDK's default `project_key` is that directory's name) and
    a subagent's as `<project>/<sessionId>/subagents/<agent>.jsonl` (its `subpath`:
    `subagents/<agent>`)."""
    if path.parent.name == "subagents" and len(path.parents) > 2:
        key = {
            "project_key": path.parents[2].name,
            "session_id": session_id,
            "subpath": f"subagents/{path.stem}",
        }
    else:
        key = {"project_key": path.parent.name, "session_id": session_id}
    return session_id_of(key)


NULL = msgspec.Raw(b"null")


def entry_key(uuid: str, line: bytes) -> str:
    """What makes an entry with a `uuid` a duplicate: its uuid and its line's digest (real
    transcripts repeat a uuid with other contents, and those lines are all kept)."""
    return f"{uuid} {hashlib.blake2b(line, digest_size=12).hexdigest()}"


class SummarySet(Event, tag="claude_sdk_summary", kw_only=True):
    """The session's summary after an append to its main transcript, as the SDK's
    `fold_session_summary` made it (kept verbatim)."""

    summary: msgspec.Raw = msgspec.field(default_factory=lambda: NULL)


class _Uuid(msgspec.Struct):
    uuid: Any = None


_uuid_of = msgspec.json.Decoder(_Uuid)


class SdkSession(msgspec.Struct):
    """The `claude_sdk` projection's state (`seq`: the last event folded, of any type)."""

    seq: int = 0
    mtime: int = 0  # epoch ms of the newest append
    summary: msgspec.Raw = msgspec.field(default_factory=lambda: NULL)  # JSON null: none yet
    uuids: set[str] = msgspec.field(default_factory=set)


class SdkSessionProjection(StructProjection[SdkSession]):
    """The newest summary, the newest append's time and the entry keys held."""

    name = "claude_sdk"
    version = 1
    event_types = frozenset({"claude_sdk_summary", "claude_code_line"})
    state_type = SdkSession

    def initial(self) -> SdkSession:
        """No append yet."""
        return SdkSession()

    def apply(self, state: SdkSession, event: Event) -> SdkSession:
        """Fold one event (its time, and a summary's contents)."""
        if type(event) is ClaudeCodeLine:
            line = bytes(event.line)
            try:
                uuid = _uuid_of.decode(line).uuid
            except msgspec.MsgspecError:  # a line msgspec cannot read (kept verbatim)
                uuid = None
            if isinstance(uuid, str):
                state.uuids.add(entry_key(uuid, line))
        elif isinstance(event, SummarySet) and bytes(event.summary) != b"null":
            state.summary = event.summary
        state.mtime = int(event.ts.timestamp() * 1000)
        state.seq = event.seq
        return state

    def copy(self, state: SdkSession) -> SdkSession:
        """A copy the caller may change."""
        return SdkSession(state.seq, state.mtime, state.summary, set(state.uuids))


PROJECTION = SdkSessionProjection()
PROJECTIONS: tuple[SdkSessionProjection, ...] = (PROJECTION,)
EVENT_TYPES: tuple[type[Event], ...] = (ClaudeCodeLine, SummarySet)
