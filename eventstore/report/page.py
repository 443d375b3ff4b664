"""The session report: one self-contained HTML page that shows one session.

Owns the page `eventstore report` writes. `build_report(store, session_id)` reads the
session through the public API only (the bootstrap projection folded over `read_events`,
`load_bootstrap_state`, `load_transcript_messages`, `verify`, `audit.stats`), shapes it as
one JSON document (`ReportData`) and embeds it in a page whose inline script draws the
header, the features-passing chart, the runs timeline, the transcript browser and the
event table. The page loads nothing: a Content-Security-Policy allows only its own two
scripts (by hash) and its own stylesheet, so neither a mistake here nor hostile text in a
session can make it fetch or run anything. Data reaches the DOM only as text nodes.

The page stays small for long sessions: message text and event summaries share a budget
(`ReportLimits`) cut evenly from the longest items first; if the page would still pass
`max_bytes`, the budgets are halved until it fits. The transcript and the event table
are paged by the script, so a 10,000-turn session renders the first page at once.
"""

from __future__ import annotations

import base64
import hashlib
import html
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import msgspec

from eventstore import __version__
from eventstore.errors import CorruptLogError
from eventstore.format.events import (
    Event,
    FeatureListReplaced,
    FeaturePassUpdated,
    MessagesAppended,
    Snapshot,
)
from eventstore.ops import audit
from eventstore.records import (
    BootstrapState,
    FeatureRecord,
    Message,
)
from eventstore.store import SessionStore
from projections import fold

__all__ = [
    "MAX_BYTES",
    "ReportData",
    "ReportLimits",
    "build_report",
    "embed_json",
    "fit_cap",
    "render_page",
    "report_data",
]

MAX_BYTES = 10_000_000
"""The largest page `build_report` writes by default (bytes of UTF-8)."""


class ReportLimits(msgspec.Struct, frozen=True):
    """How much text a page embeds. `content_chars`: all message text together (each
    message keeps at least an equal share); `summary_chars`: one event summary;
    `text_chars`: any other one text a harness wrote (a progress note, a checkpoint's
    note, a feature's fields, a manifest's, a block's label); `rows`: the most recent
    events, messages and chart points kept; `problems`: verify findings listed."""

    content_chars: int = 5_000_000
    summary_chars: int = 160
    text_chars: int = 20_000
    rows: int = 200_000
    problems: int = 100

    def halved(self) -> ReportLimits:
        """Smaller limits for a page that came out too large."""
        return msgspec.structs.replace(
            self,
            content_chars=self.content_chars // 2,
            summary_chars=max(16, self.summary_chars // 2),
            text_chars=max(16, self.text_chars // 2),
            rows=max(1, self.rows // 2),
        )


# -- the embedded document -------------------------------------------------------------


class ChartPoint(msgspec.Struct, array_like=True):
    """Features passing after the event `seq` (one per event that touched features)."""

    seq: int
    ts: str
    passing: int
    total: int


class Flip(msgspec.Struct, array_like=True):
    """A feature's pass flag changing value at event `seq`."""

    seq: int
    ts: str
    feature_id: str
    passes: bool


class FeatureRow(msgspec.Struct):
    """A feature of the current list and the event that last flipped it (if any)."""

    id: str
    category: str
    description: str
    passes: bool
    flipped_at: int | None


class ProgressRow(msgspec.Struct, array_like=True):
    """A progress note: when, what."""

    at: str
    summary: str


class RunRow(msgspec.Struct):
    """One run: its latest checkpoint (status, end, note) and its progress notes."""

    run_id: str
    status: str
    started_at: str | None
    completed_at: str | None
    note: str | None
    checkpoints: int
    progress: list[ProgressRow]


class MessageRow(msgspec.Struct, omit_defaults=True):
    """One transcript message. `length`: characters of the original content when the
    page holds less; `extras`: (label, text) for every other non-empty field of the
    message, and one per block of a field that holds typed blocks (tool calls, tool
    results, thinking...)."""

    index: int
    role: str
    content: str
    seq: int | None = None
    ts: str | None = None
    length: int | None = None
    extras: list[tuple[str, str]] = msgspec.field(default_factory=list)


class EventRow(msgspec.Struct, array_like=True):
    """One line of the event table."""

    seq: int
    ts: str
    type: str
    summary: str


class ProblemRow(msgspec.Struct):
    """One verify finding."""

    severity: str
    kind: str
    seq: int | None
    file: str
    offset: int
    message: str


class VerifyRow(msgspec.Struct):
    """What verify said about the session: its findings, errors first (`problems` may
    list fewer than `problems_total`)."""

    ok: bool
    head_hash: str
    head_seq: int
    events: int
    problems: list[ProblemRow]
    problems_total: int
    errors: int


class Sizes(msgspec.Struct):
    """Counts and bytes of the session's history (from `audit.stats`)."""

    events: int
    first_seq: int
    last_seq: int
    first_ts: str | None
    last_ts: str | None
    log_bytes: int
    log_events: int
    archive_files: int
    archive_bytes: int
    snapshots: int
    compacted_without_archive: int
    messages: int
    features: int


class Omitted(msgspec.Struct):
    """What the page leaves out to stay under its size limit."""

    events: int = 0
    messages: int = 0
    chart_points: int = 0
    messages_cut: int = 0
    content_cap: int | None = None


class ReportData(msgspec.Struct):
    """Everything the page shows, as embedded in it (element `#report-data`).
    `unreadable`: why the session's events could not be read (the page then shows what
    verify found, and empty sections). `origin`: for a forked session, the line "forked
    from SRC at seq N (hash H)" its first snapshot gives (shown under the title)."""

    session_id: str
    generated_at: str
    generator: str
    manifest: dict[str, Any] | None
    verify: VerifyRow
    sizes: Sizes
    features: list[FeatureRow]
    chart: list[ChartPoint]
    flips: list[Flip]
    runs: list[RunRow]
    messages: list[MessageRow]
    events: list[EventRow]
    event_types: dict[str, int]
    omitted: Omitted
    unreadable: str | None = None
    origin: str | None = None


# -- gathering -------------------------------------------------------------------------


def _iso(ts: datetime | None) -> str | None:
    if ts is None:
        return None
    return ts.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _tag(ev: Event) -> str:
    name = getattr(ev, "type_name", None)  # an unknown event keeps its own type
    return str(name) if name else str(type(ev).__struct_config__.tag)


def fit_cap(lengths: Sequence[int], budget: int) -> int | None:
    """The largest cap `c` with `sum(min(n, c) for n in lengths) <= budget`, or None when
    everything fits uncut: a budget shared evenly, cut from the longest items first."""
    if sum(lengths) <= budget:
        return None
    remaining = max(0, budget)
    ordered = sorted(lengths)
    for i, n in enumerate(ordered):
        left = len(ordered) - i
        if n * left > remaining:
            return remaining // left
        remaining -= n
    return ordered[-1]  # not reached: the sum exceeds the budget


def _cut(text: str, cap: int | None) -> str:
    return text if cap is None or len(text) <= cap else text[:cap]


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _shorten_all(value: Any, width: int) -> Any:
    """`value` (JSON builtins) with every string in it shortened to `width`."""
    if isinstance(value, str):
        return _shorten(value, width)
    if isinstance(value, dict):
        return {_shorten(k, width): _shorten_all(v, width) for k, v in value.items()}
    if isinstance(value, list):
        return [_shorten_all(v, width) for v in value]
    return value


class _Timeline:
    """The features-passing chart and the event table, from one pass over the events."""

    def __init__(self, store: SessionStore, summary_chars: int) -> None:
        self.projection = store.projections["bootstrap"]
        self.state: BootstrapState = self.projection.initial()
        self.summary_chars = summary_chars
        self.chart: list[ChartPoint] = []
        self.flips: list[Flip] = []
        self.last_flip: dict[str, int] = {}
        self.events: list[EventRow] = []
        self.types: dict[str, int] = {}
        self.message_events: list[tuple[int, str]] = []  # (seq, ts) per message
        self.origin: str | None = None  # a fork's first snapshot names where it came from

    def run(self, events: Iterable[Event]) -> None:
        for ev in events:
            tag = _tag(ev)
            ts = _iso(ev.ts) or ""
            self.types[tag] = self.types.get(tag, 0) + 1
            summary = _shorten(audit.event_summary(ev), self.summary_chars)
            self.events.append(EventRow(ev.seq, ts, tag, summary))
            if type(ev) is Snapshot and ev.origin is not None and self.origin is None:
                o = ev.origin
                self.origin = f"forked from {o.session_id} at seq {o.seq} (hash {o.h})"
            if isinstance(ev, MessagesAppended):
                self.message_events.extend([(ev.seq, ts)] * len(ev.messages))
            elif isinstance(ev, FeaturePassUpdated | FeatureListReplaced | Snapshot):
                # a flip: an update that changes a listed feature's flag
                flipped = isinstance(ev, FeaturePassUpdated) and (
                    self._passes().get(ev.feature_id, ev.passes) != ev.passes
                )
                self.state = fold(self.projection, self.state, (ev,))
                if isinstance(ev, FeaturePassUpdated) and flipped:
                    self.flips.append(Flip(ev.seq, ts, ev.feature_id, ev.passes))
                    self.last_flip[ev.feature_id] = ev.seq
                features = self.state.feature_list
                passing = sum(1 for f in features if f.passes)
                self.chart.append(ChartPoint(ev.seq, ts, passing, len(features)))

    def _passes(self) -> dict[str, bool]:
        return {f.id: f.passes for f in self.state.feature_list}


def _runs(state: BootstrapState, width: int) -> list[RunRow]:
    runs: dict[str, RunRow] = {}
    for cp in state.checkpoints:
        row = runs.get(cp.run_id)
        status = getattr(cp.status, "value", str(cp.status))
        note = None if cp.note is None else _shorten(cp.note, width)
        if row is None:
            runs[cp.run_id] = RunRow(
                run_id=_shorten(cp.run_id, width),
                status=status,
                started_at=_iso(cp.started_at),
                completed_at=_iso(cp.completed_at),
                note=note,
                checkpoints=1,
                progress=[],
            )
        else:  # the latest checkpoint says where the run stands; the first when it began
            row.status = status
            row.completed_at = _iso(cp.completed_at) or row.completed_at
            row.note = note if note is not None else row.note
            row.checkpoints += 1
    for entry in state.recent_progress:
        row = runs.get(entry.run_id)
        if row is None:  # notes of a run that recorded no checkpoint
            row = runs[entry.run_id] = RunRow(
                run_id=_shorten(entry.run_id, width),
                status="no checkpoint",
                started_at=None,
                completed_at=None,
                note=None,
                checkpoints=0,
                progress=[],
            )
        row.progress.append(
            ProgressRow(_iso(entry.created_at) or "", _shorten(entry.summary, width))
        )
    return list(runs.values())


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return msgspec.json.format(msgspec.json.encode(value), indent=2).decode("utf-8")


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


_Extras = list[tuple[str, str]]
_Fields = tuple[str, str, _Extras, str | None]
_IDS = ("id", "tool_use_id", "signature")  # pairing keys: shown in the JSON, not the label


def _message_fields(message: Message) -> _Fields:
    """role, content, the other non-empty fields as (label, text), the message's own time.

    Generic over the fields a message has: whatever is not role, content or its time is
    an extra; a field holding a list of objects tagged by "type" (content blocks) gives
    one extra per block, labelled by its type and name."""
    fields = msgspec.to_builtins(message)
    if not isinstance(fields, dict):  # not a Struct as expected: show what it is
        return "unknown", _as_text(fields), [], None
    role = str(fields.pop("role", "unknown"))
    content = _as_text(fields.pop("content", ""))
    ts: str | None = None
    for name in ("time", "created_at"):  # the message's own time, shown as its time
        value = getattr(message, name, None)
        if isinstance(value, datetime):
            ts = _iso(value)
            fields.pop(name, None)
            break
    extras: _Extras = []
    for key, value in fields.items():
        if _empty(value):
            continue
        if isinstance(value, list) and all(
            isinstance(b, dict) and isinstance(b.get("type"), str) for b in value
        ):
            extras.extend(x for b in value if (x := _block(b, content)) is not None)
        else:
            extras.append((key, _as_text(value)))
    return role, content, extras, ts


def _block(block: dict[str, Any], content: str) -> tuple[str, str] | None:
    """One content block as (label, text); None for a text block the content repeats."""
    rest = {k: v for k, v in block.items() if k != "type"}
    label = str(block["type"])
    if isinstance(rest.get("name"), str):
        label += ": " + rest.pop("name")
    if rest.get("is_error") is True:
        label += " (error)"
        rest.pop("is_error")
    body = [v for k, v in rest.items() if k not in _IDS]
    if len(body) == 1 and isinstance(body[0], str):  # one text (and ids): shown as itself
        return None if label == "text" and body[0] in content else (label, body[0])
    return label, _as_text(rest)


def _messages(
    transcript: Sequence[_Fields], seqs: Sequence[tuple[int, str]], limits: ReportLimits
) -> tuple[list[MessageRow], Omitted]:
    # the transcript is the truth (retention may have trimmed its head; a snapshot may
    # stand in for lost history), so message events are matched from the end
    first = max(0, len(transcript) - limits.rows)
    parts = transcript[first:]
    offset = len(transcript) - len(seqs)
    cap = fit_cap(
        [len(c) + sum(len(v) for _, v in x) for _, c, x, _ in parts], limits.content_chars
    )
    rows: list[MessageRow] = []
    cut = 0
    for k, (role, content, extras, own_ts) in enumerate(parts):
        i = first + k
        seq, ts = seqs[i - offset] if i - offset >= 0 else (None, None)
        shown = _cut(content, cap)
        shown_extras = [(_shorten(label, limits.text_chars), _cut(v, cap)) for label, v in extras]
        whole = shown == content and shown_extras == extras
        cut += not whole
        rows.append(
            MessageRow(
                index=i + 1,
                role=role,
                content=shown,
                seq=seq,
                ts=own_ts or ts,
                length=None if whole else len(content),
                extras=shown_extras,
            )
        )
    return rows, Omitted(messages=first, messages_cut=cut, content_cap=cap)


class _Gathered(msgspec.Struct, frozen=True):
    """What one read of a session gives; shaped into pages of any size."""

    session_id: str
    verify: audit.VerifyReport
    sizes: Sizes
    state: BootstrapState
    messages: list[_Fields]
    timeline: _Timeline
    unreadable: str | None = None


def _gather(store: SessionStore, session_id: str, summary_chars: int) -> _Gathered:
    report = store.verify(session_id)  # first: it names an unknown session, reads any log
    try:
        stats = audit.stats(store.core, session_id)
        state = store.load_bootstrap_state(session_id)
        messages = [_message_fields(m) for m in store.load_transcript_messages(session_id)]
        timeline = _Timeline(store, summary_chars)
        # from the first event held: after pruning, reading from seq 1 is refused
        timeline.run(store.read_events(session_id, from_seq=stats.first_seq or 1))
    except CorruptLogError as exc:
        # the log does not read (a bad line; or an edited one, where reads check hashes):
        # the page still shows what verify found, which is what its reader needs
        sizes = Sizes(
            events=report.events,
            first_seq=1 if report.head_seq else 0,
            last_seq=report.head_seq,
            first_ts=None,
            last_ts=None,
            log_bytes=0,
            log_events=0,
            archive_files=0,
            archive_bytes=0,
            snapshots=0,
            compacted_without_archive=0,
            messages=0,
            features=0,
        )
        empty = _Timeline(store, summary_chars)
        text = " ".join(str(exc).split())
        return _Gathered(session_id, report, sizes, BootstrapState(), [], empty, text)
    sizes = Sizes(
        events=stats.events,
        first_seq=stats.first_seq,
        last_seq=stats.last_seq,
        first_ts=_iso(stats.first_ts),
        last_ts=_iso(stats.last_ts),
        log_bytes=stats.log_bytes,
        log_events=stats.log_events,
        archive_files=stats.archive_files,
        archive_bytes=stats.archive_bytes,
        snapshots=stats.snapshots,
        compacted_without_archive=stats.compacted_without_archive,
        messages=len(messages),
        features=len(state.feature_list),
    )
    return _Gathered(session_id, report, sizes, state, messages, timeline)


def _shape(g: _Gathered, limits: ReportLimits, generated_at: datetime) -> ReportData:
    timeline, report, state = g.timeline, g.verify, g.state
    messages, omitted = _messages(g.messages, timeline.message_events, limits)
    omitted.events = max(0, len(timeline.events) - limits.rows)
    omitted.chart_points = max(0, len(timeline.chart) - limits.rows)
    events = timeline.events[-limits.rows :]
    if limits.summary_chars < timeline.summary_chars:
        events = [
            EventRow(e.seq, e.ts, e.type, _shorten(e.summary, limits.summary_chars)) for e in events
        ]
    return ReportData(
        session_id=g.session_id,
        generated_at=_iso(generated_at) or "",
        generator=f"eventstore {__version__}",
        manifest=_shorten_all(msgspec.to_builtins(state.manifest), limits.text_chars)
        if state.manifest
        else None,
        verify=VerifyRow(
            ok=report.ok,
            head_hash=report.head_hash,
            head_seq=report.head_seq,
            events=report.events,
            problems=[  # errors first: they are what a reader must see
                ProblemRow(p.severity, p.kind, p.seq, p.file, p.offset, p.message)
                for p in sorted(report.problems, key=lambda p: p.severity != "error")[
                    : limits.problems
                ]
            ],
            problems_total=len(report.problems),
            errors=sum(p.severity == "error" for p in report.problems),
        ),
        sizes=g.sizes,
        features=[
            _feature(f, timeline.last_flip.get(f.id), limits.text_chars) for f in state.feature_list
        ],
        chart=timeline.chart[-limits.rows :],
        flips=timeline.flips[-limits.rows :],
        runs=_runs(state, limits.text_chars),
        messages=messages,
        events=events,
        event_types=dict(sorted(timeline.types.items())),
        omitted=omitted,
        unreadable=g.unreadable,
        origin=timeline.origin,
    )


def report_data(
    store: SessionStore,
    session_id: str,
    *,
    limits: ReportLimits | None = None,
    generated_at: datetime | None = None,
) -> ReportData:
    """Everything the page about `session_id` shows. UnknownSessionError for a session
    with no log and no archive. A log whose events do not read gives a page of what
    verify found (`unreadable` says why the rest is empty)."""
    limits = limits or ReportLimits()
    gathered = _gather(store, session_id, limits.summary_chars)
    return _shape(gathered, limits, generated_at or datetime.now(UTC))


def _feature(f: FeatureRecord, flipped_at: int | None, width: int) -> FeatureRow:
    return FeatureRow(
        _shorten(f.id, width),
        _shorten(f.category, width),
        _shorten(f.description, width),
        f.passes,
        flipped_at,
    )


# -- the page --------------------------------------------------------------------------


def embed_json(data: Any) -> str:
    """`data` as JSON that is safe as the text of a `<script type="application/json">`
    element: every `<` is written `\\u003c`, so no `</script` or `<!--` can appear."""
    return msgspec.json.encode(data).decode("utf-8").replace("<", "\\u003c")


def _csp_hash(text: str) -> str:
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def render_page(data: ReportData) -> str:
    """The HTML page for `data` (see the module docstring)."""
    csp = "; ".join(
        [
            "default-src 'none'",
            f"script-src {_csp_hash(_PROBE_JS)} {_csp_hash(_APP_JS)}",
            f"style-src {_csp_hash(_CSS)}",
            "img-src 'none'",
            "base-uri 'none'",
            "form-action 'none'",
        ]
    )
    title = html.escape(f"Session {data.session_id} · eventstore report")
    sid = html.escape(data.session_id)
    origin = "" if data.origin is None else f'<p id="origin">{html.escape(data.origin)}</p>'
    return (
        "<!doctype html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n'
        f'<meta name="generator" content="{html.escape(data.generator)}">\n'
        f"<title>{title}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        '<pre id="js-errors" role="alert" hidden></pre>\n'
        f"<script>{_PROBE_JS}</script>\n"
        '<a class="skip" href="#transcript">Skip to the transcript</a>\n'
        f'<header class="page"><h1>Session report: <span class="sid">{sid}</span></h1>'
        f"{origin}"
        '<p class="muted" id="generated"></p></header>\n'
        '<main id="app"><noscript><p>This page is drawn by its inline script: enable'
        " JavaScript to see the report. The data is in the element #report-data (JSON)."
        "</p></noscript></main>\n"
        f'<script type="application/json" id="report-data">{embed_json(data)}</script>\n'
        f"<script>{_APP_JS}</script>\n</body>\n</html>\n"
    )


def build_report(
    store: SessionStore,
    session_id: str,
    *,
    max_bytes: int = MAX_BYTES,
    limits: ReportLimits | None = None,
    generated_at: datetime | None = None,
) -> str:
    """The report page of `session_id` as one HTML string of at most `max_bytes` (UTF-8).

    Text budgets (`limits`) are halved until the page fits; ValueError if even the
    smallest page (a few bytes of text per item) does not fit `max_bytes`.
    UnknownSessionError for an unknown session.
    """
    limits = limits or ReportLimits()
    generated_at = generated_at or datetime.now(UTC)
    gathered = _gather(store, session_id, limits.summary_chars)  # read once, cut as needed
    while True:
        page = render_page(_shape(gathered, limits, generated_at))
        size = len(page.encode("utf-8"))
        if size <= max_bytes:
            return page
        smaller = limits.halved()
        if smaller == limits:
            raise ValueError(
                f"the report of session {session_id!r} needs {size} bytes even cut down;"
                f" the limit is {max_bytes}"
            )
        limits = smaller


def _asset(name: str) -> str:
    return (resources.files("eventstore.report") / "assets" / name).read_text(encoding="utf-8")


# read once: the page's stylesheet and scripts, hashed into its Content-Security-Policy
_CSS = _asset("report.css")
_PROBE_JS = _asset("probe.js")
_APP_JS = _asset("report.js")
