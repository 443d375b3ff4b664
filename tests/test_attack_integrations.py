"""An outside attack on the integrations: the LangGraph checkpointer, the OpenAI Agents
SDK session, the Claude Code importer and the harness session map, each held to its own
README promises and to its framework's contract.

The tests that fail on the code they were written against name the promise they hold it
to; the rest are the strongest attacks that found nothing, kept as coverage. A framework
that is not installed skips only its own tests.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from eventstore import (
    EventStoreError,
    HarnessSessionMap,
    InvalidRecordError,
)
from eventstore.integrations import claude_code

# -- helpers -----------------------------------------------------------------------------


def _agents() -> Any:
    pytest.importorskip("agents")
    from eventstore.integrations import openai_agents

    return openai_agents


def _langgraph() -> Any:
    pytest.importorskip("langgraph.checkpoint.base")
    from eventstore.integrations import langgraph

    return langgraph


def _checkpoint(saver: Any, cid: str, values: dict[str, Any]) -> Any:
    from langgraph.checkpoint.base import empty_checkpoint

    c = empty_checkpoint()
    c["id"] = cid
    c["channel_values"] = dict(values)
    c["channel_versions"] = {ch: saver.get_next_version(None, None) for ch in values}
    return c


# -- OpenAI Agents SDK session -------------------------------------------------------------


# SQLiteSession (the SDK's reference) stores json.dumps(item): NaN and infinities read
# back as themselves, and bytes, datetimes and sets are refused with TypeError
ODD_ITEMS = {
    "nan": {"role": "user", "content": "x", "score": float("nan")},
    "inf": {"role": "user", "content": "x", "score": float("inf")},
    "bytes": {"role": "user", "content": b"raw bytes"},
    "datetime": {"role": "user", "content": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)},
    "set": {"role": "user", "content": {"a"}},
}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("kind", sorted(ODD_ITEMS))
def test_agents_an_item_is_read_back_equal_or_refused(tmp_path: Path, kind: str) -> None:
    """README: EventStoreSession "answers the same" as SQLiteSession, and input that is
    not JSON is refused with InvalidRecordError and nothing written. An item is either
    read back equal or refused; never silently stored as another value."""
    oa = _agents()
    item = ODD_ITEMS[kind]

    async def main() -> list[Any] | None:
        s = oa.EventStoreSession("odd", tmp_path)
        try:
            try:
                await s.add_items([item])
            except InvalidRecordError:
                assert await s.get_items() == []  # refused: nothing written
                return None
            return list(await s.get_items())
        finally:
            await s.close()

    got = asyncio.run(main())
    if got is not None:
        assert len(got) == 1
        assert _same(got[0], item), f"stored {item!r}, read back {got[0]!r}"


def test_agents_items_at_a_naive_time_is_a_typed_error(tmp_path: Path) -> None:
    """Guarantees: every error is an EventStoreError; `SessionStore.state_at(at=naive)`
    raises InvalidArgumentError. `items_at(at=naive)` must refuse the same way."""
    oa = _agents()

    async def main() -> None:
        s = oa.EventStoreSession("t", tmp_path)
        try:
            await s.add_items([{"role": "user", "content": "hi"}])
            with pytest.raises(EventStoreError):
                await s.items_at(at=dt.datetime(2026, 1, 1))  # no tzinfo
        finally:
            await s.close()

    asyncio.run(main())


# -- harness session map -------------------------------------------------------------------


@pytest.mark.parametrize("field", ["session_id", "harness", "driver"])
def test_map_a_lone_surrogate_is_a_typed_refusal_or_kept(tmp_path: Path, field: str) -> None:
    """Guarantees: every error is an EventStoreError, also for a lone surrogate in any
    string; the map is never fatal. A put with one either stores and reads back, or is
    refused with a typed error and leaves the earlier binding."""
    m = HarnessSessionMap(tmp_path / "root", workdir=tmp_path)
    m.put("ctx", "before", "h", "d")
    args = {"session_id": "after", "harness": "h", "driver": "d", field: "bad\ud800"}
    try:
        m.put("ctx", args["session_id"], args["harness"], args["driver"])
    except Exception as exc:
        assert isinstance(exc, EventStoreError), f"untyped {type(exc).__name__}: {exc}"
        assert m.get("ctx") == "before"
    else:
        assert m.get("ctx") == args["session_id"]


def test_map_an_acknowledged_put_is_never_read_as_absent(tmp_path: Path) -> None:
    """README: a put writes the file and "the newest write wins"; a put that returns
    without an error must be what `get` answers (or it must be refused). A session id
    of 1 MiB is written to disk, then read back as absent (and the old binding is gone)."""
    m = HarnessSessionMap(tmp_path / "root", workdir=tmp_path)
    m.put("ctx", "old", "h", "d")
    big = "s" * (1 << 20)
    try:
        m.put("ctx", big, "h", "d")
    except EventStoreError:
        assert m.get("ctx") == "old"
    else:
        got = m.get("ctx")
        assert got == big, f"put acknowledged, get returned {got if got is None else len(got)}"
        assert HarnessSessionMap(tmp_path / "root").get("ctx") == big


# -- Claude Code importer ------------------------------------------------------------------


def _cc_lines(sid: str) -> list[bytes]:
    return [
        (
            f'{{"type":"user","sessionId":"{sid}","uuid":"u1","parentUuid":null,'
            '"timestamp":"2026-03-01T09:00:00.000Z","message":{"role":"user","content":"hi"}}'
        ).encode(),
        (
            f'{{"type":"assistant","sessionId":"{sid}","uuid":"u2","parentUuid":"u1",'
            '"timestamp":"2026-03-01T09:00:02.000Z",'
            '"message":{"role":"assistant","content":"hello"}}'
        ).encode(),
    ]


def _import_prefix_then_whole(tmp_path: Path, full: bytes, cut: int, sid: str) -> Any:
    path = tmp_path / f"{sid}.jsonl"
    store = claude_code.open_store(tmp_path / f"store-{cut}")
    path.write_bytes(full[:cut])  # Claude Code is still writing the file
    claude_code.import_transcript(store, path)
    path.write_bytes(full)  # the whole file, imported again
    claude_code.import_transcript(store, path)
    return store


def test_claude_code_a_crlf_file_imported_mid_write_keeps_each_line_once(
    tmp_path: Path,
) -> None:
    """README: "Re-import appends nothing"; the k-th copy of a line is new only if the
    session holds fewer than k. A CRLF file imported while its last line lacks only its
    `\\r\\n`, then imported whole, must hold each line once."""
    sid = "c0ffee00-0000-4000-8000-000000000001"
    full = b"".join(line + b"\r\n" for line in _cc_lines(sid))
    with _import_prefix_then_whole(tmp_path, full, len(full) - 2, sid) as store:
        exported = list(claude_code.export_transcript(store, sid))
        # the line read before its `\r\n` may be kept without its `\r`, but only once
        assert [x.rstrip(b"\r\n") for x in exported] == _cc_lines(sid), "a line was kept twice"
        assert len(store.load_transcript_messages(sid)) == 2


def test_claude_code_an_lf_file_truncated_at_every_byte_then_whole_is_imported_once(
    tmp_path: Path,
) -> None:
    """Coverage: for every cut of an LF file, importing the cut file and then the whole
    one gives exactly what one import of the whole file gives."""
    sid = "c0ffee00-0000-4000-8000-000000000002"
    full = b"".join(line + b"\n" for line in _cc_lines(sid))
    for cut in range(len(full) + 1):
        with _import_prefix_then_whole(tmp_path, full, cut, sid) as store:
            assert b"".join(claude_code.export_transcript(store, sid)) == full, cut
            assert len(store.load_transcript_messages(sid)) == 2, cut
            assert store.verify(sid).ok


# -- LangGraph checkpointer ----------------------------------------------------------------


def test_langgraph_odd_channel_values_round_trip_as_in_memory_saver(tmp_path: Path) -> None:
    """Coverage: values LangGraph's serde handles (bytes, NaN, sets, tuples, datetimes,
    nested) read back as InMemorySaver gives them, in the checkpoint, its metadata and
    its pending writes, from a new saver too."""
    lg = _langgraph()
    from langgraph.checkpoint.memory import InMemorySaver

    values = {
        "b": b"\x00\xff" * 1000,
        "nan": float("nan"),
        "nested": {"a": [1, {"t": (1, 2)}], "s": {1, 2}},
        "when": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    }
    cfg: Any = {"configurable": {"thread_id": "odd\u00e9/..", "checkpoint_ns": ""}}
    answers = []
    for saver in (InMemorySaver(), lg.EventStoreSaver(tmp_path)):
        c = _checkpoint(saver, "1ef00000-0000-6000-8000-000000000001", values)
        written = saver.put(cfg, c, {"step": 1, "odd": values}, c["channel_versions"])
        saver.put_writes(written, [("b", b"\x01"), ("nan", float("nan"))], "task-1")
        if isinstance(saver, lg.EventStoreSaver):
            saver.close()
            saver = lg.EventStoreSaver(tmp_path)
        tup = saver.get_tuple(cfg)
        answers.append((tup.checkpoint["channel_values"], tup.metadata["odd"], tup.pending_writes))
        if isinstance(saver, lg.EventStoreSaver):
            saver.close()
    mem, ours = answers
    assert _same(ours[0], mem[0]) and _same(ours[1], mem[1])
    assert len(ours[2]) == 2 and ours[2][0] == mem[2][0] and math.isnan(ours[2][1][2])


def _lg_writer(root: str, worker: int, fd: int) -> None:
    from eventstore.integrations.langgraph import EventStoreSaver

    saver = EventStoreSaver(root)
    cfg: Any = {"configurable": {"thread_id": "shared", "checkpoint_ns": ""}}
    for i in range(100_000):
        cid = f"1ef{i:08d}-{worker}"
        c = _checkpoint(saver, cid, {"v": "x" * 50_000, "w": worker})
        cfg = saver.put(cfg, c, {"step": i, "worker": worker}, c["channel_versions"])
        os.write(fd, f"{cid}\n".encode())  # acknowledged


def test_langgraph_writers_killed_mid_put_on_one_thread_lose_nothing(tmp_path: Path) -> None:
    """Coverage: two processes put checkpoints (50 kB values) into one thread id and are
    SIGKILLed at once; every acknowledged checkpoint is listed, with its parent, and the
    thread verifies and takes further puts."""
    lg = _langgraph()
    ctx = multiprocessing.get_context("fork")
    r, w = os.pipe()
    procs = [ctx.Process(target=_lg_writer, args=(str(tmp_path), k, w)) for k in range(2)]
    for p in procs:
        p.start()
    os.close(w)
    acked: list[str] = []
    buf = b""
    deadline = time.monotonic() + 20
    while len(acked) < 40 and time.monotonic() < deadline:
        buf += os.read(r, 4096)
        *done, buf = buf.split(b"\n")
        acked += [d.decode() for d in done]
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
    for p in procs:
        p.join(10)
        assert p.exitcode == -signal.SIGKILL
    while chunk := os.read(r, 4096):
        buf += chunk
    os.close(r)
    acked += [d.decode() for d in buf.split(b"\n")[:-1]]
    assert len(acked) >= 40
    cfg: Any = {"configurable": {"thread_id": "shared", "checkpoint_ns": ""}}
    with lg.EventStoreSaver(tmp_path) as saver:
        listed = {t.checkpoint["id"]: t for t in saver.list(cfg)}
        assert set(acked) <= set(listed)
        for cid, t in listed.items():
            step = int(cid[3:11])
            parent = t.parent_config
            assert (parent is None) == (step == 0)
            if parent is not None:
                assert parent["configurable"]["checkpoint_id"] == f"1ef{step - 1:08d}{cid[11:]}"
        c = _checkpoint(saver, "1ef99999999-9", {"v": "after"})
        saver.put(cfg, c, {"step": 0}, c["channel_versions"])
        assert saver.get_tuple(cfg).checkpoint["channel_values"] == {"v": "after"}
        assert saver.store.verify(saver.session_id("shared")).ok


def test_langgraph_a_thread_deleted_and_rewritten_elsewhere_reads_fresh(tmp_path: Path) -> None:
    """Coverage: saver A holds a thread's head; saver B (its own store, as another
    process) deletes the thread and writes a new one; A and a new saver read only the
    new thread, and it verifies."""
    lg = _langgraph()
    cfg: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    a, b = lg.EventStoreSaver(tmp_path), lg.EventStoreSaver(tmp_path)
    try:
        conf = cfg
        for i in range(5):
            c = _checkpoint(a, f"1ef{i:05d}", {"x": i})
            conf = a.put(conf, c, {"step": i}, c["channel_versions"])
        a.put_writes(conf, [("x", "pending")], "task")
        assert a.get_tuple(cfg).checkpoint["id"] == "1ef00004"
        b.delete_thread("t")
        assert a.get_tuple(cfg) is None and list(a.list(cfg)) == []
        c = _checkpoint(b, "1ef00001", {"x": "new"})
        b.put(cfg, c, {"step": 0}, c["channel_versions"])
        for saver in (a, b, lg.EventStoreSaver(tmp_path)):
            tup = saver.get_tuple(cfg)
            assert tup.checkpoint["channel_values"] == {"x": "new"}
            assert tup.pending_writes == []
            assert [t.checkpoint["id"] for t in saver.list(cfg)] == ["1ef00001"]
        assert a.store.verify(a.session_id("t")).ok
    finally:
        a.close()
        b.close()
