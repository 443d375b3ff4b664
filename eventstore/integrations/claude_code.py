"""Claude Code transcripts (`~/.claude/projects/<project>/<session id>.jsonl`) in and out.

Owns the import of Claude Code's JSONL session files into eventstore sessions, the
following of a file Claude Code is still writing, and the export that gives the lines
back. One eventstore session per Claude Code `sessionId` (a line without one, such as a
`summary` line, belongs to the session its file is named after).

- **Verbatim.** Every line that is a JSON object is kept as a `claude_code_line` event
  holding the line itself (`line`: the object's bytes, inline, so `jq '.line.message'`
  reads it; `lead`/`trail`: any whitespace around it), so `export_transcript` gives the
  same lines back byte for byte. A valid line msgspec cannot read (a lone surrogate
  escape such as `"\ud83d"`, which Node writes for a string cut inside an emoji, or a
  number past a double's range such as `1e400`) is read with Python's `json` and kept
  as a JSON string of its bytes (`line` is then a string: every reader of the log can
  still decode it); its message is mirrored as Node reads it back: each lone surrogate
  U+FFFD, each such number null (what `JSON.stringify` writes for an infinity).
- **Mirrored.** A `user`, `assistant` or `system` line's message is also appended to the
  transcript as a `Message` with its blocks (text, thinking, tool calls, tool results,
  image references), its `timestamp` as `created_at` and `uuid`, `parentUuid`,
  `isSidechain`, `model` as metadata, in the same atomic batch as its line. A user
  message that only carries tool results is mirrored with the role `tool`.
- **Idempotent without a bound.** The `claude_code` projection counts, per session, the
  copies of each distinct line (by BLAKE2b-128 of its bytes) kept so far; the k-th copy
  of a line in a file is appended only if the session holds fewer than k. Re-importing
  appends nothing, however long the session; lines that differ (a `uuid` repeated with
  other content, as real files have) are all kept, and so is a line a file repeats.
- **Never fatal.** A line that is not JSON, not an object, or nests deeper than
  `LINE_MAX_DEPTH` is reported (file, line number, byte offset) and skipped; the rest of
  the file is imported. A message too deep to mirror is kept, not mirrored, and reported.
- **A replaced file** (another inode, or other bytes where the last poll stopped) is
  read again from its start by a follower: only the lines the session lacks are new.

Any store will do: one that does not know the event type and the projection learns them
(`SessionStore.learn`) when it is given to an import, a follower or an export.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from eventstore.errors import (
    ConcurrencyError,
    EventStoreError,
    InvalidRecordError,
)
from eventstore.format.codec import validated_copy
from eventstore.format.depth import MAX_DEPTH, depth_of, over
from eventstore.format.events import (
    Event,
    MessagesAppended,
)
from eventstore.ops.follow import poll_interval_of
from eventstore.records import (
    ContentBlock,
    ImageBlock,
    Message,
    Role,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    text_of,
)
from eventstore.session_ids import validate_session_id
from eventstore.store import SessionStore

__all__ = [
    "EVENT_TYPES",
    "PROJECTIONS",
    "ClaudeCodeLine",
    "ClaudeCodeProjection",
    "ImportReport",
    "KeptLines",
    "LINE_MAX_DEPTH",
    "MalformedLine",
    "SessionNamer",
    "TranscriptFollower",
    "export_transcript",
    "follow_transcripts",
    "import_transcript",
    "open_store",
    "to_message",
    "transcript_files",
]

TAG = "claude_code_line"
#: `session_of(path, sessionId)`: the eventstore session a line of the file `path` with
#: that Claude Code `sessionId` goes to (default: the `sessionId` itself).
SessionNamer = Callable[[Path, str], str]
#: Lines appended per atomic batch: bounds the memory of one append, not what is kept.
BATCH_LINES = 1000
#: The deepest a line may nest (arrays and objects) to be kept: its event holds it one
#: level below the log line's (`eventstore.format.depth.MAX_DEPTH`).
LINE_MAX_DEPTH = MAX_DEPTH - 1
#: The deepest a mirrored message may nest: a `messages_appended` line holds it two
#: levels down.
_MESSAGE_MAX_DEPTH = MAX_DEPTH - 2
#: How many of the last bytes a follower consumed it checks, at every poll, are still there.
_LAST_BYTES = 4096
_JSON_WS = b" \t\r"  # JSON whitespace other than the newline that ends a line


class ClaudeCodeLine(Event, tag=TAG, kw_only=True):
    """One line of a Claude Code transcript, verbatim: `lead` + `line` + `trail`.

    `line` is the line's JSON object itself, or, for a valid line msgspec cannot read
    (a lone surrogate escape, a number past a double's range), a JSON string of its
    bytes, so the log stays readable by every reader (a kept line is an object, never a
    string: the two cannot be confused)."""

    line: msgspec.Raw
    lead: str = ""
    trail: str = ""

    def original(self) -> bytes:
        """The line's bytes exactly as the file held them (no newline)."""
        line = bytes(self.line)
        if line[:1] == b'"':  # kept as a string of its bytes
            line = msgspec.json.decode(line, type=str).encode()
        return self.lead.encode() + line + self.trail.encode()


def _digest(line: bytes) -> bytes:
    # of the JSON alone: the same line read with and without its CRLF's \r is one line
    return hashlib.blake2b(line.strip(_JSON_WS), digest_size=16).digest()


class KeptLines:
    """The `claude_code` projection's state: every kept line in order, and how many
    copies of each distinct line (by digest) the session holds."""

    __slots__ = ("counts", "lines")

    def __init__(self, lines: list[bytes] | None = None) -> None:
        self.lines: list[bytes] = []
        self.counts: Counter[bytes] = Counter()
        for line in lines or ():
            self.add(line)

    def add(self, line: bytes) -> None:
        """Keep one more line."""
        self.lines.append(line)
        self.counts[_digest(line)] += 1


class ClaudeCodeProjection:
    """Folds `claude_code_line` events into `KeptLines` (a pure fold, no I/O).

    Its snapshot state is the list of lines as JSON strings; the counts are rebuilt
    from them, so a compacted session still exports and deduplicates exactly.
    """

    name = "claude_code"
    version = 1
    event_types: frozenset[str] | None = frozenset({TAG})

    def initial(self) -> KeptLines:
        """No line kept."""
        return KeptLines()

    def apply(self, state: KeptLines, event: Event) -> KeptLines:
        """Keep the line of a `claude_code_line` event."""
        if type(event) is ClaudeCodeLine:
            state.add(event.original())
        return state

    def encode_state(self, state: KeptLines) -> bytes:
        """The lines as a JSON array of strings (they are UTF-8: each was JSON)."""
        return msgspec.json.encode([line.decode() for line in state.lines])

    def decode_state(self, data: bytes) -> KeptLines:
        """The state back from `encode_state`'s JSON."""
        return KeptLines([s.encode() for s in msgspec.json.decode(data, type=list[str])])

    def copy(self, state: KeptLines) -> KeptLines:
        """A state the caller may change (the lines are immutable bytes, shared)."""
        out = KeptLines()
        out.lines = list(state.lines)
        out.counts = Counter(state.counts)
        return out


#: Pass these to `SessionStore` (or use `open_store`) to import and export.
EVENT_TYPES: tuple[type[Event], ...] = (ClaudeCodeLine,)
PROJECTIONS: tuple[ClaudeCodeProjection, ...] = (ClaudeCodeProjection(),)


def open_store(root: str | os.PathLike[str], **options: Any) -> SessionStore:
    """A `SessionStore` at `root` that knows Claude Code lines (options pass through)."""
    return SessionStore(
        root,
        event_types=[*EVENT_TYPES, *options.pop("event_types", ())],
        projections=[*PROJECTIONS, *options.pop("projections", ())],
        **options,
    )


def _check_store(store: SessionStore) -> None:
    # a plainly opened store learns the line type and the projection (SessionStore.learn)
    store.learn(EVENT_TYPES, PROJECTIONS)


# -- from a Claude Code line to a transcript message -----------------------------------


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _image(source: object, media_type: object) -> ImageBlock:
    """A reference to an image: its URL, or the SHA-256 of inline base64 data."""
    mt = media_type if isinstance(media_type, str) else None
    if isinstance(source, dict):
        mt = source.get("media_type") if isinstance(source.get("media_type"), str) else mt
        kind = source.get("type")
        if kind == "url" and isinstance(source.get("url"), str):
            return ImageBlock(source=source["url"], media_type=mt)
        if kind == "file" and isinstance(source.get("file_id"), str):
            return ImageBlock(source="file:" + source["file_id"], media_type=mt)
        data = source.get("data")
        if isinstance(data, str):
            try:
                raw = base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                raw = data.encode()
            return ImageBlock(source="sha256:" + hashlib.sha256(raw).hexdigest(), media_type=mt)
    return ImageBlock(source="claude-code:image", media_type=mt)


def _result_content(content: object) -> str | list[TextBlock | ImageBlock]:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out: list[TextBlock | ImageBlock] = []
        for item in content:
            if isinstance(item, dict) and item.get("type") == "text":
                out.append(TextBlock(text=_text(item.get("text"))))
            elif isinstance(item, dict) and item.get("type") == "image":
                out.append(_image(item.get("source"), None))
        return out
    return "" if content is None else msgspec.json.encode(content).decode()


def _block(item: object) -> ContentBlock | None:
    """One Claude (Anthropic API) content block; None for kinds not mirrored."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if kind == "text":
        return TextBlock(text=_text(item.get("text")))
    if kind == "thinking":
        sig = item.get("signature")
        return ThinkingBlock(
            thinking=_text(item.get("thinking")), signature=sig if isinstance(sig, str) else None
        )
    if kind == "tool_use":
        args = item.get("input")
        return ToolUseBlock(
            id=_text(item.get("id")),
            name=_text(item.get("name")),
            input=args if isinstance(args, dict) else {},
        )
    if kind == "tool_result":
        return ToolResultBlock(
            tool_use_id=_text(item.get("tool_use_id")),
            content=_result_content(item.get("content")),
            is_error=item.get("is_error") is True,
        )
    if kind == "image":
        return _image(item.get("source"), None)
    return None  # e.g. redacted_thinking: kept in the verbatim line only


_ROLES = {"user": Role.USER, "assistant": Role.ASSISTANT, "system": Role.SYSTEM}


def _created_at(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        ts = datetime.fromisoformat(value)
    except ValueError:
        return None
    return ts if ts.utcoffset() is not None else None


def to_message(doc: dict[str, Any]) -> Message | None:
    """The transcript message a Claude Code line carries; None for lines that carry none
    (`summary`, file snapshots, ...). Never raises on odd shapes: what does not fit is
    left out (the verbatim line keeps it)."""
    kind = doc.get("type")
    role = _ROLES.get(kind) if isinstance(kind, str) else None
    if role is None:
        return None
    msg = doc.get("message")
    if role is Role.SYSTEM:  # Claude Code's own notices: {"type":"system","content":"..."}
        body: object = doc.get("content")
    elif isinstance(msg, dict):
        body = msg.get("content")
    else:
        return None
    blocks: list[ContentBlock] = []
    if isinstance(body, str):
        content = body
    elif isinstance(body, list):
        blocks = [b for b in map(_block, body) if b is not None]
        content = text_of(blocks)
        if blocks and all(type(b) is ToolResultBlock for b in blocks):
            role = Role.TOOL
    else:
        return None
    metadata: dict[str, Any] = {
        k: doc[k] for k in ("uuid", "parentUuid", "isSidechain") if k in doc
    }
    if isinstance(msg, dict) and isinstance(msg.get("model"), str):
        metadata["model"] = msg["model"]
    return Message(
        role=role,
        content=content,
        blocks=blocks,
        created_at=_created_at(doc.get("timestamp")),
        metadata=metadata,
    )


# -- reading files ---------------------------------------------------------------------


class MalformedLine(msgspec.Struct, frozen=True):
    """A line that was skipped: not JSON, not an object, or of an unusable session."""

    path: str
    line: int  # 1-based
    offset: int  # of the line's first byte
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: (byte {self.offset}) {self.reason}"


class ImportReport(msgspec.Struct):
    """What an import (or one poll of a follower) did to one file."""

    path: str
    lines: int = 0  # lines read (complete ones)
    appended: dict[str, int] = msgspec.field(default_factory=dict)  # session -> lines kept anew
    messages: dict[str, int] = msgspec.field(default_factory=dict)  # session -> messages mirrored
    already: int = 0  # lines the store held already
    malformed: list[MalformedLine] = msgspec.field(default_factory=list)
    unmirrored: list[MalformedLine] = msgspec.field(default_factory=list)  # kept, not mirrored

    @property
    def sessions(self) -> list[str]:
        """The sessions this file's lines belong to, in order of first appearance."""
        return list(self.appended)

    def merge(self, other: ImportReport) -> None:
        """Add what `other` (a later poll of the same file) did."""
        self.lines += other.lines
        self.already += other.already
        for sid, n in other.appended.items():
            self.appended[sid] = self.appended.get(sid, 0) + n
        for sid, n in other.messages.items():
            self.messages[sid] = self.messages.get(sid, 0) + n
        self.malformed += other.malformed
        self.unmirrored += other.unmirrored


class _Line(msgspec.Struct):
    number: int
    offset: int
    data: bytes  # without the newline
    digest: bytes
    event: ClaudeCodeLine
    message: Message | None


_decode_any = msgspec.json.Decoder().decode
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _parse(data: bytes) -> tuple[dict[str, Any], bool] | str:
    """The line's object and whether msgspec reads the line itself, or why the line is
    malformed."""
    if not data.strip(_JSON_WS):
        return "blank line"
    if over(data, LINE_MAX_DEPTH):  # (before any decoder recurses into it)
        return (
            f"nests {depth_of(data)} levels of arrays and objects deep; a line is kept"
            f" up to {LINE_MAX_DEPTH} (eventstore.integrations.claude_code.LINE_MAX_DEPTH)"
        )
    try:
        doc, exact = _decode_any(data), True
    except msgspec.DecodeError as exc:
        doc, exact = _as_node_reads_it(data), False
        if doc is None:
            return f"not JSON: {exc}"
    if not isinstance(doc, dict):
        return f"not a JSON object (a {type(doc).__name__})"
    return doc, exact


def _finite(text: str) -> float | None:
    value = float(text)
    return None if value in (float("inf"), float("-inf")) else value


def _integer(text: str) -> int | float | None:
    """An integer as Node reads it: one past Python's digit limit (`int()` refuses it) is
    past a double's range too, so null (Node's Infinity, written back as null)."""
    try:
        return int(text)
    except ValueError:
        return _finite(text)


def _not_json(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _as_node_reads_it(data: bytes) -> Any:
    """A line msgspec refused, read by Python's `json` if it is valid JSON (None if
    not): a lone surrogate escape becomes U+FFFD, a number past a double's range null
    (an integer past Python's digit limit too), as Node reads and writes them back;
    whatever else is read as msgspec would."""
    try:
        doc = json.loads(
            data.decode("utf-8"), parse_float=_finite, parse_int=_integer, parse_constant=_not_json
        )
    except ValueError:  # (UnicodeDecodeError and JSONDecodeError among them)
        return None
    text = _LONE_SURROGATE.sub("\ufffd", json.dumps(doc, ensure_ascii=False))
    try:
        return _decode_any(text.encode())
    except msgspec.DecodeError:  # pragma: no cover - valid JSON both ways once cleaned
        return None


def _kept(data: bytes, exact: bool) -> ClaudeCodeLine:
    body = data.strip(_JSON_WS)
    start = data.index(body[:1])
    lead, trail = data[:start], data[start + len(body) :]
    line = body if exact else msgspec.json.encode(body.decode())
    return ClaudeCodeLine(line=msgspec.Raw(line), lead=lead.decode(), trail=trail.decode())


class _SessionCounts:
    """What this importer knows of one session: the copies of each line it holds, as of
    sequence `seq` (refreshed whenever another writer moved the session on)."""

    __slots__ = ("counts", "seq")

    def __init__(self) -> None:
        self.seq = -1
        self.counts: Counter[bytes] = Counter()

    def refresh(self, store: SessionStore, sid: str) -> None:
        seq = store.last_seq(sid)
        if seq != self.seq:
            self.counts = store.load(sid, ClaudeCodeProjection.name).counts
            self.seq = seq  # if the load saw more, the append's expected_seq catches it


class TranscriptFollower:
    """Imports one Claude Code file incrementally: each `poll` imports the complete lines
    appended since the last one (a partially written last line waits for its newline).

    The file's byte offset, line count and per-line occurrence counts are kept between
    polls. A file replaced meanwhile is read again from its start (nothing is
    duplicated: the store's counts decide what is new): one that shrank, or whose bytes
    before the offset are no longer those read (checked where the last poll stopped,
    and over the whole prefix, by its digest, when that or the file's inode differs).
    """

    def __init__(
        self,
        store: SessionStore,
        path: str | os.PathLike[str],
        *,
        session_of: SessionNamer | None = None,
    ) -> None:
        _check_store(store)
        self.store = store
        self.path = Path(path)
        self._session_of = session_of
        self.offset = 0  # of the first byte not yet consumed
        self.line = 0  # complete lines consumed
        self._seen: dict[str, Counter[bytes]] = {}  # session -> copies of each line in the file
        self._sessions: dict[str, _SessionCounts] = {}
        self._default_session = self.path.name.removesuffix(".jsonl")
        self._ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the file last read
        self._prefix = hashlib.blake2b(digest_size=16)  # of the `offset` bytes consumed
        self._last = b""  # the last bytes consumed (up to _LAST_BYTES)

    def _restart(self) -> None:
        self.offset, self.line, self._seen = 0, 0, {}
        self._prefix, self._last = hashlib.blake2b(digest_size=16), b""

    def _replaced(self, fd: int, st: os.stat_result) -> bool:
        """Whether the bytes before `offset` are no longer those consumed."""
        if st.st_size < self.offset:
            return True
        n = len(self._last)
        if (st.st_dev, st.st_ino) == self._ident and (
            os.pread(fd, n, self.offset - n) == self._last
        ):
            return False  # the same file, the same bytes where the last poll stopped
        digest, pos = hashlib.blake2b(digest_size=16), 0
        while pos < self.offset:  # another file or other bytes: the whole prefix decides
            piece = os.pread(fd, min(1 << 20, self.offset - pos), pos)
            if not piece:
                return True
            digest.update(piece)
            pos += len(piece)
        return digest.digest() != self._prefix.digest()

    def poll(self, *, final: bool = False) -> ImportReport:
        """Import what was appended since the last poll. `final`: the file is complete,
        so a last line without a newline is read too (reported if it is not JSON)."""
        report = ImportReport(str(self.path))
        with open(self.path, "rb") as f:
            st = os.fstat(f.fileno())
            if self.offset and self._replaced(f.fileno(), st):
                self._restart()  # replaced or truncated: start again
            self._ident = (st.st_dev, st.st_ino)
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        chunks = data[:end].split(b"\n")[:-1] if end else []
        tail = data[end:]
        if final and tail:
            chunks.append(tail)
            end = len(data)
        by_session: dict[str, list[_Line]] = {}
        offset = self.offset
        for raw in chunks:
            self.line += 1
            parsed = _parse(raw)
            if isinstance(parsed, str):
                if final and raw is tail and tail:
                    parsed = f"incomplete last line (no newline): {parsed}"
                self._malformed(report, MalformedLine(str(self.path), self.line, offset, parsed))
            else:
                self._take(report, by_session, raw, parsed, offset)
            offset += len(raw) + 1
        report.lines = len(chunks)
        for sid, lines in by_session.items():
            self._append(report, sid, lines)
        self.offset += end
        self._prefix.update(data[:end])
        self._last = (self._last + data[:end])[-_LAST_BYTES:]
        return report

    def _malformed(self, report: ImportReport, problem: MalformedLine) -> None:
        report.malformed.append(problem)  # (the caller says so: the CLI on stderr)

    def _take(
        self,
        report: ImportReport,
        by_session: dict[str, list[_Line]],
        raw: bytes,
        parsed: tuple[dict[str, Any], bool],
        offset: int,
    ) -> None:
        doc, exact = parsed
        sid = doc.get("sessionId", self._default_session)
        try:
            sid = validate_session_id(sid)
            if self._session_of is not None:
                sid = validate_session_id(self._session_of(self.path, sid))
        except EventStoreError as exc:
            problem = MalformedLine(str(self.path), self.line, offset, f"bad sessionId: {exc}")
            self._malformed(report, problem)
            return
        message = to_message(doc)
        if message is not None:
            try:
                message = validated_copy(message, Message, "message", max_depth=_MESSAGE_MAX_DEPTH)
            except InvalidRecordError as exc:
                report.unmirrored.append(
                    MalformedLine(str(self.path), self.line, offset, f"kept, not mirrored: {exc}")
                )
                message = None
        line = _Line(self.line, offset, raw, _digest(raw), _kept(raw, exact), message)
        by_session.setdefault(sid, []).append(line)
        report.appended.setdefault(sid, 0)
        report.messages.setdefault(sid, 0)

    def _append(self, report: ImportReport, sid: str, lines: list[_Line]) -> None:
        seen = self._seen.setdefault(sid, Counter())
        known = self._sessions.setdefault(sid, _SessionCounts())
        for start in range(0, len(lines), BATCH_LINES):
            chunk = lines[start : start + BATCH_LINES]
            for _attempt in range(1000):
                known.refresh(self.store, sid)
                fresh = _new_lines(chunk, seen, known.counts)
                if not fresh:
                    break
                events: list[Event] = [ln.event for ln in fresh]
                messages = [ln.message for ln in fresh if ln.message is not None]
                if messages:
                    events.append(MessagesAppended(messages=messages))
                try:
                    result = self.store.append(sid, events, expected_seq=known.seq)
                except ConcurrencyError:
                    continue  # another writer moved the session: recount and retry
                known.seq = result.last_seq
                for ln in fresh:
                    known.counts[ln.digest] += 1
                report.appended[sid] += len(fresh)
                report.messages[sid] += len(messages)
                break
            else:  # pragma: no cover - a thousand lost races in a row
                raise ConcurrencyError(sid, known.seq, self.store.last_seq(sid))
            for ln in chunk:
                seen[ln.digest] += 1
            report.already += len(chunk) - len(fresh)


def _new_lines(chunk: list[_Line], seen: Counter[bytes], held: Counter[bytes]) -> list[_Line]:
    """The lines of `chunk` the session does not hold yet: the k-th copy of a line (this
    file's earlier chunks included) is new if the session holds fewer than k copies."""
    local: Counter[bytes] = Counter()
    fresh = []
    for ln in chunk:
        local[ln.digest] += 1
        if seen[ln.digest] + local[ln.digest] > held[ln.digest]:
            fresh.append(ln)
    return fresh


def import_transcript(
    store: SessionStore, path: str | os.PathLike[str], *, session_of: SessionNamer | None = None
) -> ImportReport:
    """Import one Claude Code JSONL file (the whole of it, once); see the module doc.
    `session_of(path, sessionId)` names the session a line goes to (default: its
    `sessionId`)."""
    return TranscriptFollower(store, path, session_of=session_of).poll(final=True)


def transcript_files(path: str | os.PathLike[str]) -> list[Path]:
    """`path` itself if it is a file, else every `*.jsonl` under it, sorted."""
    p = Path(path)
    if p.is_dir():
        return sorted(q for q in p.rglob("*.jsonl") if q.is_file())
    return [p]


def follow_transcripts(
    store: SessionStore,
    paths: Iterable[str | os.PathLike[str]],
    *,
    poll_interval: float = 0.5,
    stop: threading.Event | None = None,
    idle_timeout: float | None = None,
    on_poll: Callable[[ImportReport], None] | None = None,
    session_of: SessionNamer | None = None,
) -> dict[str, ImportReport]:
    """Keep importing Claude Code files as they grow, every `poll_interval` seconds,
    until `stop` is set or no file has grown for `idle_timeout` seconds.

    `paths` are files or directories; a directory is searched again at every poll, so a
    session Claude Code starts meanwhile is picked up; a file not there yet is waited
    for. A line is imported once complete (ends with a newline). Returns what was
    imported per file; `on_poll` sees every poll's report that read a line;
    `session_of` names sessions as for `import_transcript`.
    """
    poll_interval = poll_interval_of(poll_interval)
    stop = stop or threading.Event()
    roots = list(paths)
    followers: dict[Path, TranscriptFollower] = {}
    totals: dict[str, ImportReport] = {}
    last_growth = time.monotonic()
    while True:
        grew = False
        for root in roots:
            for path in transcript_files(root):
                follower = followers.get(path)
                if follower is None:
                    follower = followers[path] = TranscriptFollower(
                        store, path, session_of=session_of
                    )
                before = follower.offset
                try:
                    report = follower.poll()
                except FileNotFoundError:
                    continue  # not written yet (or gone): look again next time
                total = totals.setdefault(str(path), ImportReport(str(path)))
                total.merge(report)
                if follower.offset != before:
                    grew = True
                    if on_poll is not None:
                        on_poll(report)
        now = time.monotonic()
        if grew:
            last_growth = now
        elif idle_timeout is not None and now - last_growth >= idle_timeout:
            return totals
        if stop.wait(poll_interval):
            return totals


def export_transcript(store: SessionStore, session_id: str) -> Iterator[bytes]:
    """The session's Claude Code lines as imported, each with its newline."""
    _check_store(store)
    state: KeptLines = store.load(session_id, ClaudeCodeProjection.name)
    for line in state.lines:
        yield line + b"\n"
