"""The official LangGraph checkpointer conformance suite (langgraph-checkpoint-conformance),
base and extended capabilities, against EventStoreSaver: every capability must be
detected and every test pass."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from eventstore import SessionStore
from eventstore.integrations import langgraph as lg
from eventstore.integrations.langgraph import EventStoreSaver


@pytest.mark.parametrize("how", ["path", "shared-store", "memory-url"])
def test_conformance_suite_passes_in_full(how: str, capsys: pytest.CaptureFixture[str]) -> None:
    roots: list[Path] = []

    @checkpointer_test(name=f"EventStoreSaver-{how}")
    async def saver() -> AsyncIterator[EventStoreSaver]:
        if how == "memory-url":
            async with EventStoreSaver("memory://") as s:
                yield s
            return
        root = Path(tempfile.mkdtemp(prefix="eventstore-conformance-"))
        roots.append(root)
        if how == "shared-store":
            store = SessionStore(root, event_types=lg.EVENT_TYPES, projections=lg.PROJECTIONS)
            async with EventStoreSaver(store) as s:
                yield s
            store.close()
        else:
            async with EventStoreSaver(root) as s:
                yield s

    report = asyncio.run(validate(saver, progress=ProgressCallbacks.verbose()))
    report.print_report()
    out = capsys.readouterr().out
    failures = {k: r.failures for k, r in report.results.items() if r.failures}
    assert failures == {}, out
    assert {k for k, r in report.results.items() if r.detected} == {
        c.value for c in ALL_CAPABILITIES
    }
    assert report.conformance_level() == "FULL"
    assert all(r.tests_passed > 0 for r in report.results.values())
    assert sum(r.tests_passed for r in report.results.values()) == 81  # all of 0.0.2 (README)
    # every session the suite left behind is a clean log
    for root in roots:
        store = SessionStore(root, event_types=lg.EVENT_TYPES, projections=lg.PROJECTIONS)
        for sid in store.list_sessions():
            assert store.verify(sid).ok, sid
