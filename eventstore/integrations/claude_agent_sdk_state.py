"""What the Claude Agent SDK store keeps beside the Claude Code lines, and how it folds.

A Claude Agent SDK transcript entry is a Claude Code line, kept as the `claude_code_line`
event of `eventstore.integrations.claude_code` (so `eventstore export --format
claude-code` gives the lines back). Each append to a main transcript also carries, in the
same atomic batch, a `claude_sdk_summary` event: the SDK's running summary
(`fold_session_summary`'s output, kept verbatim) and the keys of the entries with a `uuid`
the batch added (`entry_key`: the uuid and a digest of the line). The
`claude_sdk` projection folds those into what `list_sessions`,
`list_session_summaries` and the deduplication by `uuid` read: the newest summary, the
time of the newest append (the store's clock, in epoch milliseconds: the `mtime` of
both listings) and the entry keys held.

Free of the SDK, so the `eventstore` command (which loads `EVENT_TYPES` through the
`eventstore.event_types` entry point) names these events where it is not installed.
"""

from __future__ import annotations

import hashlib

import msgspec

from eventstore.format.events import Event
from eventstore.integrations.claude_code import ClaudeCodeLine
from projections import StructProjection

__all__ = [
    "EVENT_TYPES",
    "PROJECTION",
    "PROJECTIONS",
    "SdkSession",
    "SdkSessionProjection",
    "SummarySet",
    "entry_key",
]


NULL = msgspec.Raw(b"null")


def entry_key(uuid: str, line: bytes) -> str:
    """What makes an entry with a `uuid` a duplicate: its uuid and its line's digest (real
    transcripts repeat a uuid with other contents, and those lines are all kept)."""
    return f"{uuid} {hashlib.blake2b(line, digest_size=12).hexdigest()}"


class SummarySet(Event, tag="claude_sdk_summary", kw_only=True):
    """An append's bookkeeping: the session's summary after it (JSON `null` for a
    subagent transcript, which has none) and the keys of the entries it added that
    have a `uuid` (`entry_key`)."""

    summary: msgspec.Raw = msgspec.field(default_factory=lambda: NULL)
    uuids: list[str] = msgspec.field(default_factory=list)


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
        if isinstance(event, SummarySet):
            if bytes(event.summary) != b"null":
                state.summary = event.summary
            state.uuids.update(event.uuids)
        state.mtime = int(event.ts.timestamp() * 1000)
        state.seq = event.seq
        return state

    def copy(self, state: SdkSession) -> SdkSession:
        """A copy the caller may change."""
        return SdkSession(state.seq, state.mtime, state.summary, set(state.uuids))


PROJECTION = SdkSessionProjection()
PROJECTIONS: tuple[SdkSessionProjection, ...] = (PROJECTION,)
EVENT_TYPES: tuple[type[Event], ...] = (ClaudeCodeLine, SummarySet)
