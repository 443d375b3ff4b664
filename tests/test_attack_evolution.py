"""An outside attack on schema evolution, custom events and projections, and the async
API (README "Schema evolution", "Custom events and projections", "Async API").

What it attacks: upcasters that build a new dict, forge the envelope, raise or return
garbage; fold caches and snapshots shared by stores opened with other upcasters; a user
projection whose `apply` changes the events it is given (what the built-in projections
and later loads then return); projection names, versions and states msgspec cannot
encode; async calls cancelled mid-append, raising StopIteration, and a store closed from
one event loop while another loop's calls run. Each finding test fails on the code
before its fix; the coverage tests say what held.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eventstore import (
    CorruptLogError,
    Event,
    SessionStore,
)

SID = "s"


# -- schema evolution --------------------------------------------------------------------


class TaskV1(Event, tag="task", kw_only=True):
    """The old shape: a title."""

    title: str


class TaskV2(Event, tag="task", kw_only=True):
    """The new shape: `title` renamed to `name`, and a priority added."""

    VERSION = 2
    name: str
    prio: int = 0


def _old_log(root: Path) -> None:
    """Two v1 lines, the second under an idempotency key."""
    with SessionStore(root, event_types=[TaskV1]) as s:
        s.append(SID, [TaskV1(title="a")])
        s.append(SID, [TaskV1(title="b")], idempotency_key="k")


def test_an_upcaster_that_builds_a_new_payload_dict_keeps_the_lines_envelope(
    tmp_path: Path,
) -> None:
    """Promise: an upcaster "turns the old payload (a dict) into the next version".
    Broken: one that returned a new dict of payload fields (the natural way to write
    one) dropped the line's seq, key and hash with it, so every old line read as
    seq 0 and the load raised CorruptLogError ("the log starts at sequence 0"); one
    that set `key` changed which batch an idempotency key names. The envelope is the
    line's (checked by the hash chain) and is put back after upcasting."""
    _old_log(tmp_path)

    def new_dict(d: dict[str, Any]) -> dict[str, Any]:
        return {"name": d["title"], "prio": 1}

    def forge(d: dict[str, Any]) -> dict[str, Any]:
        d["name"] = d.pop("title")
        d["key"], d["seq"] = None, 7
        return d

    for fn in (new_dict, forge):
        with SessionStore(tmp_path, event_types=[TaskV2], upcasters=[(TaskV2, 1, fn)]) as s:
            events = list(s.read_events(SID))
            assert [(e.seq, e.key, e.name) for e in events] == [(1, None, "a"), (2, "k", "b")]  # type: ignore[attr-defined]
            assert s.verify(SID).ok


@pytest.mark.parametrize(
    "fn, why",
    [
        (lambda d: d["missing"], "KeyError"),
        (lambda d: None, "returned a NoneType"),
        (lambda d: [d], "returned a list"),
    ],
)
def test_an_upcaster_that_fails_is_a_corrupt_log_error_naming_the_line(
    tmp_path: Path, fn: Any, why: str
) -> None:
    """Promise: every error is an EventStoreError; a line that cannot be read raises
    CorruptLogError naming file, offset and seq; verify never raises on what it reads.
    Broken: an upcaster raising (KeyError) or returning something other than a dict
    escaped from loads, read_events and verify as a bare KeyError/TypeError/
    AttributeError naming no line."""
    _old_log(tmp_path)
    with SessionStore(tmp_path, event_types=[TaskV2], upcasters=[(TaskV2, 1, fn)]) as s:
        with pytest.raises(CorruptLogError) as info:
            list(s.read_events(SID))
        assert info.value.seq == 1 and info.value.offset == 0 and why in str(info.value)
        assert isinstance(info.value.path, (str, Path)) and "log.jsonl" in str(info.value.path)
        report = s.verify(SID)
        assert not report.ok
        assert {p.kind for p in report.problems if p.severity == "error"} == {"undecodable"}
