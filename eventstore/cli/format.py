"""How the `eventstore` command shows things: terminal width, tables, times, sizes, plurals,
one-line event summaries, the bootstrap state, and JSON on stdout.

Pure text building (plus the two JSON writers); no store access. Tables fit the terminal:
on a TTY its width, else `COLUMNS`, else 120 columns; one column per table gives way.
"""

from __future__ import annotations

import os
import sys
import unicodedata
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from eventstore.format.events import (
    Event,
    UnknownEvent,
    event_tag,
)
from eventstore.ops.export import (
    event_summary,
    plural,
)
from eventstore.records import (
    BootstrapState,
    InitCommand,
)

__all__ = [
    "display_width",
    "emit_json",
    "emit_json_line",
    "event_line",
    "event_type",
    "fmt_bytes",
    "fmt_time",
    "kv",
    "one_line",
    "plural",
    "render_state",
    "shorten",
    "table",
    "terminal_width",
]

DEFAULT_WIDTH = 120
MIN_FLEX = 12  # a shortened column never gets narrower than this


def terminal_width() -> int:
    """Columns to fit: `COLUMNS` if set, else the terminal's width on a TTY, else 120."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        if sys.stdout.isatty():
            return os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError, AttributeError):
        pass
    return DEFAULT_WIDTH


def display_width(text: str) -> int:
    """Columns `text` takes on a terminal (East Asian wide characters take two)."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def shorten(text: str, width: int, full: bool = False) -> str:
    """One line of at most `width` columns, cut with an ellipsis (as is with `full`)."""
    if full:
        return text
    text = " ".join(text.split())
    if display_width(text) <= width:
        return text
    out: list[str] = []
    used = 0
    for ch in text:
        w = display_width(ch)
        if used + w > max(0, width - 1):
            break
        out.append(ch)
        used += w
    return "".join(out) + "…"


def fmt_time(ts: datetime | None) -> str:
    """A readable UTC time: `2026-11-29 15:40:00Z`."""
    if ts is None:
        return "-"
    return ts.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def fmt_bytes(n: int) -> str:
    """`1.2 MB`-style sizes (powers of 1000, like `ls --si`)."""
    if n < 1000:
        return f"{n} B"
    size = float(n)
    for unit in ("kB", "MB", "GB"):
        size /= 1000
        if size < 1000 or unit == "GB":
            break
    return f"{size:.1f} {unit}"


def one_line(exc: BaseException | str) -> str:
    """An error message on one line (never empty)."""
    text = " ".join(str(exc).split())
    return text or (type(exc).__name__ if isinstance(exc, BaseException) else "error")


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    right: Iterable[int] = (),
    flex: int | None = None,
    width: int | None = None,
    full: bool = False,
) -> str:
    """An aligned plain-text table; the last column is never padded.

    `flex`: the column that gives way so each line fits `width` columns (the terminal's
    by default); its cells are shortened with an ellipsis, never below a few columns.
    `full` keeps every cell whole (and lets lines run long).
    """
    cells = [[" ".join(str(c).split()) if not full else str(c) for c in r] for r in rows]
    ncols = len(headers)
    widths = [display_width(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], display_width(c))
    if flex is not None and not full:
        avail = (terminal_width() if width is None else width) - 1
        others = sum(w for i, w in enumerate(widths) if i != flex) + 2 * (ncols - 1)
        room = max(MIN_FLEX, display_width(headers[flex]), avail - others)
        if widths[flex] > room:
            for r in cells:
                r[flex] = shorten(r[flex], room)
            widths[flex] = room
    rset = set(right)

    def line(row: Sequence[str]) -> str:
        out = []
        for i, c in enumerate(row):
            pad = " " * (widths[i] - display_width(c))
            if i in rset:
                out.append(pad + c)
            else:
                out.append(c if i == ncols - 1 else c + pad)
        return "  ".join(out).rstrip()

    return "\n".join([line(list(headers)), *(line(r) for r in cells)])


def kv(pairs: Iterable[tuple[str, object]]) -> str:
    """Aligned `key  value` lines."""
    items = list(pairs)
    w = max((len(k) for k, _ in items), default=0)
    return "\n".join(f"{k.ljust(w)}  {v}" for k, v in items)


def emit_json(obj: Any) -> None:
    """Pretty JSON of builtins or msgspec Structs (datetimes as ISO 8601) on stdout."""
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(obj), indent=2).decode() + "\n")


def emit_json_line(obj: Any) -> None:
    """One JSON object on its own line, flushed (for `log --json` and `follow --json`)."""
    sys.stdout.write(msgspec.json.encode(obj).decode() + "\n")
    sys.stdout.flush()


# -- events ----------------------------------------------------------------------------


def event_type(ev: Event) -> str:
    """The event's `type` tag (an unknown event's own type name)."""
    if type(ev) is UnknownEvent:
        return ev.type_name
    return event_tag(type(ev))


def event_line(ev: Event) -> list[str]:
    """SEQ, TIME, TYPE, SUMMARY of one event (a row of `log`, a line of `follow`): the
    library's summary, with how to make an unknown type known."""
    summary = event_summary(ev)
    if type(ev) is UnknownEvent:
        summary = f"(unknown type {ev.type_name!r}; load it with --event-types)"
    return [str(ev.seq), fmt_time(ev.ts), event_type(ev), summary]


# -- the bootstrap state ---------------------------------------------------------------


def render_state(session_id: str, state: BootstrapState, full: bool, where: str) -> str:
    """The bootstrap state as readable sections, fitted to the terminal."""
    width = terminal_width()
    out: list[str] = []
    m = state.manifest
    if m is None:
        out.append(f"session {session_id} ({where}): no manifest yet")
    else:
        indent = 18  # the width of the key column below
        steps: list[str] = []
        for i, step in enumerate(m.init_plan.steps if m.init_plan else [], 1):
            if isinstance(step, InitCommand):
                kind, text = "command", " ".join([step.program, *step.args])
            else:
                kind, text = step.shell.value, step.script
            label = f"{i}. {kind:<7}  "
            steps.append(label + shorten(text, width - indent - len(label) - 1, full))
        meta = ", ".join(f"{k}={v}" for k, v in m.metadata.items()) or "-"
        out.append(
            kv(
                [
                    ("session", f"{session_id} ({where})"),
                    ("objective", shorten(m.current_objective, width - indent - 1, full)),
                    ("branch", m.active_branch),
                    ("last good commit", m.last_known_good_commit or "-"),
                    ("harness", f"{m.harness_version} (schema {m.schema_version})"),
                    ("metadata", shorten(meta, width - indent - 1, full)),
                    ("init plan", ("\n" + " " * indent).join(steps) or "-"),
                ]
            )
        )
    fl = state.feature_list
    passing = sum(1 for f in fl if f.passes)
    out.append(f"\nfeatures: {passing}/{len(fl)} passing")
    if fl:
        out.append(
            table(
                ["ID", "CATEGORY", "PASSES", "DESCRIPTION"],
                [[f.id, f.category, "yes" if f.passes else "no", f.description] for f in fl],
                flex=3,
                full=full,
            )
        )
    out.append(f"\nprogress: {plural(len(state.recent_progress), 'entry', 'entries')}")
    if state.recent_progress:
        out.append(
            table(
                ["TIME", "RUN", "SUMMARY"],
                [[fmt_time(p.created_at), p.run_id, p.summary] for p in state.recent_progress],
                flex=2,
                full=full,
            )
        )
    out.append(f"\ncheckpoints: {len(state.checkpoints)}")
    if state.checkpoints:
        out.append(
            table(
                ["RUN", "STATUS", "STARTED", "COMPLETED", "NOTE"],
                [
                    [
                        c.run_id,
                        c.status.value,
                        fmt_time(c.started_at),
                        fmt_time(c.completed_at),
                        c.note or "-",
                    ]
                    for c in state.checkpoints
                ],
                flex=4,
                full=full,
            )
        )
    return "\n".join(out)
